"""problem.yaml loading (kb_env.problem): a broken problem folder is a ProblemError naming the
file and the field; formulas are arithmetic only and never executed as code; the registry
follows KB_PROBLEMS_DIR, reads KB_PROBLEM_PATH and the import cache too."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import yaml

import kb_env
from kb_env.problem import (ProblemError, ProblemSpec, all_problems, get_problem, load_problem, problem_names,
                            problems_root, refresh_problems)

SOFTMAX = Path(kb_env.get_problem("softmax").folder)


@pytest.fixture
def folder(tmp_path) -> Path:
    """A fresh copy of problems/softmax in a temp dir (folder name = problem name)."""
    dst = tmp_path / "softmax"
    shutil.copytree(SOFTMAX, dst)
    return dst


def read_yaml(folder: Path) -> dict:
    return yaml.safe_load((folder / "problem.yaml").read_text())


def write_yaml(folder: Path, data) -> None:
    (folder / "problem.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def broken(folder: Path, **changes) -> Path:
    data = read_yaml(folder)
    for key, value in changes.items():
        if value is _DELETE:
            del data[key]
        else:
            data[key] = value
    write_yaml(folder, data)
    return folder


_DELETE = object()


def load_error(folder: Path) -> str:
    with pytest.raises(ProblemError) as info:
        load_problem(folder)
    return str(info.value)


# ----- the copy itself is fine -----------------------------------------------------------------
def test_copied_problem_loads_and_points_at_its_folder(folder):
    spec = load_problem(folder)
    assert isinstance(spec, ProblemSpec)
    assert spec.name == "softmax"
    assert spec.folder == folder.resolve()
    assert spec.reference_path == folder.resolve() / "reference.py"
    assert spec.solution_paths and all(p.parent == folder.resolve() / "solutions" for p in spec.solution_paths)
    assert spec.env_id() == "KernelBench/softmax-v0"
    assert "class Model" in spec.reference_source()


def test_problem_error_is_a_value_error():
    assert issubclass(ProblemError, ValueError)


# ----- broken files ------------------------------------------------------------------------------
def test_invalid_yaml_names_the_file(folder):
    (folder / "problem.yaml").write_text("name: softmax\nshapes: {gpu: [\n  - rows: 1\n")
    msg = load_error(folder)
    assert str(folder.resolve() / "problem.yaml") in msg
    assert "YAML" in msg


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", ""], ids=["list", "scalar", "empty"])
def test_top_level_not_a_mapping_names_the_file(folder, text):
    (folder / "problem.yaml").write_text(text)
    msg = load_error(folder)
    assert str(folder.resolve() / "problem.yaml") in msg
    assert "mapping" in msg


def test_missing_problem_yaml_names_the_file(folder):
    (folder / "problem.yaml").unlink()
    assert str(folder.resolve() / "problem.yaml") in load_error(folder)


# ----- broken fields: message names problem.yaml and the field ------------------------------------
CASES = {
    "missing-flops": (dict(flops=_DELETE), "flops"),
    "missing-shapes": (dict(shapes=_DELETE), "shapes"),
    "seeds-string": (dict(seeds="abc"), "seeds"),
    "seeds-empty": (dict(seeds=[]), "seeds"),
    "unknown-field": (dict(colour="blue"), "colour"),
    "unknown-variable": (dict(flops="5 * rows * cols * heads"), "flops"),
    "unknown-variable-bytes": (dict(bytes="4 * n"), "bytes"),
    "formula-call": (dict(flops="pow(rows, 2)"), "flops"),
    "formula-attribute": (dict(flops="rows.bit_length() * cols"), "flops"),
    "formula-import": (dict(bytes="__import__('os').getpid()"), "bytes"),
    "formula-lambda": (dict(flops="(lambda: rows)()"), "flops"),
    "formula-comprehension": (dict(flops="sum([rows for _ in (1,)])"), "flops"),
    "formula-subscript": (dict(flops="rows[0]"), "flops"),
    "formula-not-expression": (dict(flops="rows = 3"), "flops"),
    "bad-compute-dtype": (dict(compute_dtype="float13"), "compute_dtype"),
    "tolerance-dtype": (dict(tolerance={"complex64": {"atol": 1e-5, "rtol": 1e-5, "max_rel_l2": 1e-4}}), "tolerance"),
    "tolerance-extra": (dict(tolerance={"float32": {"atol": 1e-5, "rtol": 1e-5, "max_rel_l2": 1e-4, "eps": 1}}),
                        "tolerance"),
    "negative-atol": (dict(tolerance={"float32": {"atol": -1, "rtol": 1e-5, "max_rel_l2": 1e-4}}), "atol"),
    "shape-variables-differ": (dict(shapes={"gpu": [{"rows": 8, "cols": 8}], "cpu": [{"rows": 2, "n": 3}]}), "shapes"),
    "shape-nonpositive": (dict(shapes={"gpu": [{"rows": 8, "cols": 8}], "cpu": [{"rows": 0, "cols": 3}]}), "shapes"),
    "shape-float": (dict(shapes={"gpu": [{"rows": 8, "cols": 8}], "cpu": [{"rows": 2.5, "cols": 3}]}), "shapes"),
    "torch-op-unnamespaced": (dict(forbidden={"imports": [], "torch_ops": ["_softmax"]}), "torch_ops"),
    "forbidden-extra": (dict(forbidden={"modules": ["cupy"]}), "forbidden"),
    "baseline-unknown": (dict(baseline="fastest"), "baseline"),
    "timing-reps": (dict(timing={"reps": 1}), "reps"),
    "limits-negative": (dict(limits={"load_s": -5}), "load_s"),
    "interface-unknown": (dict(interface="backward"), "interface"),
    "stress-scale-zero": (dict(stress=[{"scale": 0}]), "scale"),
    "stress-heavy-tail-one": (dict(stress=[{"heavy_tail": 1}]), "heavy_tail"),
    "stress-unknown-key": (dict(stress=[{"shift": 3}]), "stress"),
    "stress-scales-retired": (dict(stress_scales=[64.0]), "stress_scales"),
    "regime-unknown": (dict(regime="latency-bound"), "regime"),
    "regime-list-length": (dict(regime=["memory-bound", "compute-bound", "memory-bound"]), "regime"),
    "regime-list-uniform": (dict(regime=["memory-bound", "memory-bound"]), "regime"),
    "level-missing": (dict(level=_DELETE), "level"),
    "level-five": (dict(level=5), "level"),
    "gpu-shapes-empty": (dict(shapes={"gpu": [], "cpu": [{"rows": 2, "cols": 3}]}), "gpu"),
}


@pytest.mark.parametrize("changes, field", CASES.values(), ids=CASES.keys())
def test_broken_field_names_file_and_field(folder, changes, field):
    msg = load_error(broken(folder, **changes))
    assert str(folder.resolve() / "problem.yaml") in msg
    assert field in msg


@pytest.mark.parametrize("formula", [
    "__import__('pathlib').Path({marker!r}).touch() or 1",
    "open({marker!r}, 'w') and 1",
    "[c for c in ().__class__.__base__.__subclasses__()] and 1",
])
def test_formula_code_is_rejected_not_executed(folder, tmp_path, formula):
    marker = tmp_path / "executed"
    msg = load_error(broken(folder, flops=formula.format(marker=str(marker))))
    assert "flops" in msg
    assert not marker.exists()


def test_name_differing_from_folder_names_the_field(folder):
    msg = load_error(broken(folder, name="softmax_v2"))
    assert str(folder.resolve() / "problem.yaml") in msg
    assert "name" in msg and "softmax_v2" in msg


def test_missing_reference_names_reference_py(folder):
    (folder / "reference.py").unlink()
    msg = load_error(folder)
    assert str(folder.resolve() / "reference.py") in msg


def test_baseline_file_named_but_missing(folder):
    msg = load_error(broken(folder, baseline="baseline.py"))
    assert str(folder.resolve() / "problem.yaml") in msg
    assert "baseline" in msg
    assert "baseline.py" in msg


def test_baseline_file_present_is_accepted(folder):
    (folder / "baseline.py").write_text((folder / "reference.py").read_text())
    spec = load_problem(broken(folder, baseline="baseline.py"))
    assert spec.baseline_path == folder.resolve() / "baseline.py"


def test_baseline_in_the_working_directory_does_not_count(folder, tmp_path, monkeypatch):
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    (elsewhere / "baseline.py").write_text("class Model: pass\n")
    monkeypatch.chdir(elsewhere)
    msg = load_error(broken(folder, baseline="baseline.py"))
    assert "baseline" in msg


# ----- formulas -------------------------------------------------------------------------------------
def test_flops_and_bytes_evaluate_on_a_shape():
    spec = get_problem("softmax")
    shape = {"rows": 16, "cols": 777}
    assert spec.flops_of(shape) == 5 * 16 * 777
    assert spec.bytes_of(shape) == 2 * 4 * 16 * 777
    assert isinstance(spec.flops_of(shape), float)


def test_formula_helper_functions_are_allowed_and_evaluated(folder):
    spec = load_problem(broken(folder, flops="ceil(rows / 3) * max(cols, 1000) + floor(log2(cols))",
                               bytes="min(rows, cols) ** 2 % 7 + rows // 4 - -1"))
    shape = {"rows": 16, "cols": 777}
    assert spec.flops_of(shape) == 6 * 1000 + 9
    assert spec.bytes_of(shape) == (16**2 % 7) + 4 + 1


def test_gpu_only_problem_loads_and_cpu_mode_refuses_it(folder):
    data = read_yaml(folder)
    write_yaml(folder, {**data, "shapes": {"gpu": data["shapes"]["gpu"]}})
    spec = load_problem(folder)
    assert spec.gpu_only and spec.shapes_for("cpu") == [] and spec.shapes_for("cuda")
    from kb_env.evaluate.evaluator import Evaluator

    with pytest.raises(ValueError, match="GPU-only"):
        Evaluator(spec, "cpu")


def test_regime_per_gpu_shape(folder):
    """A problem whose GPU shapes straddle the ridge (a GEMM at decode and at prefill sizes) lists one
    regime per GPU shape; `kb list` calls it mixed and the agent is told each shape's."""
    from kb_env.policies.prompts import first_prompt

    spec = load_problem(broken(folder, regime=["compute-bound", "memory-bound"]))
    assert [spec.regime_of(i) for i in range(2)] == ["compute-bound", "memory-bound"]
    assert spec.regime_label == "mixed"
    prompt = first_prompt(spec, "triton", "an H100", 2, "ref")
    assert "compute-bound at rows=4096, cols=16384; memory-bound at rows=32768, cols=1024" in prompt
    single = get_problem("softmax")
    assert single.regime_of(1) == single.regime_label == "memory-bound"
    assert "the problem is memory-bound" in first_prompt(single, "triton", "an H100", 2, "ref")


