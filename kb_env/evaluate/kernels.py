"""The trusted side's reading of one profiled candidate call (`kb_env.sandbox.kprofile`
records): which kernels ran, whose they were, and whether the call hid work from the timer.

- *own* kernels are the candidate's: launched outside any torch operator and not named like a
  vendor library's (cuBLAS, cuDNN); the rest are *library* kernels;
- ``library_kernels``: the own share of kernel time is under the problem's `min_own_share`;
- ``too_many_launches``: more kernels ran per call than the problem's `max_launches`
  (kernels replayed from a CUDA graph count one by one);
- ``unjoined_stream``: a kernel of the call on another stream began before the fence the harness
  queued on its stream ended (not ordered after the call's start: it can hide under the L2
  flush) or ended after the marker the harness queued when the call returned began (not joined:
  the timer never waits for it);
- ``work_after_return``: kernels launched after the call had returned (a background thread).
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..hardware import GPUSpec
from ..problem import Forbidden
from .result import KernelReport, KernelRow

# Kernel names of vendor libraries a candidate can reach without a torch operator (ctypes,
# an extension linking cuBLAS): counted as library work wherever they were launched from.
_VENDOR = re.compile(r"cublas|cudnn|nvjet|xmma|gemv2|gemmk1|cusparse|cufft|magma", re.IGNORECASE)
MAX_ROWS = 8  # rows of the table kept per call


def _short(name: str) -> str:
    name = re.sub(r"^void\s+", "", name)
    name = re.sub(r"<.*", "<...>", name)  # template arguments
    return name[:80]


def analyze(records: list[dict[str, Any]], rules: Forbidden, flops: float, nbytes: float,
            gpu: GPUSpec | None, compute_dtype: str) -> tuple[KernelReport | None, list[str]]:
    """The report and the flags for one call's kernel records (none recorded: no report)."""
    call = [r for r in records if r.get("when") == "call"]
    marker = next((r for r in records if r.get("when") == "marker"), None)
    fence = next((r for r in records if r.get("when") == "fence"), None)
    after = [r for r in records if r.get("when") == "after"]
    flags: set[str] = set()
    if after:
        flags.add("work_after_return")
    late = list(after)
    if marker is not None and fence is not None:
        begin, end = float(fence["start_us"]) + float(fence["dur_us"]), float(marker["start_us"])
        unjoined = [r for r in call if r.get("stream") != marker.get("stream")
                    and (float(r["start_us"]) < begin or float(r["start_us"]) + float(r["dur_us"]) > end)]
        if unjoined:
            flags.add("unjoined_stream")
            late += unjoined
    kernels = call + after
    if not kernels:
        return None, sorted(flags)
    total = sum(float(r["dur_us"]) for r in kernels) or 1e-9
    rows: dict[tuple[str, bool], list[float]] = {}
    for r in kernels:
        own = r.get("lib") is None and not _VENDOR.search(r["name"])
        rows.setdefault((_short(r["name"]), own), []).append(float(r["dur_us"]))
    own_us = sum(sum(v) for (_, own), v in rows.items() if own)
    table = sorted((KernelRow(name=n, launches=len(v), total_us=sum(v), share=sum(v) / total, own=own)
                    for (n, own), v in rows.items()), key=lambda row: -row.total_us)
    report = KernelReport(launches=len(kernels), total_us=total, own_share=own_us / total, rows=table[:MAX_ROWS],
                          late_kernels=len(late))
    seconds = total * 1e-6
    report.achieved_gbps = nbytes / seconds / 1e9
    report.achieved_tflops = flops / seconds / 1e12
    if gpu is not None:
        report.peak_gbps = gpu.bandwidth() / 1e9
        try:
            report.peak_tflops = gpu.flops_per_s(compute_dtype) / 1e12
        except KeyError:
            pass
    if report.own_share < rules.min_own_share:
        flags.add("library_kernels")
    if rules.max_launches is not None and report.launches > rules.max_launches:
        flags.add("too_many_launches")
    return report, sorted(flags)


def render(report: KernelReport) -> str:
    """A compact table for the agent's observation."""
    lines = [f"kernels of one call: {report.launches} launches, {report.total_us:.1f} us of kernel time, "
             f"{100 * report.own_share:.0f}% in your own kernels"]
    lines.append(f"  {'kernel':<44} {'launches':>8} {'us':>9} {'share':>6}  whose")
    for row in report.rows:
        lines.append(f"  {row.name[:44]:<44} {row.launches:>8} {row.total_us:>9.1f} {100 * row.share:>5.0f}%  "
                     f"{'yours' if row.own else 'library'}")
    if report.achieved_gbps is not None and math.isfinite(report.achieved_gbps):
        gb = f"{report.achieved_gbps:.0f} GB/s" + (f" of {report.peak_gbps:.0f}" if report.peak_gbps else "")
        tf = f"{report.achieved_tflops:.2f} TFLOP/s" + (f" of {report.peak_tflops:.0f}" if report.peak_tflops else "")
        lines.append(f"  over kernel time: {gb}, {tf}")
    if report.late_kernels:
        lines.append(f"  {report.late_kernels} kernel(s) ran after the call returned or on a stream it never joined")
    return "\n".join(lines)
