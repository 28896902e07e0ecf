"""kahan_softmax: the inputs make a plain float32 summation fail the bar, while compensated
summation passes; and the reference agrees with an exactly rounded float64 sum.

The bar is problem.yaml's; the inputs are the problem's own (`make_inputs` at a CPU shape, as the
harness draws them). "Plain float32" is torch.softmax in float32 and the softmax problem's
known-good Triton kernel (an online softmax with float32 lane accumulators); "compensated" is
this problem's known-good Triton kernel (Neumaier lanes folded in float64)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import requires_cpu_mode
from interpreted import run_interpreted

from kb_env import get_problem
from kb_env.evaluate.correctness import compare_outputs
from kb_env.problem import import_file
from kb_env.sandbox.cases import make_inputs

SPEC = get_problem("kahan_softmax")
REF = import_file(SPEC.reference_path, "_kahan_ref")
BAR = SPEC.tolerance["float32"].max_rel_l2


def _case(shape_index: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    x, = make_inputs(REF, SPEC.shapes.cpu[shape_index], seed, "cpu")
    with torch.no_grad():
        return x, REF.Model()(x)


def _rel_l2(got: torch.Tensor, exp: torch.Tensor) -> float:
    return float((got.double() - exp.double()).norm() / exp.double().norm())


@pytest.mark.parametrize("shape_index", range(len(SPEC.shapes.cpu)))
def test_torch_float32_softmax_fails_the_bar(shape_index):
    x, ref = _case(shape_index)
    plain = torch.softmax(x, dim=-1)
    ok, mismatch, stats = compare_outputs([plain], [ref], SPEC.tolerance)
    assert not ok and mismatch.reason == "values"
    assert stats["rel_l2_err"] > 5 * BAR, f"plain float32 misses by only {stats['rel_l2_err'] / BAR:.1f}x the bar"


def test_the_cold_tail_is_what_a_plain_sum_loses():
    """The plain sum's error is the cold tail's share of the normaliser: its terms vanish."""
    x, ref = _case(0)
    e = torch.exp(x.double() - x.double().amax(-1, keepdim=True))
    hot = min(REF.HOT, x.shape[-1] // 8)
    tail_share = float(e[:, hot:].sum() / e.sum())
    plain_err = _rel_l2(torch.softmax(x, dim=-1), ref)
    assert 5 * BAR < tail_share and 0.7 * tail_share < plain_err < 1.3 * tail_share


@requires_cpu_mode
def test_plain_triton_softmax_fails_and_compensated_passes(tmp_path):
    x, ref = _case(0)
    plain_path = get_problem("softmax").solution_paths[0]
    compensated_path = SPEC.solution_paths[0]
    plain, compensated = run_interpreted([{"path": plain_path, "inputs": [x]},
                                          {"path": compensated_path, "inputs": [x]}], tmp_path)
    ok, _, stats = compare_outputs(plain, [ref], SPEC.tolerance)
    assert not ok and stats["rel_l2_err"] > 5 * BAR, stats
    ok, mismatch, stats = compare_outputs(compensated, [ref], SPEC.tolerance)
    assert ok, mismatch
    assert stats["rel_l2_err"] < 0.25 * BAR


def test_reference_matches_an_exactly_rounded_float64_sum():
    """An independent float64 path: the normaliser by math.fsum (correctly rounded), not torch's
    float64 reduction, which is what the reference (and Model.double()) use."""
    x, ref = _case(1)
    for r in range(x.shape[0]):
        e = torch.exp(x[r].double() - x[r].double().max())
        exact = (e / math.fsum(e.tolist())).float()
        assert _rel_l2(ref[r], exact) < 0.05 * BAR
        assert float((ref[r] != exact).double().mean()) < 1e-3  # differ only where float64 rounding ties
