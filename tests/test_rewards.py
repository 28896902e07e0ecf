"""Reward functions (rewards/): pure EvalResult -> float, with the documented ordering
flagged <= every wrong answer; compile error < runtime error/timeout/crash <= mismatch < correct,
and correct GPU rewards that grow with peak_fraction and speedup, bounded."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rewards
from kb_env.evaluate.result import ErrorKind, EvalResult
from rewards import default, get_reward, sparse
from rewards.shaped import SPEEDUP_LOG2_RANGE


def result(kind: str, **kw) -> EvalResult:
    """An EvalResult as the evaluator would produce for each outcome."""
    base = dict(problem="softmax", mode="cuda")
    if kind == "compile_error":
        base.update(compiled=False, correct=False, error=ErrorKind.compile_error, message="SyntaxError")
    elif kind in ("runtime_error", "timeout", "crash"):
        base.update(compiled=True, correct=False, error=ErrorKind(kind))
    elif kind == "mismatch":
        base.update(compiled=True, correct=False, error=ErrorKind.mismatch)
    elif kind == "correct":
        base.update(compiled=True, correct=True, error=None, timing_meaningful=True, speedup=1.0, peak_fraction=0.5)
    elif kind == "correct_cpu":
        base.update(mode="cpu", compiled=True, correct=True, error=None, timing_meaningful=False)
    elif kind == "flagged_correct":  # ran correctly but broke the rules (e.g. patched the timer)
        base.update(compiled=True, correct=True, error=ErrorKind.integrity, flags=["timer_patched"],
                    timing_meaningful=True, speedup=50.0, peak_fraction=1.0)
    elif kind == "flagged_import":  # not run: forbidden import
        base.update(compiled=True, correct=False, error=ErrorKind.integrity, flags=["forbidden_import:cupy"])
    elif kind == "flagged_only":  # flags with no error kind set: still flagged
        base.update(compiled=True, correct=True, error=None, flags=["torch_op:aten::_softmax"],
                    timing_meaningful=True, speedup=3.0, peak_fraction=0.9)
    else:  # pragma: no cover
        raise AssertionError(kind)
    base.update(kw)
    return EvalResult(**base)


WRONG = ["compile_error", "runtime_error", "timeout", "crash", "mismatch"]
FLAGGED = ["flagged_correct", "flagged_import", "flagged_only"]


def correct(peak_fraction, speedup) -> EvalResult:
    return result("correct", peak_fraction=peak_fraction, speedup=speedup)


# ----- ordering -----------------------------------------------------------------------------------
def test_default_outcome_ordering():
    r = {k: default(result(k)) for k in WRONG + ["correct"]}
    assert r["compile_error"] < r["runtime_error"]
    assert r["runtime_error"] == r["timeout"] == r["crash"]
    assert r["crash"] <= r["mismatch"] < r["correct"]
    # even the slowest correct kernel beats every wrong answer
    assert default(correct(0.0, 1e-6)) > max(r[k] for k in WRONG)


@pytest.mark.parametrize("flagged", FLAGGED)
@pytest.mark.parametrize("fn", [default, sparse], ids=["default", "sparse"])
def test_flagged_gets_no_more_than_any_wrong_answer(fn, flagged):
    assert fn(result(flagged)) <= min(fn(result(k)) for k in WRONG)


@pytest.mark.parametrize("fn", [default, sparse], ids=["default", "sparse"])
def test_correct_but_flagged_is_no_better_than_a_mismatch(fn):
    best_flagged = result("flagged_correct", speedup=1000.0, peak_fraction=1.0)
    assert fn(best_flagged) <= fn(result("mismatch"))


# ----- correct kernels: monotone and bounded --------------------------------------------------------
def test_correct_reward_grows_with_peak_fraction_and_speedup():
    assert default(correct(0.1, 1.0)) < default(correct(0.5, 1.0)) < default(correct(0.9, 1.0))
    assert default(correct(0.5, 0.6)) < default(correct(0.5, 1.0)) < default(correct(0.5, 2.0)) \
        < default(correct(0.5, 7.0))


def test_correct_reward_is_clipped_at_the_documented_limits():
    lo, hi = SPEEDUP_LOG2_RANGE
    top = default(correct(1.0, 2.0**hi))
    bottom = default(correct(0.0, 2.0**lo))
    # peak_fraction caps at 1, speedup at 2**hi (8x), and floors at 2**lo (0.5x)
    assert default(correct(7.0, 2.0**hi)) == top
    assert default(correct(1.0, 1e9)) == top
    assert default(correct(0.0, 1e-9)) == bottom
    assert default(correct(-3.0, 2.0**lo)) == bottom
    assert top == pytest.approx(2.5)
    assert bottom == pytest.approx(1.0 - 0.5 / 3)
    # bounded, and still above every wrong answer at the bottom
    assert bottom > default(result("mismatch"))


@settings(max_examples=200, deadline=None)
@given(pf=st.tuples(st.floats(-1, 3, allow_nan=False), st.floats(-1, 3, allow_nan=False)).map(sorted),
       sp=st.tuples(st.floats(1e-3, 100, allow_nan=False), st.floats(1e-3, 100, allow_nan=False)).map(sorted))
def test_default_is_monotone_in_peak_fraction_and_speedup(pf, sp):
    lower = default(correct(pf[0], sp[0]))
    higher = default(correct(pf[1], sp[1]))
    assert lower <= higher
    for v in (lower, higher):
        assert 1.0 - 0.5 / 3 - 1e-12 <= v <= 2.5 + 1e-12


@settings(max_examples=100, deadline=None)
@given(pf=st.floats(0.0, 0.99), sp=st.floats(0.5, 7.9), dpf=st.floats(0.005, 0.5), dsp=st.floats(1.01, 2.0))
def test_default_strictly_rewards_improvement_inside_the_clip_range(pf, sp, dpf, dsp):
    assert default(correct(min(pf + dpf, 1.0), sp)) > default(correct(pf, sp))
    assert default(correct(pf, min(sp * dsp, 8.0))) > default(correct(pf, sp))


# ----- CPU mode -------------------------------------------------------------------------------------
@pytest.mark.parametrize("speedup, peak", [(None, None), (100.0, 1.0), (0.01, 0.0), (float("nan"), float("inf"))])
def test_cpu_mode_correct_is_exactly_one(speedup, peak):
    r = result("correct_cpu", speedup=speedup, peak_fraction=peak)
    assert default(r) == 1.0
    assert sparse(r) == 1.0


def test_timing_not_meaningful_ignores_timing_fields_even_on_cuda():
    r = result("correct", timing_meaningful=False, speedup=8.0, peak_fraction=1.0)
    assert default(r) == 1.0


# ----- degenerate numbers ---------------------------------------------------------------------------
BAD = [float("nan"), float("inf"), float("-inf"), None, 0.0, -1.0]


@pytest.mark.parametrize("pf", BAD)
@pytest.mark.parametrize("sp", BAD)
@pytest.mark.parametrize("fn", [default, sparse], ids=["default", "sparse"])
def test_nonfinite_or_missing_timing_never_gives_a_nan_reward(fn, pf, sp):
    v = fn(correct(pf, sp))
    assert math.isfinite(v)
    assert v <= fn(correct(1.0, 8.0))
    v_dict = fn(correct(pf, sp).model_dump(mode="json"))
    assert v_dict == v


# ----- sparse ---------------------------------------------------------------------------------------
def test_sparse_pays_only_correct_kernels_faster_than_baseline():
    assert sparse(correct(0.5, 1.5)) == 1.0
    assert sparse(correct(0.5, 1.0)) == 0.0
    assert sparse(correct(0.9, 0.8)) == 0.0
    assert sparse(correct(0.9, None)) == 0.0
    for k in WRONG + FLAGGED:
        assert sparse(result(k)) == 0.0


# ----- dict form and the registry -------------------------------------------------------------------
@pytest.mark.parametrize("kind", WRONG + FLAGGED + ["correct", "correct_cpu"])
@pytest.mark.parametrize("fn", [default, sparse], ids=["default", "sparse"])
def test_dict_and_json_forms_give_the_same_reward(fn, kind):
    r = result(kind, speedup=2.5, peak_fraction=0.7) if kind == "correct" else result(kind)
    assert fn(r.model_dump(mode="json")) == fn(r)
    assert fn(json.loads(r.model_dump_json())) == fn(r)


def test_a_dict_that_is_not_a_result_is_rejected():
    with pytest.raises(ValueError):
        default({"correct": True})  # no problem/mode: not an EvalResult


def test_get_reward_by_name_and_callable():
    assert get_reward("default") is default
    assert get_reward("sparse") is sparse
    assert set(rewards.REWARDS) >= {"default", "sparse"}

    def mine(r):
        return 42.0

    assert get_reward(mine) is mine


def test_get_reward_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError) as info:
        get_reward("nope")
    msg = str(info.value)
    assert "nope" in msg
    for name in rewards.REWARDS:
        assert name in msg
