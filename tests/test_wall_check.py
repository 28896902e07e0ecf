"""The wall-clock check against faked timer reports: an estimate times a dedicated batch, graded
like a timed round; one stalled batch must not flag an honest candidate, a faker must be flagged
after its confirmations agree, and the batches are long enough to drown a request's fixed cost.

The workers are stand-ins (no processes, no GPU): the candidate's reported times and the wall
time each batch takes are scripted, which is exactly what the check compares."""

from __future__ import annotations

import time
from typing import Any

import torch

from kb_env import get_problem
from kb_env.evaluate.evaluator import WALL_BATCH_MS, WALL_CHECK_CONFIRM, Evaluator, _Budget, _Confirm
from kb_env.evaluate.result import EvalResult, Samples

TIMING = {"warmup": 3, "reps": 10, "rounds": 2, "input_sets": 2}
# What the candidate says each call took; scripted wall times are far from the 0.2 x wall bar either
# way (an honest batch sleeps nothing, a faker's 20 ms per call), so a loaded machine cannot flip them.
REPORTED_MS = 1.0
HONEST_MS, FAKER_MS = 0.0, 20.0


class FakeCandidate:
    """Answers time/outputs requests; each timed batch takes the next scripted wall time per call."""

    def __init__(self, wall_ms_per_call: list[float]):
        self.walls = list(wall_ms_per_call)
        self.batches: list[dict[str, Any]] = []
        self.flushes: list[dict[str, Any]] = []

    def request(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        if msg["op"] == "outputs":
            return {"ok": True, "outputs": [[torch.zeros(2)] for _ in range(self.batches[-1]["keep"])]}
        if msg.get("flush_only"):
            self.flushes.append(msg)
            return {"ok": True, "times_ms": [0.0] * len(msg["seeds"])}
        self.batches.append(msg)
        time.sleep(self.walls.pop(0) * len(msg["seeds"]) / 1e3)
        return {"ok": True, "times_ms": [REPORTED_MS] * (len(msg["seeds"]) - msg["warmup"])}


class FakeReference:
    """Records the cases it is asked for and passes or fails every check."""

    def __init__(self, passes: bool = True):
        self.passes = passes
        self.cases: list[dict[str, Any]] = []
        self.checked: list[str] = []

    def request(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        if msg["op"] == "reference_outputs":
            self.cases += msg["cases"]
            return {"ok": True}
        assert msg["op"] == "check"
        self.checked.append(msg["case_id"])
        mismatch = None if self.passes else {"output": 0, "reason": "values", "message": "wrong values"}
        return {"ok": True, "passed": self.passes, "mismatch": mismatch, "rel_l2_err": 0.0, "max_abs_err": 0.0}


def _check(walls_ms: list[float], ref: FakeReference | None = None, round_ms: float = FAKER_MS,
           reported_ms: float = REPORTED_MS):
    """Run the wall check after timed rounds that took `round_ms` per call, with the dedicated
    batches taking `walls_ms` per call in turn."""
    spec = get_problem("softmax")
    ev = Evaluator(spec, "cpu")
    ref = ref or FakeReference()
    cand = FakeCandidate(walls_ms)
    shape = spec.shapes.cpu[0]
    base = {"op": "time", "shape": shape, "param_seed": 7, "keep": TIMING["input_sets"]}
    res = EvalResult(problem=spec.name, mode="cuda", baseline=spec.baseline.value, timing_meaningful=False)
    res.correct = True
    flags: set[str] = set()
    samples = Samples.of([reported_ms] * 20)
    confirm = _Confirm(ref, base, TIMING, 1234, 0, 1, lambda seeds, tag: ev._kept_cases(0, shape, seeds, 7, TIMING, tag))
    wall = ev._wall_check(cand, _Budget(60), base, [50.0, round_ms], samples, confirm, res, flags)
    return flags, res, cand, ref, wall


def test_an_honest_candidate_is_not_flagged_even_after_stalled_rounds():
    # the rounds' wall (20 ms/call) would say "implausible"; the dedicated batch runs at full speed
    flags, res, cand, ref, wall = _check([HONEST_MS])
    assert "timer_implausible" not in flags and res.correct
    assert len(cand.batches) == 1 and wall < 0.2 * FAKER_MS
    # the batch is a real timed batch: fresh seeds, warm-up like a later round, outputs kept and checked
    batch = cand.batches[0]
    assert batch["keep"] == TIMING["input_sets"] and batch["warmup"] == 2
    assert len(set(batch["seeds"])) == len(batch["seeds"])
    assert [c["seed"] for c in ref.cases] == batch["seeds"][-TIMING["input_sets"]:]
    assert ref.checked == [c["id"] for c in ref.cases]
    # ... paired with a flush-only batch of as many calls (a request's fixed cost cancels)
    assert len(cand.flushes) == 1 and len(cand.flushes[0]["seeds"]) == len(batch["seeds"])


def test_a_faker_is_flagged_after_every_confirmation_agrees():
    flags, res, cand, _, wall = _check([FAKER_MS] * (1 + WALL_CHECK_CONFIRM))
    assert "timer_implausible" in flags
    assert len(cand.batches) == 1 + WALL_CHECK_CONFIRM and wall > 0.5 * FAKER_MS
    seeds = [s for b in cand.batches for s in b["seeds"]]
    assert len(set(seeds)) == len(seeds), "each batch draws new inputs"


def test_one_stalled_batch_does_not_flag_an_honest_candidate():
    flags, res, cand, _, _ = _check([FAKER_MS, HONEST_MS, HONEST_MS])
    assert "timer_implausible" not in flags and res.correct
    assert len(cand.batches) == 3  # the stall was confirmed away; the median decided


def test_a_batch_with_wrong_outputs_fails_the_candidate():
    # skipping the work in the dedicated batch (to look fast there) leaves wrong outputs
    flags, res, cand, ref, wall = _check([HONEST_MS], FakeReference(passes=False))
    assert wall is None and not res.correct and res.error is not None and res.error.value == "mismatch"
    assert "timed call" in res.message


def test_the_batch_is_sized_to_drown_a_requests_fixed_cost():
    """Rounds of 0.01 ms calls: the dedicated batch has enough calls to last WALL_BATCH_MS."""
    flags, res, cand, _, _ = _check([HONEST_MS], round_ms=0.01, reported_ms=0.01)
    timed = len(cand.batches[0]["seeds"]) - cand.batches[0]["warmup"]
    assert timed * 0.01 >= WALL_BATCH_MS * 0.99 and not flags