def test_stress_cases_describe_themselves():
    from kb_env.problem import Stress

    assert Stress(scale=64).describe() == "inputs scaled by 64"
    assert "Student-t, 3 degrees" in Stress(heavy_tail=3).describe()
    assert Stress(scale=0.01, heavy_tail=4).describe().startswith("inputs scaled by 0.01 and heavy-tailed")


def test_shapes_for_mode():
    spec = get_problem("softmax")
    assert spec.shapes_for("cpu") == list(spec.shapes.cpu)
    assert spec.shapes_for("cuda") == list(spec.shapes.gpu)
    assert spec.shapes_for("cpu") != spec.shapes_for("cuda")


# ----- the registry ---------------------------------------------------------------------------------
def test_kb_problems_dir_selects_the_problems(tmp_path, monkeypatch):
    root = tmp_path / "my_problems"
    root.mkdir()
    shutil.copytree(SOFTMAX, root / "softmax_copy")
    (root / "not_a_problem").mkdir()  # a folder without problem.yaml is ignored
    (root / "README.md").write_text("notes")
    monkeypatch.setenv("KB_PROBLEMS_DIR", str(root))

    assert problems_root() == root
    problems = all_problems()
    assert list(problems) == ["softmax_copy"]
    assert problems["softmax_copy"].folder == (root / "softmax_copy").resolve()
    assert get_problem("softmax_copy").env_id() == "KernelBench/softmax_copy-v0"
    with pytest.raises(ProblemError):
        get_problem("softmax")


