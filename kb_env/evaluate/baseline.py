"""Baseline timings kept in the harness process, keyed by what they depend on: the GPU (name,
UUID, capability), driver, torch, triton, the problem (its reference and baseline code), the
shape and the timing schedule. Any of those changing is a different key, so a new driver, library
or GPU is measured again; nothing is kept on disk (a candidate runs as the same user and could
rewrite a file to inflate its speedup), so each harness process measures once.

Does a speedup use the cached baseline or a freshly interleaved one? The cached one, confirmed.
The baseline is trusted code: its time on one machine changes only with drift (clocks, heat,
another tenant on the GPU), which is what interleaving baseline and candidate rounds cancels. So
each evaluation times one short batch of the baseline (`CHECK_CALLS` calls, like a round's: fresh
inputs, the L2 flushed, the same process layout) right before the candidate's rounds. If its
median is within `DRIFT` of the cached median, the cached samples stand for the baseline (the
speedup is then within about `DRIFT` of what interleaving would give). If not, the entry is
dropped and this evaluation times the baseline in rounds interleaved with the candidate's, as
without a cache, and stores the result. A co-running evaluation's GPU work (see `Evaluator`'s
`overlap`) moves the check too, and so falls back to interleaving, which cancels it as before."""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

from .result import DeviceInfo, Samples

DRIFT = 0.03  # how far the check batch's median may be from the cached median
CHECK_CALLS = 20  # timed calls in the check batch (fewer if a round has fewer)


def baseline_key(device: DeviceInfo | None, problem: str, sources: list[str | None], baseline: str,
                 shape: dict[str, int], timing: dict[str, int]) -> str:
    """What a baseline's time depends on, as one string."""
    dev = device.model_dump(include={"mode", "name", "uuid", "capability", "sm_count", "driver", "torch", "triton"}) \
        if device else {}
    code = hashlib.sha256("\0".join(s or "" for s in sources).encode()).hexdigest()[:16]
    return json.dumps([dev, problem, code, baseline, sorted(shape.items()),
                       sorted((k, timing[k]) for k in ("warmup", "reps", "rounds"))], sort_keys=True)


class BaselineCache:
    """Samples of the baseline by `baseline_key`; thread-safe."""

    def __init__(self) -> None:
        self._items: dict[str, Samples] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> Samples | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: str, samples: Samples) -> None:
        with self._lock:
            self._items[key] = samples

    def drop(self, key: str) -> None:
        with self._lock:
            self._items.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


def within_drift(check: Samples, cached: Samples, drift: float = DRIFT) -> bool:
    return abs(check.median_ms / cached.median_ms - 1.0) <= drift if cached.median_ms > 0 else False


BASELINES = BaselineCache()  # this process's


def describe(cached: bool, check: Samples | None, stored: Samples | None) -> dict[str, Any]:
    return {"cached": cached, "check_ms": check.median_ms if check else None,
            "cached_ms": stored.median_ms if stored else None}
