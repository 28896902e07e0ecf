"""Inside a CUDA worker: one candidate call under the torch profiler (CUPTI), reduced to the
kernel records the trusted side judges (`kb_env.evaluate.kernels`).

Just before the call the harness queues a GPU sleep on the current stream (``kb::fence``), so
that the call's work queues behind it; the call runs inside a ``kb::call`` range; right after it
returns the harness launches a one-element marker kernel on the current stream (``kb::marker``),
then waits for the device and a little longer (so late launches from a candidate's threads are
seen). On the GPU, then, work ordered after the call's start begins after the fence ends, and
work the call joined ends before the marker starts. Each GPU kernel is tied to the host call
that launched it through CUPTI's correlation id, which says:

- ``when``: launched during the call, after it returned, or the fence or the marker;
- ``lib``: the torch operator it was launched from (``aten::mm``), if any;
- its stream and GPU start and duration (microseconds)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile, record_function

_sync = torch.cuda.synchronize
_zero = torch.Tensor.zero_
_sleep = time.sleep
_gpu_sleep = torch.cuda._sleep
_LATE_S = 0.05  # how long after the call late launches are still caught
_FENCE_CYCLES = 40_000_000  # about 20 ms of GPU clock: longer than launching a call takes
MAX_RECORDS = 2000


def profile_call(fn: Callable[..., Any], inputs: list[Any], device: str) -> list[dict[str, Any]]:
    """Kernel records of one call of `fn(*inputs)` (see the module docstring)."""
    marker = torch.zeros(1, device=device)
    _sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("kb::fence"):
            _gpu_sleep(_FENCE_CYCLES)
        with record_function("kb::call"):
            fn(*inputs)
        with record_function("kb::marker"):
            _zero(marker)
        _sync()
        _sleep(_LATE_S)
        _sync()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    return kernel_records(trace.get("traceEvents", []))


def kernel_records(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Reduce a Chrome trace (as torch's profiler exports it) to kernel records."""
    ranges = {e["name"]: e for e in events if e.get("cat") == "user_annotation" and e.get("name", "").startswith("kb::")}
    call, mark, fence = ranges.get("kb::call"), ranges.get("kb::marker"), ranges.get("kb::fence")
    if call is None or mark is None or fence is None:
        return []
    ops: dict[Any, list[tuple[float, float, str]]] = {}
    for e in events:
        if e.get("cat") == "cpu_op" and e.get("ph") == "X":
            ops.setdefault(e.get("tid"), []).append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["name"]))
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    out = []
    for e in events:
        if e.get("cat") != "kernel":
            continue
        launch = launches.get(e.get("args", {}).get("correlation"))
        when, lib = "unknown", None
        if launch is not None:
            ts = float(launch["ts"])
            if _inside(ts, mark):
                when = "marker"
            elif _inside(ts, fence):
                when = "fence"
            elif _inside(ts, call):
                when = "call"
            elif ts > float(call["ts"]):
                when = "after"
            else:
                when = "before"
            lib = _innermost_op(ops.get(launch.get("tid"), []), ts)
        out.append({"name": str(e.get("name", ""))[:200], "stream": e.get("args", {}).get("stream"),
                    "start_us": float(e["ts"]), "dur_us": float(e.get("dur", 0)), "when": when, "lib": lib})
        if len(out) >= MAX_RECORDS:
            break
    return out


def _inside(ts: float, rng: dict[str, Any]) -> bool:
    return float(rng["ts"]) <= ts <= float(rng["ts"]) + float(rng.get("dur", 0))


def _innermost_op(intervals: list[tuple[float, float, str]], ts: float) -> str | None:
    best = None
    for start, end, name in intervals:
        if start <= ts <= end and (best is None or start >= best[0]):
            best = (start, name)
    return best[1] if best else None
