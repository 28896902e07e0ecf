"""The wall-clock check against faked timer reports: one stalled batch must not flag an honest
candidate, a faker must still be flagged, and the confirming batches are graded like the others.

The workers are stand-ins (no processes, no GPU): the candidate's reported times and the wall
time each batch takes are scripted, which is exactly what the check compares."""

from __future__ import annotations

import time
from typing import Any

import torch

from kb_env import get_problem
from kb_env.evaluate.evaluator import WALL_CHECK_CONFIRM, Evaluator, _Budget, _Confirm
from kb_env.evaluate.result import EvalResult, Samples

TIMING = {"warmup": 3, "reps": 10, "rounds": 2, "input_sets": 2}
# What the candidate says each call took; scripted wall times are far from the 0.2 x wall bar either
# way (an honest batch sleeps nothing, a faker's 20 ms per call), so a loaded machine cannot flip them.
REPORTED_MS = 2.0
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


def _check(walls_ms: list[float], ref: FakeReference | None = None) -> tuple[set[str], EvalResult, FakeCandidate,
                                                                            FakeReference]:
    spec = get_problem("softmax")
    ev = Evaluator(spec, "cpu")
    ref = ref or FakeReference()
    cand = FakeCandidate(walls_ms)
    shape = spec.shapes.cpu[0]
    sets = [{"id": f"t0.{j}", "kind": "timing", "shape": shape, "shape_index": 0, "seed_index": j, "seed": j,
             "param_seed": 7} for j in range(TIMING["input_sets"])]
    base = {"op": "time", "shape": shape, "param_seed": 7, "keep": len(sets)}
    res = EvalResult(problem=spec.name, mode="cuda", baseline=spec.baseline.value, timing_meaningful=False)
    res.correct = True
    flags: set[str] = set()
    samples = Samples.of([REPORTED_MS] * 20)
    # the two timed rounds said 1 ms per call (round 0 is warm-up and ignored); then the scripted batches
    confirm = _Confirm(ref, base, TIMING, 1234, 0, 1,
                       lambda seeds, tag: ev._kept_cases(0, shape, seeds, 7, TIMING, tag))
    ev._wall_check(cand, _Budget(60), base, [50.0, FAKER_MS], samples, confirm, res, flags)
    return flags, res, cand, ref


def test_a_stalled_batch_is_confirmed_and_does_not_flag_an_honest_candidate():
    # the rounds' wall (20 ms/call) says "implausible"; the first confirming batch runs at full speed
    flags, res, cand, ref = _check([HONEST_MS])
    assert "timer_implausible" not in flags and res.correct
    assert len(cand.batches) == 1
    # the confirming batch is a real timed batch: fresh seeds, warm-up like a later round, outputs kept
    batch = cand.batches[0]
    assert batch["keep"] == TIMING["input_sets"] and batch["warmup"] == 2
    assert len(batch["seeds"]) == TIMING["reps"] + 2 and len(set(batch["seeds"])) == len(batch["seeds"])
    assert not set(batch["seeds"]) & set(range(TIMING["input_sets"]))
    # each wall is paired with a flush-only batch of as many calls (a request's fixed cost cancels)
    assert len(cand.flushes) == 2 and all(len(f["seeds"]) == len(batch["seeds"]) for f in cand.flushes)
    # ... whose kept outputs are the reference's cases, and were checked
    assert [c["seed"] for c in ref.cases] == batch["seeds"][-TIMING["input_sets"]:]
    assert ref.checked == [c["id"] for c in ref.cases]


def test_a_faker_is_flagged_after_every_confirming_batch_agrees():
    flags, res, cand, _ = _check([FAKER_MS] * WALL_CHECK_CONFIRM)
    assert "timer_implausible" in flags
    assert len(cand.batches) == WALL_CHECK_CONFIRM
    seeds = [s for b in cand.batches for s in b["seeds"]]
    assert len(set(seeds)) == len(seeds), "each confirming batch draws new inputs"


def test_a_confirming_batch_with_wrong_outputs_fails_the_candidate():
    # skipping the work in the extra batch (to look fast there) leaves wrong outputs
    flags, res, cand, ref = _check([HONEST_MS], FakeReference(passes=False))
    assert not res.correct and res.error is not None and res.error.value == "mismatch"
    assert "timed call" in res.message


def test_a_plausible_wall_clock_needs_no_confirmation():
    spec = get_problem("softmax")
    ev = Evaluator(spec, "cpu")
    cand, ref = FakeCandidate([]), FakeReference()
    base = {"op": "time", "shape": spec.shapes.cpu[0], "param_seed": 7, "keep": 1}
    res = EvalResult(problem=spec.name, mode="cuda", baseline=spec.baseline.value, timing_meaningful=False)
    flags: set[str] = set()
    # the rounds said 10 ms per call (the first round is warm-up); 4 ms reported is over 0.2 x 10
    wall = ev._wall_check(cand, _Budget(60), base, [50.0, 10.0], Samples.of([4.0] * 10),
                          _Confirm(ref, base, TIMING, 1, 0, 1, lambda seeds, tag: []), res, flags)
    assert not flags and not cand.batches and 5.0 < wall <= 10.0
