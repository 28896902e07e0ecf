"""The pool interface without Ray: evaluations run from this process (in its worker
subprocesses), `size` at once. For one machine, CPU mode and tests; on a GPU keep size 1 so
that two timings never share it (`EvaluatorPool` is the multi-GPU path)."""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

from ..env import resolve_device
from ..evaluate.evaluator import Evaluator
from ..evaluate.result import EvalResult
from ..problem import get_problem
from .actor import ActorInfo
from .pool import PoolStats


class LocalPool:
    """Same `evaluate`/`describe`/`close` as `EvaluatorPool`; see the module docstring."""

    def __init__(self, mode: str = "auto", size: int = 1):
        self.mode = resolve_device(mode)
        if size < 1:
            raise ValueError(f"size must be at least 1, not {size}")
        if self.mode == "cuda" and size > 1:
            raise ValueError("a local pool times on one GPU: size must be 1 in CUDA mode (use EvaluatorPool for more)")
        self.size = size
        self.stats = PoolStats()
        self._slots = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._evaluators: dict[tuple[str, float | None, bool], Evaluator] = {}
        self._info = ActorInfo(slot=0, mode=self.mode, host=socket.gethostname(), pid=os.getpid(),
                               cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))

    def _evaluator(self, problem: str, timeout_s: float | None, profile: bool) -> Evaluator:
        key = (problem, timeout_s, profile)
        with self._lock:
            if key not in self._evaluators:
                self._evaluators[key] = Evaluator(get_problem(problem), self.mode, timeout_s, profile=profile)
            return self._evaluators[key]

    def evaluate(self, problem: str, source: str, salt: int | None = None, timeout_s: float | None = None,
                 profile: bool = True, slot: int | None = None) -> tuple[EvalResult, ActorInfo]:
        evaluator = self._evaluator(problem, timeout_s, profile)
        with self._slots:
            result = evaluator.evaluate(source, salt)
        with self._lock:
            self.stats.evaluations += 1
        return result, self._info

    def describe(self) -> list[ActorInfo]:
        return [self._info]

    def close(self) -> None:
        """End the evaluators' warm workers."""
        with self._lock:
            evaluators, self._evaluators = list(self._evaluators.values()), {}
        for ev in evaluators:
            ev.close()

    def __enter__(self) -> "LocalPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
