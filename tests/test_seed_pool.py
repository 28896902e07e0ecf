"""The seed scheme and the baseline cache, against stand-in workers (no processes): pooled grading
seeds recur across evaluations and fresh ones do not; every seed an evaluation sends is one the
evaluator can list (what the secrets test looks for); a kept baseline is used only when this
evaluation's check batch confirms it, and measured again (interleaved) when it drifts."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kb_env import get_problem
from kb_env.evaluate import baseline as baselines
from kb_env.evaluate import seeds
from kb_env.evaluate.evaluator import Evaluator, _Budget, _timed_calls
from kb_env.evaluate.result import DeviceInfo, EvalResult
from kb_env.evaluate.seeds import FRESH_GRADING, SEED_POOL, SeedPlan, derive_seed

LABELS = [0, 1, 2]


def test_without_a_pool_every_seed_comes_from_the_salt():
    plan = SeedPlan(salt=7, pool_key=None)
    assert plan.param_seed == derive_seed(7, "params")
    assert plan.grading(0, LABELS) == [(derive_seed(7, f"grading:{k}"), False) for k in LABELS]


def test_pooled_seeds_recur_and_fresh_ones_do_not():
    pool = {SeedPlan(0, pool_key=11).pooled(si, j) for si in range(2) for j in range(SEED_POOL)}
    other_pool = {SeedPlan(0, pool_key=12).pooled(si, j) for si in range(2) for j in range(SEED_POOL)}
    assert len(pool) == 2 * SEED_POOL and not pool & other_pool  # another evaluator, another pool
    fresh_seen: set[int] = set()
    pooled_seen: set[int] = set()
    for salt in range(200):
        plan = SeedPlan(salt, pool_key=11)
        assert plan.param_seed == SeedPlan(salt + 1, pool_key=11).param_seed  # one model per evaluator
        fresh_now: set[int] = set()
        for si in range(2):
            drawn = plan.grading(si, LABELS)
            fresh = [s for s, pooled in drawn if not pooled]
            assert len(fresh) == FRESH_GRADING and not set(fresh) & pool
            pooled = [s for s, p in drawn if p]
            assert len(set(pooled)) == len(pooled) and set(pooled) <= pool
            assert set(pooled) <= {plan.pooled(si, j) for j in range(SEED_POOL)}  # the shape's own pool
            assert not set(fresh) & fresh_seen  # never seen in an earlier evaluation
            fresh_now |= set(fresh)
            pooled_seen |= set(pooled)
        fresh_seen |= fresh_now
        assert plan.stress(0) != SeedPlan(salt + 1, pool_key=11).stress(0)
    assert pooled_seen == pool  # every pooled seed comes round: the cache fills
    positions = {next(k for k, (_, p) in enumerate(SeedPlan(s, 11).grading(0, LABELS)) if not p) for s in range(50)}
    assert positions == set(range(len(LABELS)))  # the fresh case is not always the same position


class FakeWorker:
    """Answers every request of an evaluation (reference or candidate) and records the seeds sent."""

    def __init__(self, base_ms: float = 2.0):
        self.seeds: list[int] = []
        self.requests: list[dict[str, Any]] = []
        self.base_ms = base_ms
        self._keep = 0

    def _note(self, msg: dict[str, Any]) -> None:
        self.requests.append(msg)
        for case in [msg.get("case")] + list(msg.get("cases") or []):
            if case:
                self.seeds.append(case["seed"])
        self.seeds += list(msg.get("seeds") or [])
        if "seed" in msg:
            self.seeds.append(msg["seed"])

    def recv(self, timeout: float) -> dict[str, Any]:
        return {"ok": True, "import_s": 0.0}

    def request(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._note(msg)
        op = msg["op"]
        if op == "time":
            self._keep = msg["keep"]
            return {"ok": True, "times_ms": [self.base_ms] * (len(msg["seeds"]) - msg["warmup"])}
        if op == "outputs":
            return {"ok": True, "outputs": [[torch.zeros(2)] for _ in range(self._keep)]}
        if op == "run":
            return {"ok": True, "outputs": [torch.zeros(2)], "ops": [], "output_flags": []}
        if op == "check":
            return {"ok": True, "passed": True, "mismatch": None, "rel_l2_err": 0.0, "max_abs_err": 0.0}
        return {"ok": True, "cache_hits": 0, "computed": len(msg.get("cases") or [])}


def test_every_seed_an_evaluation_sends_is_one_the_evaluator_lists():
    ev = Evaluator(get_problem("softmax"), "cpu", pool_key=5)
    ref, cand = FakeWorker(), FakeWorker()
    res = EvalResult(problem="softmax", mode="cpu")
    ev._candidate(ref, cand, _Budget(60), 4242, res)
    assert res.correct, res.message
    sent = set(ref.seeds) | set(cand.seeds)
    assert len(sent) > 10 and sent <= set(ev.seeds_of(4242))
    pooled = [c for r in ref.requests if r["op"] == "reference_outputs" for c in r["cases"] if c.get("cache")]
    assert pooled and all(c["kind"] == "grading" for c in pooled)  # only pooled grading cases are cached


TIMING = {"warmup": 2, "reps": 6, "rounds": 3, "input_sets": 2}


@pytest.fixture()
def kept():
    baselines.BASELINES.clear()
    yield baselines.BASELINES
    baselines.BASELINES.clear()


def _time(base_ms: float, driver: str = "1.0", salt: int = 1):
    """One `_time` in CUDA mode against stand-ins: the baseline worker reports `base_ms` per call."""
    spec = get_problem("softmax")
    ev = Evaluator(spec, "cpu", pool_key=3)
    ev.mode = "cuda"  # what is tested is the harness's logic; the workers are stand-ins
    shapes = spec.shapes.cpu[:1]
    plan = SeedPlan(salt, 3)
    calls = _timed_calls(plan, len(shapes), TIMING)
    timed = ev._kept_cases(0, shapes[0], calls[(0, TIMING["rounds"] - 1)], plan.param_seed, TIMING, "t")
    res = EvalResult(problem=spec.name, mode="cuda", correct=True,
                     device=DeviceInfo(mode="cuda", name="Stand-in GPU", driver=driver, torch="2.11", python="3.12"))
    ref, cand = FakeWorker(base_ms), FakeWorker(1.0)
    ev._time(ref, cand, _Budget(60), shapes, calls, timed, TIMING, plan.param_seed, salt, res, set())
    batches = [r for r in ref.requests if r["op"] == "time"]
    return res.timings[0], batches


def test_a_kept_baseline_is_used_once_a_check_batch_confirms_it(kept):
    first, batches = _time(2.0)
    assert not first.baseline_cached and len(batches) == TIMING["rounds"]  # interleaved, then kept
    assert len(kept) == 1 and first.baseline.median_ms == 2.0
    second, batches = _time(2.0 * (1 + baselines.DRIFT / 2), salt=2)  # within the drift bar
    assert second.baseline_cached and len(batches) == 1
    check = batches[0]
    assert len(check["seeds"]) - check["warmup"] == min(TIMING["reps"], baselines.CHECK_CALLS)
    assert second.baseline.median_ms == 2.0 and second.speedup == pytest.approx(2.0)  # the kept samples
    assert second.baseline_check_ms == pytest.approx(2.0 * (1 + baselines.DRIFT / 2))
    rounds = _timed_calls(SeedPlan(2, 3), 1, TIMING)
    assert not set(check["seeds"]) & {s for seeds_ in rounds.values() for s in seeds_}  # its own fresh inputs


def test_a_drifted_baseline_is_measured_again_interleaved(kept):
    _time(2.0)
    drifted, batches = _time(2.0 * (1 + 3 * baselines.DRIFT), salt=2)
    assert not drifted.baseline_cached and len(batches) == 1 + TIMING["rounds"]  # the check, then the rounds
    assert drifted.baseline.median_ms == pytest.approx(2.0 * (1 + 3 * baselines.DRIFT))
    again, _ = _time(2.0 * (1 + 3 * baselines.DRIFT), salt=3)
    assert again.baseline_cached  # the new measurement is the one kept


def test_a_new_driver_is_a_new_baseline(kept):
    _time(2.0)
    other, batches = _time(2.0, driver="2.0")
    assert not other.baseline_cached and len(batches) == TIMING["rounds"] and len(kept) == 2


def test_a_cold_evaluator_keeps_no_baseline(kept):
    spec = get_problem("softmax")
    ev = Evaluator(spec, "cpu", warm=False)
    ev.mode = "cuda"
    res = EvalResult(problem=spec.name, mode="cuda", device=DeviceInfo(mode="cuda", name="g", torch="t", python="p"))
    assert ev._baseline_check(FakeWorker(), {}, spec.shapes.cpu[0], 0, TIMING, 1, res) == (None, None, None)
