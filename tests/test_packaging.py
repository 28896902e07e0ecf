"""The built wheel carries everything a pip-installed user needs (problems with their references
and known-good solutions, the GPU table, rewards, the worker), and an installed copy finds its
own problems rather than the source tree's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBLEMS = sorted(p.name for p in (REPO / "problems").iterdir() if (p / "problem.yaml").is_file())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheels = list(out.glob("kb_env-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def names(wheel) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())


def test_problems_exist_in_the_source_tree():
    assert {"softmax", "rmsnorm", "gemm_bias_gelu"} <= set(PROBLEMS)


@pytest.mark.parametrize("problem", PROBLEMS)
def test_wheel_carries_each_problem(names, problem):
    base = f"kb_env/problems/{problem}"
    assert f"{base}/problem.yaml" in names
    assert f"{base}/reference.py" in names
    src_solutions = sorted(p.name for p in (REPO / "problems" / problem / "solutions").glob("*.py"))
    for s in src_solutions:  # every known-good solution the source tree has (not every problem has one)
        assert f"{base}/solutions/{s}" in names
    if (REPO / "problems" / problem / "baseline.py").is_file():
        assert f"{base}/baseline.py" in names


@pytest.mark.parametrize("path", ["kb_env/data/gpus.yaml", "rewards/__init__.py", "kb_env/sandbox/worker.py",
                                  "kb_env/sandbox/protocol.py", "kb_env/evaluate/evaluator.py", "kb_env/cli.py"])
def test_wheel_carries_package_files(names, path):
    assert path in names


def test_wheel_declares_the_kb_command(wheel):
    with zipfile.ZipFile(wheel) as z:
        eps = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
        text = z.read(eps).decode()
    assert "[console_scripts]" in text
    assert "kb = kb_env.cli:main" in text


def test_installed_copy_finds_its_own_problems(wheel, tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                           "--target", str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    script = (
        "import json, kb_env, rewards\n"
        "from kb_env.problem import problems_root\n"
        "from kb_env.hardware import lookup\n"
        "probs = kb_env.all_problems()\n"
        "print(json.dumps({'kb_env': kb_env.__file__, 'rewards': rewards.__file__,\n"
        "  'root': str(problems_root().resolve()),\n"
        "  'problems': {n: str(s.folder) for n, s in probs.items()},\n"
        "  'solutions': {n: [str(p) for p in s.solution_paths] for n, s in probs.items()},\n"
        "  'h100': lookup('NVIDIA H100 80GB HBM3').key}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("KB_PROBLEMS_DIR", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    proc = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout.strip().splitlines()[-1])

    site_r = site.resolve()
    assert Path(info["kb_env"]).resolve().is_relative_to(site_r), info["kb_env"]
    assert Path(info["rewards"]).resolve().is_relative_to(site_r), info["rewards"]
    assert Path(info["root"]).is_relative_to(site_r), info["root"]
    assert {"softmax", "rmsnorm", "gemm_bias_gelu"} <= set(info["problems"])
    assert set(info["problems"]) == set(PROBLEMS)
    for name, folder in info["problems"].items():
        assert Path(folder).resolve().is_relative_to(site_r), (name, folder)
        installed = sorted(Path(p).name for p in info["solutions"][name])
        source = sorted(p.name for p in (REPO / "problems" / name / "solutions").glob("*.py"))
        assert installed == source, f"installed {name} lost solutions"
    assert info["h100"] == "h100-sxm"  # the GPU table is readable from the installed package

    proc = subprocess.run([sys.executable, "-m", "kb_env.cli", "list"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for name in PROBLEMS:
        assert f"KernelBench/{name}-v0" in proc.stdout
