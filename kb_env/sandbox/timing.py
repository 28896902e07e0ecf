"""Inside a worker: the timed loop. On CUDA: events around each call, the L2 flushed before
it, inputs rotated over several sets. On the CPU: a wall clock (reported as not meaningful).

Every function used here is bound at import, before any candidate code runs, so a candidate
that replaces `torch.cuda.synchronize` or `Event.elapsed_time` does not change what this
module calls (and the replacement is reported by `integrity`)."""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

_perf_counter = time.perf_counter
_zero = torch.Tensor.zero_
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed = torch.cuda.Event.elapsed_time
_sync = torch.cuda.synchronize

_flush_buffer: torch.Tensor | None = None


def l2_flush_buffer(device: str) -> torch.Tensor:
    """A buffer twice the device's L2, zeroed before every timed call to evict the L2."""
    global _flush_buffer
    if _flush_buffer is None:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20)
        _flush_buffer = torch.empty(2 * l2, dtype=torch.uint8, device=device)
    return _flush_buffer


def time_cuda(fn: Callable[..., Any], input_sets: list[list[Any]], warmup: int, reps: int,
              device: str, call: bool = True) -> tuple[list[float], list[Any]]:
    """Per-call times in ms and the last output produced for each input set. With `call=False`
    only the flush is run and timed (the harness's own overhead, for the wall-clock check)."""
    flush = l2_flush_buffer(device)
    k = len(input_sets)
    for i in range(warmup if call else 0):
        fn(*input_sets[i % k])
    _sync()
    starts = [_Event(enable_timing=True) for _ in range(reps)]
    ends = [_Event(enable_timing=True) for _ in range(reps)]
    last: list[Any] = [None] * k
    for i in range(reps):
        _zero(flush)
        _record(starts[i])
        if call:
            last[i % k] = fn(*input_sets[i % k])
        _record(ends[i])
    _sync()
    return [_elapsed(s, e) for s, e in zip(starts, ends)], last


def time_cpu(fn: Callable[..., Any], input_sets: list[list[Any]], warmup: int, reps: int) -> tuple[list[float], list[Any]]:
    k = len(input_sets)
    for i in range(warmup):
        fn(*input_sets[i % k])
    times, last = [], [None] * k
    for i in range(reps):
        t0 = _perf_counter()
        last[i % k] = fn(*input_sets[i % k])
        times.append((_perf_counter() - t0) * 1e3)
    return times, last
