"""fp8_gemm: the weights really are e4m3 codes with per-channel scales that matter (so no
bfloat16 shortcut passes), the stress cases stay inside e4m3's range, and the library bar
(torch._scaled_mm) keeps the reference's contract."""

from __future__ import annotations

import pytest
import torch

from kb_env import get_problem
from kb_env.evaluate.correctness import compare_outputs
from kb_env.problem import import_file
from kb_env.sandbox.cases import init_inputs, make_inputs, make_reference_model

SPEC = get_problem("fp8_gemm")
REF = import_file(SPEC.reference_path, "_fp8_ref")
LIB = import_file(SPEC.folder / "library.py", "_fp8_lib")


def _case(shape_index: int, seed: int = 0, stress=None):
    shape = SPEC.shapes.cpu[shape_index]
    model = make_reference_model(REF, shape, param_seed=0)
    x, x_scale = make_inputs(REF, shape, seed, "cpu", stress)
    with torch.no_grad():
        return model, x, x_scale, model(x, x_scale)


def test_weights_are_e4m3_codes_with_channel_scales():
    model, x, x_scale, _ = _case(0)
    state = model.state_dict()
    assert set(state) == {"weight", "weight_scale"}
    assert state["weight"].dtype == torch.float8_e4m3fn and state["weight_scale"].dtype == torch.float32
    assert state["weight_scale"].shape == (state["weight"].shape[0],)
    assert float(state["weight_scale"].max() / state["weight_scale"].min()) > 4
    assert float(state["weight"].float().abs().amax(1).min()) == 448.0  # each channel uses e4m3's range
    assert x.dtype == torch.float8_e4m3fn and x_scale.shape == (x.shape[0], 1)


@pytest.mark.parametrize("shape_index", range(len(SPEC.shapes.cpu)))
def test_dropping_or_flattening_a_scale_fails(shape_index):
    model, x, x_scale, expected = _case(shape_index)
    product = x.double() @ model.weight.double().t()
    w_scale, mean_w_scale = model.weight_scale.double(), float(model.weight_scale.double().mean())
    wrong = {
        "channel scale as one per-tensor scale": product * x_scale.double() * mean_w_scale,
        "row scale dropped": product * w_scale,
        "channel scale dropped": product * x_scale.double(),
    }
    for mistake, y in wrong.items():
        ok, _, _ = compare_outputs([y.to(torch.bfloat16)], [expected], SPEC.tolerance)
        assert not ok, f"{mistake} passes"
    exact = REF.oracle(model, [x, x_scale]).to(torch.bfloat16)
    ok, mismatch, _ = compare_outputs([exact], [expected], SPEC.tolerance)
    assert ok, mismatch


@pytest.mark.parametrize("stress", [s.model_dump() for s in SPEC.stress], ids=lambda s: f"scale{s['scale']:g}")
def test_stress_cases_stay_inside_e4m3(stress):
    for shape_index in range(len(SPEC.shapes.cpu)):
        model, x, x_scale, y = _case(shape_index, stress=stress)
        codes = x.float()
        assert bool(torch.isfinite(codes).all()) and float(codes.abs().max()) <= 448.0
        assert bool(torch.isfinite(y.float()).all())
        if stress["scale"] > 1:
            assert float(codes.abs().max()) == 448.0  # scaled up to the top of the range, not past it


@pytest.mark.parametrize("shape_index", range(len(SPEC.shapes.cpu)))
def test_library_bar_keeps_the_contract(shape_index):
    model, x, x_scale, expected = _case(shape_index)
    lib = LIB.Model(*init_inputs(REF, SPEC.shapes.cpu[shape_index]))
    lib.load_state_dict(model.state_dict(), strict=True)
    try:
        with torch.no_grad():
            got = lib(x, x_scale)
    except (RuntimeError, NotImplementedError) as exc:  # torch._scaled_mm has no CPU kernel on this torch
        pytest.skip(f"torch._scaled_mm on CPU: {exc}")
    ok, mismatch, _ = compare_outputs([got], [expected], SPEC.tolerance)
    assert ok, mismatch
