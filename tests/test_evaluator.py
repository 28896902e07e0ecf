"""Evaluator API beyond the environment: progress stages, argument checks, reproducible seeds."""

from __future__ import annotations

import pytest
from conftest import requires_cpu_mode

from kb_env import get_problem
from kb_env.evaluate.evaluator import Evaluator, derive_seed


@requires_cpu_mode
def test_progress_reports_each_stage_in_order(softmax_solution):
    spec = get_problem("softmax")
    stages: list[str] = []
    result = Evaluator(spec, "cpu", progress=stages.append).evaluate(softmax_solution, salt=5)
    assert result.correct
    n_cases = len(spec.shapes.cpu) * (len(spec.seeds) + len(spec.stress))
    assert stages[:3] == ["starting workers", "reference outputs", "loading the candidate"]
    # every stage's wall time is kept (the baseline's batches apart from the candidate's), and
    # together they account for the evaluation
    assert set(result.stage_s) == {"starting", "reference", "loading", "correctness", "timing", "baseline"}
    assert all(v >= 0 for v in result.stage_s.values()) and result.stage_s["correctness"] > 0
    assert 0.8 * result.wall_s <= sum(result.stage_s.values()) <= result.wall_s
    assert [s for s in stages if s.startswith("correctness")][-1].startswith(f"correctness {n_cases}/{n_cases}")
    assert sum(s.startswith("timing") for s in stages) == len(spec.shapes.cpu)


def test_bad_arguments():
    spec = get_problem("softmax")
    with pytest.raises(ValueError, match="mode"):
        Evaluator(spec, "gpu")
    with pytest.raises(ValueError, match="timeout_s"):
        Evaluator(spec, "cpu", timeout_s=0)


def test_seeds_are_derived_from_the_salt():
    assert derive_seed(1, "grading:0") == derive_seed(1, "grading:0")
    assert derive_seed(1, "grading:0") != derive_seed(2, "grading:0")
    assert derive_seed(1, "grading:0") != derive_seed(1, "grading:1")
    assert 0 <= derive_seed(123, "params") < 2**63


def test_a_flag_keeps_the_message_that_explains_it():
    from kb_env.evaluate.result import EvalResult

    res = EvalResult(problem="softmax", mode="cuda", compiled=True, correct=True,
                     message="RuntimeError: the profiled call failed here")
    Evaluator(get_problem("softmax"), "cpu")._finish(res, {"profile_failed"}, set())
    assert res.error is not None and res.error.value == "integrity"
    assert res.message.startswith("integrity violation: profile_failed")
    assert "the profiled call failed here" in res.message