def test_a_broken_problem_in_the_registry_is_reported(tmp_path, monkeypatch):
    root = tmp_path / "broken_problems"
    root.mkdir()
    shutil.copytree(SOFTMAX, root / "softmax")
    broken(root / "softmax", seeds="abc")
    monkeypatch.setenv("KB_PROBLEMS_DIR", str(root))
    with pytest.raises(ProblemError, match="seeds"):
        all_problems()


def test_default_registry_holds_the_shipped_problems():
    assert {"softmax", "rmsnorm", "gemm_bias_gelu"} <= set(all_problems())


def test_unknown_problem_lists_known_problems():
    with pytest.raises(ProblemError) as info:
        get_problem("nope")
    msg = str(info.value)
    assert "nope" in msg
    for name in ("softmax", "rmsnorm", "gemm_bias_gelu"):
        assert name in msg


# ----- the registry's other roots: KB_PROBLEM_PATH and the import cache ------------------------------
def _copy_softmax(root: Path, name: str) -> None:
    shutil.copytree(SOFTMAX, root / name)  # the folder names the problem


def test_kb_problem_path_roots_are_read_and_a_name_twice_is_an_error(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    _copy_softmax(a, "extra_softmax")
    monkeypatch.setenv("KB_PROBLEM_PATH", f"{a}:{tmp_path / 'missing'}")
    refresh_problems()
    try:
        assert "extra_softmax" in all_problems() and "extra_softmax" in problem_names()
        _copy_softmax(b, "extra_softmax")
        monkeypatch.setenv("KB_PROBLEM_PATH", f"{a}:{b}")
        with pytest.raises(ProblemError, match="defined twice"):
            all_problems()
    finally:
        monkeypatch.undo()
        refresh_problems()


def test_a_broken_imported_problem_is_left_out_with_a_warning(tmp_path, monkeypatch):
    _copy_softmax(tmp_path, "level1-9_Broken")
    (tmp_path / "level1-9_Broken" / "problem.yaml").write_text("name: level1-9_Broken\nseeds: abc\n")
    monkeypatch.setenv("KB_IMPORT_DIR", str(tmp_path))
    refresh_problems()
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            problems = all_problems()
        assert "level1-9_Broken" not in problems and "softmax" in problems
        assert any("level1-9_Broken" in str(w.message) for w in seen)
    finally:
        monkeypatch.undo()
        refresh_problems()


def test_a_problem_imported_by_another_process_is_found_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("KB_IMPORT_DIR", str(tmp_path))
    refresh_problems()
    try:
        assert "level1-8_Later" not in all_problems()
        _copy_softmax(tmp_path, "level1-8_Later")  # written after this process read the registry
        assert get_problem("level1-8_Later").folder == (tmp_path / "level1-8_Later").resolve()
    finally:
        monkeypatch.undo()
        refresh_problems()
