"""The `kb` command (kb_env/cli.py): bad input is one `kb: error:` line and exit status 2, never
a traceback; `kb list` and `kb eval` print what a user reads and what a script parses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import requires_cpu_mode
import torch

from kb_env.cli import main
from kb_env.evaluate.result import EvalResult
from kb_env.problem import all_problems, get_problem

REPO = Path(__file__).resolve().parents[1]
SOLUTION = get_problem("softmax").solution_paths[0]
MODEL_SRC = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kb: error:")
    assert "Traceback" not in out + err
    for needle in needles:
        assert needle in lines[0]


# ----- kb list ------------------------------------------------------------------------------------
def test_list_prints_each_problem_and_env_id(capsys):
    code, out, _ = run_main(capsys, "list")
    assert code == 0
    for name, spec in all_problems().items():
        line = next((ln for ln in out.splitlines() if ln.split()[:1] == [name]), None)
        assert line is not None, f"{name} missing from:\n{out}"
        assert f"KernelBench/{name}-v0" in line
        assert spec.description.strip().splitlines()[0][:30] in line
        assert line.split()[2] == str(spec.level) and spec.baseline.value in line.split()
        assert (spec.regime_label or "-") in line.split()


def test_list_json_parses(capsys):
    code, out, _ = run_main(capsys, "list", "--json")
    assert code == 0
    data = json.loads(out)
    assert set(data) == set(all_problems())
    soft = data["softmax"]
    assert soft["interface"] == "forward" and soft["level"] == 1 and soft["regime"] == "memory-bound"
    assert soft["baseline"] == "eager" and soft["gpu_only"] is False
    assert soft["cpu_shapes"] == [dict(s) for s in get_problem("softmax").shapes.cpu]
    assert SOLUTION.name in soft["solutions"]


# ----- kb eval: bad input -----------------------------------------------------------------------
@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    binary = tmp_path / "kernel.so"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe\x80\x81" * 20)
    prose = tmp_path / "notes.txt"
    prose.write_text("Dear reviewer,\nthis kernel is very fast, trust me.\n")
    no_model = tmp_path / "no_model.py"
    no_model.write_text("import torch\n\nclass Fast(torch.nn.Module):\n    pass\n")
    good = tmp_path / "good.py"
    good.write_text(MODEL_SRC)
    return {"binary": binary, "prose": prose, "no_model": no_model, "good": good, "dir": tmp_path}


def test_eval_missing_file(capsys, tmp_path):
    missing = tmp_path / "nope.py"
    assert_one_line_error(*run_main(capsys, "eval", "softmax", str(missing), "--device", "cpu"),
                          str(missing), "no such file")


def test_eval_directory(capsys, files):
    assert_one_line_error(*run_main(capsys, "eval", "softmax", str(files["dir"]), "--device", "cpu"),
                          "not a file")


def test_eval_binary_file(capsys, files):
    assert_one_line_error(*run_main(capsys, "eval", "softmax", str(files["binary"]), "--device", "cpu"),
                          str(files["binary"]))


def test_eval_non_python_text(capsys, files):
    assert_one_line_error(*run_main(capsys, "eval", "softmax", str(files["prose"]), "--device", "cpu"),
                          str(files["prose"]), "SyntaxError", "line")


def test_eval_file_without_model(capsys, files):
    assert_one_line_error(*run_main(capsys, "eval", "softmax", str(files["no_model"]), "--device", "cpu"),
                          "ModelNew")


def test_eval_unknown_problem(capsys, files):
    assert_one_line_error(*run_main(capsys, "eval", "nope", str(files["good"]), "--device", "cpu"),
                          "nope", "softmax")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine's refusal")
def test_eval_cuda_without_a_gpu(capsys, files):
    assert_one_line_error(*run_main(capsys, "eval", "softmax", str(files["good"]), "--device", "cuda"),
                          "cuda")


@pytest.mark.parametrize("timeout", ["-1", "0"])
def test_eval_nonpositive_timeout(capsys, files, timeout):
    assert_one_line_error(*run_main(capsys, "eval", "softmax", str(files["good"]), "--device", "cpu",
                                    "--timeout", timeout), "--timeout")


@pytest.mark.parametrize("argv", [["eval", "softmax"], ["eval", "softmax", "x.py", "--device", "tpu"],
                                  ["frobnicate"], []], ids=["no-file", "bad-device", "bad-verb", "nothing"])
def test_usage_errors_exit_2_without_traceback(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert "usage: kb" in err


def test_eval_accepts_a_utf8_bom(capsys, tmp_path):
    bom = tmp_path / "bom.py"
    bom.write_bytes(b"\xef\xbb\xbf" + MODEL_SRC.encode())
    # with a bad --timeout, a source that passes the static checks reaches the timeout check
    code, out, err = run_main(capsys, "eval", "softmax", str(bom), "--device", "cpu", "--timeout", "-1")
    assert "--timeout" in err


# ----- kb eval: a real CPU-mode evaluation ----------------------------------------------------------
def _kb(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KB_PROBLEMS_DIR"}
    return subprocess.run([sys.executable, "-m", "kb_env.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@requires_cpu_mode
def test_eval_known_good_solution_report():
    rel = SOLUTION.relative_to(REPO) if SOLUTION.is_relative_to(REPO) else SOLUTION
    proc = _kb("eval", "softmax", str(rel), "--device", "cpu", "--seed", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    headline = proc.stdout.splitlines()[0]
    assert "CORRECT" in headline and "FLAGGED" not in headline
    reward_lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("reward")]
    assert len(reward_lines) == 1
    assert "1.000" in reward_lines[0]  # CPU mode: a correct answer earns exactly 1.0


@requires_cpu_mode
def test_eval_json_output_parses_into_eval_result():
    proc = _kb("eval", "softmax", str(SOLUTION), "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    result = EvalResult.model_validate_json(proc.stdout)  # stdout is only the JSON
    assert result.problem == "softmax" and result.mode == "cpu"
    assert result.correct and result.compiled and result.error is None and result.flags == []
    assert result.timing_meaningful is False
    assert result.checks and all(c.ok for c in result.checks)


@requires_cpu_mode
def test_audit_names_the_broken_rule_and_exits_1(capsys):
    torch_softmax = REPO / "tests" / "candidates" / "torch_softmax.py"
    code, out, _ = run_main(capsys, "audit", str(torch_softmax), "--problem", "softmax", "--device", "cpu")
    assert code == 1
    verdict = {line.split()[1]: line.split()[0] for line in out.splitlines()[1:-1] if line.strip()}
    assert verdict["torch"] == "FAIL" and verdict["runs"] == "pass" and verdict["kernels"] == "skip"
    assert "forbidden_op:aten::_softmax" in out and out.rstrip().endswith("verdict: FLAGGED")


@requires_cpu_mode
def test_audit_of_the_known_good_solution_is_clean_as_json(capsys):
    code, out, _ = run_main(capsys, "audit", str(SOLUTION), "--problem", "softmax", "--device", "cpu", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["flags"] == [] and report["correct"]
    assert {v["check"]: v["status"] for v in report["verdicts"]}["outputs"] == "pass"


def test_audit_needs_a_problem(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["audit", str(SOLUTION)])
    assert exc.value.code == 2
    assert "--problem" in capsys.readouterr().err


def test_eval_of_a_gpu_only_problem_in_cpu_mode_is_one_line(capsys, tmp_path, monkeypatch):
    import shutil

    import yaml

    from kb_env.problem import get_problem

    root = tmp_path / "problems"
    shutil.copytree(get_problem("softmax").folder, root / "softmax_gpu")
    data = yaml.safe_load((root / "softmax_gpu" / "problem.yaml").read_text())
    data["shapes"].pop("cpu")
    data["name"] = "softmax_gpu"
    (root / "softmax_gpu" / "problem.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("KB_PROBLEMS_DIR", str(root))
    code, out, err = run_main(capsys, "eval", "softmax_gpu", str(SOLUTION), "--device", "cpu")
    assert code == 2 and "GPU-only" in err and "Traceback" not in err
