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


def time_cuda(fn: Callable[..., Any], make: Callable[[int], list[Any]], seeds: list[int], warmup: int,
              keep: int, device: str, call: bool = True) -> tuple[list[float], list[Any]]:
    """Per-call times in ms of the calls after the first `warmup` (one call per seed, each on
    inputs freshly drawn by `make(seed)`, so no two calls see the same content), and the
    outputs of the last `keep` calls. With `call=False` the inputs are drawn and the L2 is
    flushed but nothing is called (the harness's own overhead, for the wall-clock check)."""
    flush = l2_flush_buffer(device)
    for seed in seeds[:warmup] if call else ():
        fn(*make(seed))
    _sync()
    timed = seeds[warmup:]
    starts = [_Event(enable_timing=True) for _ in timed]
    ends = [_Event(enable_timing=True) for _ in timed]
    last: list[Any] = []
    for i, seed in enumerate(timed):
        inputs = make(seed)
        _zero(flush)
        _record(starts[i])
        out = fn(*inputs) if call else None
        _record(ends[i])
        if i >= len(timed) - keep:
            last.append(out)
        del inputs, out
    _sync()
    return [_elapsed(s, e) for s, e in zip(starts, ends)], last


def time_cpu(fn: Callable[..., Any], make: Callable[[int], list[Any]], seeds: list[int], warmup: int,
             keep: int) -> tuple[list[float], list[Any]]:
    """The CPU-mode counterpart of `time_cuda` (wall clock per call; not meaningful as a kernel time)."""
    for seed in seeds[:warmup]:
        fn(*make(seed))
    timed = seeds[warmup:]
    times, last = [], []
    for i, seed in enumerate(timed):
        inputs = make(seed)
        t0 = _perf_counter()
        out = fn(*inputs)
        times.append((_perf_counter() - t0) * 1e3)
        if i >= len(timed) - keep:
            last.append(out)
    return times, last


def time_decode(step: Callable[..., Any], make: Callable[[int], list[Any]], seeds: list[int], warmup: int,
                steps: int, device: str, keep: bool, call: bool = True,
                snapshot: Callable[[Any], Any] | None = None) -> tuple[list[float], list[Any]]:
    """Per-step times in ms of decode runs: one run per seed (inputs ``[hidden, state]`` freshly
    drawn by `make(seed)`), `steps` chained steps each (a step's returned state is the next one's),
    the first `warmup` runs untimed. On CUDA: events around each step, the L2 flushed before it.

    After every step the returned tensors are copied (`snapshot`, outside the timed region, in every
    run alike, so no run looks different from another); with `keep`, the last run's copies after
    its first step, before its last step and after it are returned (the trusted side checks the
    first against a reference from the same fresh state, and the last against a reference step
    from the candidate's own state before it). With `call=False` nothing is called (the harness's
    own overhead: fresh inputs and flushes, for the wall-clock check)."""
    cuda = device != "cpu"
    flush = l2_flush_buffer(device) if cuda else None
    times: list[float] = []
    kept: list[Any] = []
    for r, seed in enumerate(seeds):
        hidden, state = make(seed)
        last = keep and r == len(seeds) - 1
        starts = [_Event(enable_timing=True) for _ in range(steps)] if cuda else []
        ends = [_Event(enable_timing=True) for _ in range(steps)] if cuda else []
        walls: list[float] = []
        for s in range(steps):
            if cuda:
                _zero(flush)
                _record(starts[s])
            t0 = _perf_counter()
            if call:
                hidden, state = step(hidden, state)
            if cuda:
                _record(ends[s])
            else:
                walls.append((_perf_counter() - t0) * 1e3)
            copy = snapshot((hidden, state)) if call and snapshot is not None else None
            if last and s in {0, steps - 2, steps - 1}:
                kept.append((s, copy))
        if cuda:
            _sync()
            walls = [_elapsed(a, b) for a, b in zip(starts, ends)]
        if r >= warmup:
            times += walls
        del hidden, state
    out = []
    if keep:
        by_step = dict(kept)
        out = [by_step[0], by_step[steps - 2], by_step[steps - 1]]
    return times, out
