"""Trusted output comparison (kb_env.evaluate.correctness.compare_outputs): the reason and the
first offending element are reported right, and the norm bars fail answers that pass an
elementwise allclose."""

from __future__ import annotations

import math

import pytest
import torch

from kb_env.evaluate.correctness import compare_outputs
from kb_env.problem import Tolerance

TOL = {"float32": Tolerance(atol=1e-5, rtol=1e-5, max_rel_l2=1e-4),
       "float16": Tolerance(atol=1e-3, rtol=1e-3, max_rel_l2=1e-2)}


def ref(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def test_exact_match_passes_with_zero_error():
    e = [ref(4, 5), ref(3, seed=1, dtype=torch.float16)]
    ok, mismatch, stats = compare_outputs([t.clone() for t in e], e, TOL)
    assert ok and mismatch is None
    assert stats == {"rel_l2_err": 0.0, "max_abs_err": 0.0}


def test_small_error_within_tolerance_passes_and_is_measured():
    e = ref(100)
    g = e + 1e-7
    ok, mismatch, stats = compare_outputs([g], [e], TOL)
    assert ok and mismatch is None
    assert 0 < stats["max_abs_err"] < 2e-7
    assert 0 < stats["rel_l2_err"] < 1e-6


def test_output_count_mismatch():
    e = [ref(3), ref(3, seed=1)]
    ok, mismatch, _ = compare_outputs(e[:1], e, TOL)
    assert not ok and mismatch.reason == "count"
    assert "1" in mismatch.message and "2" in mismatch.message


def test_shape_mismatch_names_both_shapes():
    ok, mismatch, _ = compare_outputs([ref(4, 6)], [ref(6, 4)], TOL)
    assert not ok and mismatch.reason == "shape" and mismatch.output == 0
    assert "(4, 6)" in mismatch.message and "(6, 4)" in mismatch.message


def test_same_numel_different_shape_fails():
    e = ref(12)
    ok, mismatch, _ = compare_outputs([e.reshape(3, 4)], [e], TOL)
    assert not ok and mismatch.reason == "shape"


def test_dtype_mismatch_names_both_dtypes():
    e = ref(8)
    ok, mismatch, _ = compare_outputs([e.double()], [e], TOL)
    assert not ok and mismatch.reason == "dtype"
    assert "float64" in mismatch.message and "float32" in mismatch.message


def test_non_tensor_output_is_invalid():
    ok, mismatch, _ = compare_outputs([[1.0, 2.0]], [ref(2)], TOL)
    assert not ok and mismatch.reason == "invalid"


def test_second_output_is_the_one_reported():
    e = [ref(3), ref(4, 4, seed=1)]
    g = [e[0].clone(), e[1].clone()]
    g[1][2, 3] += 1.0
    ok, mismatch, _ = compare_outputs(g, e, TOL)
    assert not ok and mismatch.output == 1 and mismatch.index == [2, 3]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_where_reference_is_finite(bad):
    e = ref(5, 7)
    g = e.clone()
    g[3, 2] = bad
    g[4, 6] = bad
    ok, mismatch, stats = compare_outputs([g], [e], TOL)
    assert not ok
    assert mismatch.reason == "nonfinite"
    assert mismatch.index == [3, 2]  # the first one, in row-major order
    assert mismatch.expected == pytest.approx(float(e[3, 2]))
    assert mismatch.n_bad == 2 and mismatch.n_total == 35
    assert (math.isnan(mismatch.got) if math.isnan(bad) else mismatch.got == bad)
    assert stats["rel_l2_err"] == math.inf


def test_inf_in_both_at_the_same_place_is_fine():
    e = ref(10)
    e[4] = float("inf")
    e[7] = float("-inf")
    ok, mismatch, stats = compare_outputs([e.clone()], [e], TOL)
    assert ok, mismatch
    assert math.isfinite(stats["rel_l2_err"]) and math.isfinite(stats["max_abs_err"])


def test_first_mismatch_location_and_values_are_right():
    e = ref(6, 8, 5)
    g = e.clone()
    g[4, 1, 3] += 0.5
    g[5, 7, 4] -= 0.25  # a later one
    ok, mismatch, stats = compare_outputs([g], [e], TOL)
    assert not ok and mismatch.reason == "values"
    assert mismatch.index == [4, 1, 3]
    assert mismatch.got == pytest.approx(float(g[4, 1, 3]))
    assert mismatch.expected == pytest.approx(float(e[4, 1, 3]))
    assert mismatch.n_bad == 2 and mismatch.n_total == e.numel()
    assert mismatch.max_abs_err == pytest.approx(0.5, rel=1e-5)
    assert stats["max_abs_err"] == pytest.approx(0.5, rel=1e-5)


def test_zero_dim_output_mismatch():
    ok, mismatch, _ = compare_outputs([torch.tensor(1.0)], [torch.tensor(2.0)], TOL)
    assert not ok and mismatch.reason == "values" and mismatch.index == []
    assert mismatch.got == 1.0 and mismatch.expected == 2.0


def test_rel_l2_bar_fails_a_biased_answer_inside_atol():
    # every reference value is ~1e-4, far below atol: zeros pass elementwise but not the L2 bar
    tol = {"float32": Tolerance(atol=1e-3, rtol=0, max_rel_l2=1e-2)}
    e = torch.full((1000,), 1e-4) + ref(1000) * 1e-5
    z = torch.zeros_like(e)
    assert torch.allclose(z, e, atol=1e-3, rtol=0)
    ok, mismatch, stats = compare_outputs([z], [e], tol)
    assert not ok
    assert mismatch.reason == "values"
    assert "relative L2" in mismatch.message
    assert mismatch.n_bad == 0
    assert stats["rel_l2_err"] == pytest.approx(1.0)


def test_min_cosine_bar_fails_a_rotated_answer():
    # elementwise fine (big atol), relative L2 0.3 under the 0.5 bar, but the direction is off
    tol_no_cos = {"float32": Tolerance(atol=10.0, rtol=0, max_rel_l2=0.5)}
    tol_cos = {"float32": Tolerance(atol=10.0, rtol=0, max_rel_l2=0.5, min_cosine=0.99)}
    e = ref(4096)
    noise = ref(4096, seed=7)
    noise -= (noise @ e) / (e @ e) * e  # orthogonal to e
    g = e + 0.3 * noise * (e.norm() / noise.norm())
    ok, _, _ = compare_outputs([g], [e], tol_no_cos)
    assert ok
    ok, mismatch, _ = compare_outputs([g], [e], tol_cos)
    assert not ok
    assert "cosine" in mismatch.message
    assert mismatch.cosine == pytest.approx(1 / math.sqrt(1.09), abs=1e-3)


def test_min_cosine_passes_an_aligned_answer():
    tol = {"float32": Tolerance(atol=1e-5, rtol=1e-5, max_rel_l2=1e-4, min_cosine=0.999)}
    e = ref(256)
    ok, mismatch, _ = compare_outputs([e * (1 + 1e-7)], [e], tol)
    assert ok, mismatch


def test_all_zero_reference_needs_an_all_zero_answer():
    e = torch.zeros(16)
    assert compare_outputs([torch.zeros(16)], [e], TOL)[0]
    g = torch.zeros(16)
    g[3] = 1e-6  # inside atol, but any error against a zero norm is infinite relative error
    ok, _, stats = compare_outputs([g], [e], TOL)
    assert not ok and stats["rel_l2_err"] == math.inf


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_outputs_are_compared_exactly(dtype):
    # no tolerance entry for integers: they need none
    e = (torch.arange(24).reshape(4, 6) % 3).to(dtype)
    assert compare_outputs([e.clone()], [e], TOL) == (True, None, {"rel_l2_err": 0.0, "max_abs_err": 0.0})
    g = e.clone()
    g[2, 5] = ~g[2, 5] if dtype is torch.bool else g[2, 5] + 1
    ok, mismatch, _ = compare_outputs([g], [e], TOL)
    assert not ok and mismatch.reason == "values"
    assert mismatch.index == [2, 5]
    assert mismatch.got == float(g[2, 5]) and mismatch.expected == float(e[2, 5])
    assert mismatch.n_bad == 1


def test_large_integers_differing_by_one_are_caught():
    e = torch.tensor([2**60, 5], dtype=torch.int64)
    g = e.clone()
    g[0] += 1  # indistinguishable after a float64 round trip
    ok, mismatch, _ = compare_outputs([g], [e], TOL)
    assert not ok and mismatch.index == [0]


def test_dtype_without_tolerance_raises():
    e = ref(4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16"):
        compare_outputs([e.clone()], [e], TOL)


def test_float16_uses_its_own_tolerance():
    e = ref(64, dtype=torch.float16)
    g = (e.float() + 5e-4).half()  # ok under fp16's atol 1e-3, would fail fp32's 1e-5
    assert compare_outputs([g], [e], TOL)[0]
    assert not compare_outputs([g.float()], [e.float()], TOL)[0]


# ----- known gaps ---------------------------------------------------------------------------------

@pytest.mark.parametrize("got", [0.0, float("-inf")], ids=["finite", "opposite-sign"])
def test_answer_differing_from_an_infinite_reference_fails(got):
    e = ref(10)
    e[4] = float("inf")
    g = e.clone()
    g[4] = got
    ok, _, _ = compare_outputs([g], [e], TOL)
    assert not ok


def test_a_values_mismatch_names_its_first_bad_element():
    """A user reading the message finds where to look: the first element outside the bar, with both values."""
    expected = torch.ones(4, 5)
    got = expected.clone()
    got[2, 3] = 1.5
    ok, mismatch, _ = compare_outputs([got], [expected], {"float32": Tolerance(atol=1e-6, rtol=1e-6, max_rel_l2=1e-3)})
    assert not ok and mismatch.index == [2, 3]
    assert "the first at [2, 3] (got 1.5, expected 1)" in mismatch.message
