"""Importing a directory of KernelBench-format files (kb_env.kernelbench, `kb import`).

tests/kernelbench_fixture/ holds KernelBench-style files with small shapes: a square matmul, a
softmax, an elementwise op with init inputs and parameters, a matmul too big to run here, a
degenerate mean(softmax), one that imports transformers, one with a syntax error, one that raises
at import, one that kills its process at import, one without get_inputs, and a helper module.
They are imported once (module fixture, into a cache of its own); the tests assert the registry
ids, each skip's reason, the FLOPs and bytes against hand counts, the rules derived from the
reference, an end-to-end CPU-mode evaluation through gym.make, the `kb import` verb, and re-imports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gymnasium as gym
import pytest
from conftest import candidate, requires_cpu_mode, requires_cuda

import kb_env  # noqa: F401  (registers the environments)
from kb_env.cli import main
from kb_env.kernelbench import register_kernelbench
from kb_env.kernelbench.tolerance import TABLE, UNCHECKED_RMS
from kb_env.policies.prompts import first_prompt
from kb_env.problem import all_problems, get_problem, refresh_problems

FIXTURE = Path(__file__).parent / "kernelbench_fixture"
MATMUL, SOFTMAX, AFFINE, BIG = ("level1-1_Square_matrix_multiplication_", "level1-23_Softmax",
                                "level2-3_Affine_LeakyReLU", "level1-60_Big_matmul")
SKIPPED = {  # file -> words its reason must hold
    "level1/helpers.py": ["not named like a KernelBench problem"],
    "level1/40_Mean_of_Softmax.py": ["output 0 barely depends on the input", "seed"],
    "level1/50_Syntax_error.py": ["syntax error at line 6"],
    "level1/51_Raises_at_import.py": ["importing it raised KeyError", "(line 5)"],
    "level1/52_No_get_inputs.py": ["no get_inputs() at module level"],
    "level1/53_Exits_at_import.py": ["killed the probe process", "exited with status 3"],
    "level4/1_gpt2_hub.py": ["needs the network", "imports transformers"],
}


def _forget(env_ids) -> None:
    refresh_problems()
    for env_id in env_ids:
        gym.registry.pop(env_id, None)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """The fixture directory imported into a fresh cache (the registry reads it while the module runs)."""
    cache = tmp_path_factory.mktemp("kb_import_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KB_IMPORT_DIR", str(cache))
        refresh_problems()
        report = register_kernelbench(FIXTURE, device="cpu")
        yield report, cache
    _forget(r.env_id for r in report.registered)


@pytest.fixture
def registered(imported):
    return {r.name: r for r in imported[0].registered}


def test_registers_the_good_files_under_kernelbench_ids(imported):
    report, cache = imported
    ids = [r.env_id for r in report.registered]
    assert ids == [f"KernelBench/{n}-v0" for n in (MATMUL, SOFTMAX, BIG, AFFINE)]  # by level, then number
    for r in report.registered:
        assert r.env_id in gym.registry
        spec = get_problem(r.name)
        assert spec.env_id() == r.env_id and spec.folder == (cache / r.name).resolve()
        assert spec.reference_source() == (FIXTURE / r.file).read_text()  # the file, verbatim
    assert {MATMUL, SOFTMAX, AFFINE, BIG} <= set(all_problems())
    assert get_problem(AFFINE).level == 2 and get_problem(SOFTMAX).level == 1


def test_every_other_file_is_skipped_with_its_reason(imported):
    report, cache = imported
    reasons = {s.file: s.reason for s in report.skipped}
    assert set(reasons) == set(SKIPPED)
    for file, words in SKIPPED.items():
        for word in words:
            assert word in reasons[file], f"{file}: {reasons[file]!r} lacks {word!r}"
    assert not any((cache / f"level1-{Path(f).stem}").exists() for f in SKIPPED)


def test_flops_and_bytes_match_hand_counts(registered):
    f32 = 4
    n = 48  # C = A @ B, square: 2 N^3 FLOPs; A, B, C moved once
    assert get_problem(MATMUL).flops_of({}) == 2 * n**3 == registered[MATMUL].flops
    assert get_problem(MATMUL).bytes_of({}) == 3 * n * n * f32 == registered[MATMUL].bytes
    rows, cols = 16, 384  # softmax: the FLOP counter counts products only, so 0; x and out moved once
    assert get_problem(SOFTMAX).flops_of({}) == 0
    assert get_problem(SOFTMAX).bytes_of({}) == 2 * rows * cols * f32
    batch, feat = 32, 200  # x, out, and the weight and bias parameters
    assert get_problem(AFFINE).flops_of({}) == 0
    assert get_problem(AFFINE).bytes_of({}) == (2 * batch * feat + 2 * feat) * f32
    m, k, nn = 16384, 8192, 16384  # traced on fake tensors: 2 GiB that were never allocated
    assert get_problem(BIG).flops_of({}) == 2 * m * k * nn
    assert get_problem(BIG).bytes_of({}) == (m * k + k * nn + m * nn) * f32


def test_rules_follow_from_the_reference(imported, registered):
    _, cache = imported
    mm, soft, aff, big = (get_problem(n) for n in (MATMUL, SOFTMAX, AFFINE, BIG))
    assert {"aten::mm", "aten::bmm", "aten::matmul", "aten::addmm"} <= set(mm.forbidden.torch_ops)  # the family
    assert {"aten::_softmax", "aten::_log_softmax"} <= set(soft.forbidden.torch_ops)
    assert {"aten::mul", "aten::add", "aten::leaky_relu"} <= set(aff.forbidden.torch_ops)
    assert all("ctypes" in s.forbidden.imports for s in (mm, soft, aff, big))
    assert all(s.compute_dtype == "float32" and s.seeds == [0, 1, 2] for s in (mm, soft, aff, big))
    assert (mm.regime, soft.regime, big.regime) == ("memory-bound", "memory-bound", "compute-bound")
    # tolerance from the output dtype: the table's float32 row, atol scaled by the output's RMS
    atol_frac, rtol, bar = TABLE["float32"]
    rms = json.loads((cache / SOFTMAX / "import.json").read_text())["facts"]["checked"]["rms"]["float32"]
    tol = soft.tolerance["float32"]
    assert (tol.rtol, tol.max_rel_l2) == (rtol, bar) and tol.atol == pytest.approx(atol_frac * rms, rel=1e-2)
    assert big.tolerance["float32"].atol == pytest.approx(atol_frac * UNCHECKED_RMS)
    # the deck's hardening: stress cases where the reference stays fair, CPU mode where it is small
    assert [s.model_dump(exclude_defaults=True) for s in soft.stress] == [{"scale": 8.0}, {"scale": 0.125},
                                                                            {"heavy_tail": 3}]
    assert mm.shapes.gpu == [{}] and mm.shapes.cpu == [{}] and not mm.gpu_only
    assert big.gpu_only and big.stress == [] and registered[BIG].checked_on is None
    assert "over the CPU check budget" in registered[BIG].unchecked and not registered[BIG].cpu_mode


def test_problem_yaml_says_where_its_numbers_come_from(imported):
    _, cache = imported
    text = (cache / BIG / "problem.yaml").read_text()
    assert "level1/60_Big_matmul.py" in text and "FLOP counter" in text and "fake tensors" in text
    assert "checks: NOT RUN" in text and "GPU-only" in text
    record = json.loads((cache / BIG / "import.json").read_text())
    assert record["facts"]["traced"]["on"] == "fake tensors" and record["file"] == str(FIXTURE / "level1/60_Big_matmul.py")


def test_a_gpu_only_import_is_refused_in_cpu_mode(imported):
    with pytest.raises(ValueError, match="GPU-only"):
        gym.make(f"KernelBench/{BIG}-v0", device="cpu")


def test_the_agent_prompt_shows_the_file(imported):
    spec = get_problem(SOFTMAX)
    prompt = first_prompt(spec, "triton", "an NVIDIA H100", 3, spec.reference_source())
    assert "torch.softmax(x, dim=1)" in prompt and "aten::_softmax" in prompt and "Timed shapes" not in prompt


@requires_cpu_mode
def test_cpu_mode_episode_grades_an_imported_problem(imported):
    """Through gym.make and the real Evaluator: grading seeds (in place after the first), stress cases
    and timed outputs all checked; a correct kernel is correct, zeros are wrong, and the reference
    itself is flagged for the torch ops the import forbade."""
    env = gym.make(f"KernelBench/{AFFINE}-v0", device="cpu", max_turns=3)
    obs, info = env.reset(seed=7)
    assert "F.leaky_relu" in obs["reference"] and info["shapes"] == [{}]
    _, reward, _, _, good = env.step(candidate("kb_affine_leaky_relu"))
    _, _, _, _, zeros = env.step(candidate("kb_zeros"))
    _, _, _, _, ref = env.step(get_problem(AFFINE).reference_source())
    env.close()
    assert good["correct"] and good["error"] is None and good["flags"] == [] and reward == 1.0
    kinds = [c["kind"] for c in good["result"]["checks"]]
    assert kinds.count("grading") == 3 and kinds.count("stress") == 3 and "timing" in kinds
    assert not zeros["correct"] and zeros["error"] == "mismatch"
    assert "(as get_inputs() makes it)" in zeros["result"]["message"]
    assert ref["correct"] and ref["error"] == "integrity" and "forbidden_op:aten::leaky_relu" in ref["flags"]


def test_kb_import_prints_registered_and_skipped_and_reuses_unchanged_files(imported, tmp_path, capsys):
    """A second directory with one file already imported (same text: its folder is kept, nothing
    runs) and one broken file."""
    level1 = tmp_path / "KernelBench" / "level1"
    level1.mkdir(parents=True)
    shutil.copy(FIXTURE / "level1/23_Softmax.py", level1)
    shutil.copy(FIXTURE / "level1/50_Syntax_error.py", level1)
    code = main(["import", str(tmp_path), "--device", "cpu", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "registered 1 problem(s)" in out and f"KernelBench/{SOFTMAX}-v0" in out
    assert "skipped 1 file(s)" in out and "level1/50_Syntax_error.py: syntax error at line 6" in out
    assert main(["import", str(tmp_path), "--device", "cpu", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["cached"], r["cpu_mode"]) for r in data["registered"]] == [(SOFTMAX, True, True)]


def test_kb_import_bad_input_is_one_line(tmp_path, capsys):
    assert main(["import", str(tmp_path / "missing")]) == 2
    assert main(["import", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"kb: error: {tmp_path / 'missing'}: no such directory"
    assert err[1].startswith("kb: error:") and "no level1 ... level4 folders" in err[1]


def test_a_file_that_breaks_is_unregistered_on_reimport(imported, tmp_path, monkeypatch):
    """A copy of the import cache: the unchanged file keeps its folder; once it no longer parses,
    its folder and its environment are gone."""
    _, cache = imported
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    monkeypatch.setenv("KB_IMPORT_DIR", str(copy))
    src = tmp_path / "kb" / "level1"
    src.mkdir(parents=True)
    shutil.copy(FIXTURE / "level1/23_Softmax.py", src)
    try:
        first = register_kernelbench(src.parent, device="cpu")
        assert [(r.name, r.cached) for r in first.registered] == [(SOFTMAX, True)]
        (src / "23_Softmax.py").write_text((src / "23_Softmax.py").read_text().replace("def forward(self, x", "def forward(self x"))
        second = register_kernelbench(src.parent, device="cpu")
        assert second.registered == [] and "syntax error" in second.skipped[0].reason
        assert not (copy / SOFTMAX).exists() and f"KernelBench/{SOFTMAX}-v0" not in gym.registry
        assert (cache / SOFTMAX).exists()  # the module's own cache is untouched
    finally:
        monkeypatch.undo()
        refresh_problems()
        kb_env._register_all()  # the module's import again


def test_another_cache_folder_is_read_in_this_process(imported, tmp_path, monkeypatch):
    from kb_env import problem

    monkeypatch.setattr(problem, "_EXTRA_ROOTS", [])
    src = tmp_path / "kb" / "level1"
    src.mkdir(parents=True)
    shutil.copy(FIXTURE / "level1/52_No_get_inputs.py", src)  # static: nothing to run
    other = tmp_path / "elsewhere"
    other.mkdir()
    report = register_kernelbench(src.parent, cache_dir=other, device="cpu")
    assert report.cache == str(other.resolve()) and other.resolve() in problem.problem_roots()
    assert report.skipped[0].file == "level1/52_No_get_inputs.py"


@requires_cuda
def test_gpu_import_checks_the_big_problem_on_the_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("KB_IMPORT_DIR", str(tmp_path / "cache"))
    src = tmp_path / "kb" / "level1"
    src.mkdir(parents=True)
    shutil.copy(FIXTURE / "level1/60_Big_matmul.py", src)
    try:
        report = register_kernelbench(src.parent, device="cuda")
        (big,) = report.registered
        assert big.checked_on == "cuda" and not big.cpu_mode and big.stress
    finally:
        _forget([f"KernelBench/{BIG}-v0"])
