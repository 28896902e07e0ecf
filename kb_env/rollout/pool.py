"""A fixed-size pool of evaluator actors, one per GPU, that never silently shrinks.

`EvaluatorPool.evaluate` is blocking and thread-safe: the calling thread waits for an idle
actor, runs one evaluation on it and gives it back. If the actor dies during the call (the
candidate killed it, the process crashed, the node went away) the evaluation is reported as a
crash, never lost or retried on someone else's GPU, and the slot is brought back before it
takes more work: Ray restarts the actor (`max_restarts=-1`) on the GPU it frees, and if that
fails the pool kills it for good and starts a new one. Ray's own `ActorPool` drops a dead
actor without replacing it; this pool keeps `size` actors or raises."""

from __future__ import annotations

import secrets
import threading
from typing import Any, Literal

from pydantic import BaseModel

from ..evaluate.result import ErrorKind, EvalResult
from .actor import ActorInfo, EvaluatorActor


class PoolStats(BaseModel):
    """What a pool has done: evaluations finished, actors lost mid-evaluation, and how each
    slot came back (Ray restarted it, or the pool replaced it)."""

    evaluations: int = 0
    actor_deaths: int = 0
    restarts: int = 0
    replacements: int = 0


def _ray():
    import ray

    return ray


class EvaluatorPool:
    """`size` evaluator actors. Mode "auto" is "cuda" when the Ray cluster has GPUs (one actor
    per GPU by default), else "cpu" (CPU mode, half the cluster's CPUs by default: each
    evaluation runs a reference and a candidate process). Starts Ray locally if it is not
    running."""

    def __init__(self, num_actors: int | None = None, mode: Literal["auto", "cuda", "cpu"] = "auto",
                 cpus_per_actor: float = 1.0, restart_timeout_s: float = 300.0):
        ray = _ray()
        if mode not in ("auto", "cuda", "cpu"):
            raise ValueError(f"mode must be 'auto', 'cuda' or 'cpu', not {mode!r}")
        if num_actors is not None and num_actors < 1:
            raise ValueError(f"num_actors must be at least 1, not {num_actors}")
        if not ray.is_initialized():
            ray.init()
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), resources.get("CPU", 1.0)
        self.mode = ("cuda" if gpus else "cpu") if mode == "auto" else mode
        if self.mode == "cuda":
            if gpus == 0:
                raise ValueError("mode 'cuda' but the Ray cluster has no GPUs; use mode='cpu' (CPU mode) or 'auto'")
            if num_actors is not None and num_actors > gpus:
                raise ValueError(f"{num_actors} GPU actors asked for, but the Ray cluster has {gpus} GPU(s)")
            self.size = num_actors or gpus
        else:
            self.size = num_actors or max(1, int(cpus) // 2)
            if self.size * cpus_per_actor > cpus:
                raise ValueError(f"{self.size} actors x {cpus_per_actor} CPUs need more than the cluster's {cpus:g} CPUs")
        self.cpus_per_actor = cpus_per_actor
        self.restart_timeout_s = restart_timeout_s
        self.stats = PoolStats()
        self._lock = threading.Lock()
        self._closed = False
        self._actors = [self._spawn(slot) for slot in range(self.size)]
        self._infos: list[ActorInfo] = ray.get([a.describe.remote() for a in self._actors])
        self._idle = set(range(self.size))
        self._freed = threading.Condition()

    def _acquire(self, slot: int | None) -> int:
        """Wait for an idle actor (any, or the one in `slot`) and mark it busy."""
        with self._freed:
            while not (self._idle if slot is None else slot in self._idle):
                self._freed.wait()
            chosen = min(self._idle) if slot is None else slot
            self._idle.discard(chosen)
            return chosen

    def _release(self, slot: int) -> None:
        with self._freed:
            self._idle.add(slot)
            self._freed.notify_all()

    # ----- actors ------------------------------------------------------------------------
    def _spawn(self, slot: int):
        ray = _ray()
        cls = ray.remote(EvaluatorActor).options(
            num_gpus=1 if self.mode == "cuda" else 0, num_cpus=self.cpus_per_actor,
            max_restarts=-1, max_task_retries=0, max_concurrency=1)
        return cls.remote(slot, self.mode)

    def _recover(self, slot: int) -> None:
        """Bring a slot whose actor died back: wait for Ray's restart, else replace the actor."""
        ray = _ray()
        try:
            info = ray.get(self._actors[slot].describe.remote(), timeout=self.restart_timeout_s)
            with self._lock:
                self.stats.restarts += 1
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            ray.kill(self._actors[slot], no_restart=True)
            self._actors[slot] = self._spawn(slot)
            info = ray.get(self._actors[slot].describe.remote(), timeout=self.restart_timeout_s)
            with self._lock:
                self.stats.replacements += 1
        self._infos[slot] = info

    def describe(self) -> list[ActorInfo]:
        """Where each slot's actor runs now."""
        return list(self._infos)

    def check(self) -> list[ActorInfo]:
        """Ping every idle actor and bring back any that died while idle; returns `describe()`."""
        ray = _ray()
        with self._freed:
            slots = sorted(self._idle)
            self._idle.clear()
        try:
            for slot in slots:
                try:
                    self._infos[slot] = ray.get(self._actors[slot].describe.remote(), timeout=self.restart_timeout_s)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    self._recover(slot)
        finally:
            for slot in slots:
                self._release(slot)
        return self.describe()

    # ----- evaluations -------------------------------------------------------------------
    def evaluate(self, problem: str, source: str, salt: int | None = None, timeout_s: float | None = None,
                 profile: bool = True, slot: int | None = None) -> tuple[EvalResult, ActorInfo]:
        """Evaluate on the next idle actor (or the one in `slot`, to compare GPUs); the result and
        where it ran. Blocks while the actors are busy."""
        ray = _ray()
        if self._closed:
            raise RuntimeError("the pool is closed")
        if slot is not None and not 0 <= slot < self.size:
            raise ValueError(f"slot must be in 0..{self.size - 1}, not {slot}")
        salt = secrets.randbits(63) if salt is None else salt
        slot = self._acquire(slot)
        try:
            info = self._infos[slot]
            try:
                result, info = ray.get(self._actors[slot].evaluate.remote(problem, source, salt, timeout_s, profile))
                self._infos[slot] = info  # the actor may have been restarted while idle
            except ray.exceptions.RayActorError as exc:
                with self._lock:
                    self.stats.actor_deaths += 1
                result = _actor_died(problem, self.mode, info, exc)
                self._recover(slot)
            with self._lock:
                self.stats.evaluations += 1
            return result, info
        finally:
            self._release(slot)

    def close(self) -> None:
        """Kill the actors (idempotent)."""
        if self._closed:
            return
        self._closed = True
        ray = _ray()
        for actor in self._actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 (already gone)
                pass

    def __enter__(self) -> "EvaluatorPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _actor_died(problem: str, mode: str, info: ActorInfo, exc: BaseException) -> EvalResult:
    """The result of an evaluation whose actor died under it: a crash, charged to the candidate."""
    reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    return EvalResult(problem=problem, mode=mode, compiled=False, correct=False, error=ErrorKind.crash,
                      message=f"the evaluator actor ({info.label()}) died during this evaluation: {reason}. "
                              "A candidate that kills the process evaluating it is graded as a crash; "
                              "the actor was brought back before its next evaluation.")


class PoolEvaluator:
    """The environment's evaluator for one problem, backed by a pool (`EvaluatorPool` or `LocalPool`;
    see `KernelBenchEnv(evaluator=)`).
    `last_actor` is where this thread's last evaluation ran."""

    def __init__(self, pool: EvaluatorPool, problem: str, timeout_s: float | None = None, profile: bool = True):
        self.pool = pool
        self.problem = problem
        self.mode = pool.mode
        self.timeout_s = timeout_s
        self.profile = profile
        self._local = threading.local()

    @property
    def last_actor(self) -> ActorInfo | None:
        return getattr(self._local, "actor", None)

    def evaluate(self, source: str, salt: int | None = None) -> EvalResult:
        result, self._local.actor = self.pool.evaluate(self.problem, source, salt, self.timeout_s, self.profile)
        return result
