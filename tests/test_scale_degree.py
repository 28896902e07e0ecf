"""`scale_degree`: a problem whose reference is homogeneous in its inputs has a scaled-up stress
case's atol scaled the same way. The declared degree is a fact about the reference, checked here in
float64; the scaled bar accepts what the plain bar accepts at the plain scale, no more."""

from __future__ import annotations

import pytest
import torch
from conftest import requires_cpu_mode

from kb_env.evaluate.correctness import compare_outputs
from kb_env.problem import Interface, all_problems, import_file
from kb_env.sandbox.cases import as_output_list, make_inputs, make_reference_model

DECLARED = sorted(name for name, spec in all_problems().items()
                  if spec.scale_degree is not None and spec.interface is Interface.forward)


def test_some_problems_declare_a_degree():
    assert {"cumsum_rows", "gemv_bf16", "fp8_gemm"} <= set(DECLARED)


@pytest.mark.parametrize("name", DECLARED)
def test_the_reference_is_homogeneous_of_its_declared_degree(name):
    spec = all_problems()[name]
    ref = import_file(spec.reference_path, f"_deg_ref_{name}")
    shape = spec.shapes.cpu[0]
    model = make_reference_model(ref, shape, param_seed=0).double().eval()
    inputs = [x.double() if x.is_floating_point() else x for x in make_inputs(ref, shape, 0, "cpu")]
    s = 4.0
    with torch.no_grad():
        plain = as_output_list(model(*inputs))
        scaled = as_output_list(model(*[x * s if x.is_floating_point() else x for x in inputs]))
    for p, q in zip(plain, scaled):
        assert torch.allclose(q, p * s ** spec.scale_degree, rtol=1e-10, atol=0), name
        assert not torch.allclose(q, p * s ** (spec.scale_degree + 1), rtol=1e-3, atol=0), name  # not a higher degree


def test_only_a_scaled_up_case_of_a_declared_problem_gets_a_wider_atol():
    spec = all_problems()["cumsum_rows"]
    plain = spec.tolerance["float32"]
    assert spec.tolerance_for(None) == spec.tolerance
    assert spec.tolerance_for({"heavy_tail": 3}) == spec.tolerance
    assert spec.tolerance_for({"scale": 0.015625}) == spec.tolerance  # never tighter than calibrated
    up = spec.tolerance_for({"scale": 64.0})["float32"]
    assert up.atol == pytest.approx(plain.atol * 64) and (up.rtol, up.max_rel_l2) == (plain.rtol, plain.max_rel_l2)
    assert all_problems()["gemv_bf16"].tolerance_for({"scale": 64.0})["bfloat16"].atol == pytest.approx(
        all_problems()["gemv_bf16"].tolerance["bfloat16"].atol * 64 ** 2)
    softmax = all_problems()["softmax"]  # undeclared: its outputs do not scale with its inputs
    assert softmax.scale_degree is None and softmax.tolerance_for({"scale": 64.0}) == softmax.tolerance


def test_the_scaled_bar_holds_a_near_zero_output_to_the_plain_relative_bar():
    """A running sum crossing zero: an error at the zero crossing of 32x the plain atol is what the
    x64 case's honest rounding looks like; the plain bar rejects it, the scaled one accepts it, and
    neither accepts an error the same relative size above the scaled floor."""
    spec = all_problems()["cumsum_rows"]
    atol = spec.tolerance["float32"].atol
    expected = torch.linspace(-1.0, 1.0, 2001, dtype=torch.float32) * 64 * 100
    expected[1000] = 0.0
    honest = expected.clone()
    honest[1000] = 32 * atol
    assert not compare_outputs([honest], [expected], spec.tolerance)[0]
    assert compare_outputs([honest], [expected], spec.tolerance_for({"scale": 64.0}))[0]
    wrong = expected.clone()
    wrong[1000] = 65 * atol
    assert not compare_outputs([wrong], [expected], spec.tolerance_for({"scale": 64.0}))[0]


SHIFT_ON_SCALED_INPUTS = '''

_forward = ModelNew.forward


def _shifted(self, x):
    # an error of 20x the plain atol on every output, only on the x64 case (median |x| far above 1):
    # near-zero running sums miss the plain bar there, not the bar scaled by 64
    y = _forward(self, x)
    return y + 2e-3 if x.abs().median() > 16 else y


ModelNew.forward = _shifted
'''


def test_a_relaxed_stress_widens_rtol_and_the_norm_bar_only():
    softmax = all_problems()["softmax"]
    plain = softmax.tolerance["float32"]
    relaxed = softmax.tolerance_for({"heavy_tail": 3, "relax": 10.0})["float32"]
    assert relaxed.atol == plain.atol
    assert (relaxed.rtol, relaxed.max_rel_l2) == (pytest.approx(plain.rtol * 10), pytest.approx(plain.max_rel_l2 * 10))
    assert softmax.tolerance_for({"heavy_tail": 3}) == softmax.tolerance


def test_a_relax_that_lets_zeros_through_is_refused():
    spec = all_problems()["softmax"]
    data = spec.model_dump(exclude={"folder"})
    data["tolerance"]["float32"]["max_rel_l2"] = 0.05
    data["stress"] = [{"heavy_tail": 3, "relax": 20.0}]
    with pytest.raises(ValueError, match="relative-L2 bar to 1 or more"):
        type(spec).model_validate(data)


@requires_cpu_mode
def test_the_worker_grades_a_scaled_case_with_its_scaled_atol():
    from kb_env.evaluate.evaluator import Evaluator

    spec = all_problems()["cumsum_rows"]
    assert spec.tolerance["float32"].atol * 20 == pytest.approx(2e-3)
    source = spec.solution_paths[0].read_text() + SHIFT_ON_SCALED_INPUTS
    with Evaluator(spec, "cpu") as ev:
        res = ev.evaluate(source)
    assert res.correct, res.message
    scaled = [c for c in res.checks if c.kind == "stress"]
    assert scaled and all(c.ok for c in scaled)
    with Evaluator(spec.model_copy(update={"scale_degree": None}), "cpu") as ev:
        res = ev.evaluate(source)
    assert not res.correct and "scaled by 64" in res.message, res.message
