"""EvalResult -> the text an agent reads after each step: what went wrong and where, or how
fast the kernel ran against the baseline and the roofline."""

from __future__ import annotations

from .evaluate.kernels import render as render_kernels
from .evaluate.result import ErrorKind, EvalResult

MAX_MESSAGE_CHARS = 6000
MAX_OUTPUT_CHARS = 2000

_HEADLINE = {
    None: "CORRECT",
    ErrorKind.compile_error: "COMPILE ERROR",
    ErrorKind.runtime_error: "RUNTIME ERROR",
    ErrorKind.timeout: "TIMEOUT",
    ErrorKind.crash: "CRASH",
    ErrorKind.mismatch: "WRONG ANSWER",
    ErrorKind.integrity: "INTEGRITY VIOLATION",
}


# The rule behind each flag, by prefix: what the agent is told it broke.
RULES = {
    "forbidden_op:": "the problem forbids this torch operator: write the computation as your own kernel",
    "unlisted_op:": "this torch compute operator is not on the problem's allowlist (only allocation, views and "
                    "copies are free): write the computation as your own kernel",
    "forbidden_import:": "this module is forbidden for this problem (at import or at run time)",
    "patched:": "a function the harness relies on (timers, synchronization, init, the harness itself) was replaced",
    "torch_flag:": "a global torch setting (TF32, reduced precision, default dtype) was changed",
    "timer_implausible": "the reported time is far below the harness's own wall clock",
    "tensor_subclass": "outputs must be plain torch.Tensor objects",
    "dispatch_mode_removed": "the harness's operator recorder was removed",
    "protocol_violation": "the harness's private result channel was written to",
    "modified_harness_files": "files of the problem or the harness were modified on disk",
    "background_thread": "a thread started during a call was still running when it returned: do the work "
                         "inside the call",
    "leftover_process": "a process started by your code was still running: do not leave processes behind",
    "unjoined_stream": "work ran on a stream the call never joined, so the timer could not see it: make the "
                       "current stream wait for your streams before returning",
    "work_after_return": "kernels were launched after the call returned",
    "library_kernels": "most of the GPU time was in torch or vendor-library kernels, not your own",
    "too_many_launches": "more kernel launches per call than this problem allows (CUDA-graph replays count "
                         "kernel by kernel)",
    "l2_persistence": "a persisting-L2 set-aside or access-policy window was set: timing is cold-cache",
    "profile_failed": "the profiled call failed",
}


def explain(flag: str) -> str:
    """The rule a flag names (empty if unknown)."""
    return next((rule for prefix, rule in RULES.items() if flag.startswith(prefix)), "")


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit // 3] + "\n[...]\n" + text[-(2 * limit) // 3:]


def _shape(shape: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in shape.items()) or "(as get_inputs() makes it)"  # {}: fixed sizes


def render(result: EvalResult, turn: int | None = None, max_turns: int | None = None) -> str:
    """A plain-text report, most important first."""
    r = result
    lines: list[str] = []
    where = f" (turn {turn} of {max_turns})" if turn is not None and max_turns is not None else ""
    headline = _HEADLINE[r.error] if not (r.correct and r.error is ErrorKind.integrity) else "CORRECT BUT FLAGGED"
    lines.append(f"# {headline}: {r.problem}, {r.mode} mode{where}")
    lines.append(f"compiled: {'yes' if r.compiled else 'no'}; correct: {'yes' if r.correct else 'no'}")
    if r.flags:
        lines.append("integrity flags (a flagged kernel earns no more than a wrong one):")
        lines += [f"- {flag}: {explain(flag)}" if explain(flag) else f"- {flag}" for flag in r.flags]
        if "too_many_launches" in r.flags and r.kernel_launches is not None:
            per = "step" if r.interface == "decode" else "call"
            lines.append(f"  measured: {r.kernel_launches} kernel launches per {per}; this problem allows "
                         f"{r.max_launches}")
    if r.message and r.error is not ErrorKind.integrity:
        label = {ErrorKind.compile_error: "compiler output", ErrorKind.runtime_error: "error",
                 ErrorKind.mismatch: "first mismatch"}.get(r.error, "details")
        lines += ["", f"## {label}", _clip(r.message, MAX_MESSAGE_CHARS)]
    mm = r.first_mismatch
    if mm is not None and mm.index is not None:
        lines.append(f"at index {mm.index}: got {mm.got!r}, expected {mm.expected!r}"
                     + (f"; {mm.n_bad} of {mm.n_total} elements out of tolerance" if mm.n_bad is not None else ""))
    passed = [c for c in r.checks if c.ok]
    if r.checks:
        lines.append(f"\ncorrectness: {len(passed)} of {len(r.checks)} checked cases passed")
    if r.timings:
        lines += ["", "## timing" + ("" if r.timing_meaningful else
                                     " (CPU mode: Triton interpreter, NOT meaningful; only correctness counts)")]
        decode = r.interface == "decode"
        unit = "ms/token" if decode else "ms"
        lines.append(f"| shape | yours ({unit}) | baseline ({unit}) | speedup | peak fraction | regime |"
                     + (" tok/s |" if decode else ""))
        lines.append("|---|---|---|---|---|---|" + ("---|" if decode else ""))
        for t in r.timings:
            pf = f"{t.peak_fraction:.3f}" if t.peak_fraction is not None else "n/a"
            speedup = f"{t.speedup:.2f}x" if r.timing_meaningful else "n/a"
            tok = f" {1e3 / t.candidate.median_ms:.0f} |" if decode and r.timing_meaningful else (" n/a |" if decode else "")
            lines.append(f"| {_shape(t.shape)} | {t.candidate.median_ms:.4f} ±{t.candidate.rel_spread:.1%} | "
                         f"{t.baseline.median_ms:.4f} | {speedup} | {pf} | {t.regime or 'n/a'} |{tok}")
        if r.timing_meaningful and r.speedup is not None:
            pf = f", peak fraction {r.peak_fraction:.3f}" if r.peak_fraction is not None else ""
            lines.append(f"overall (geometric mean): speedup {r.speedup:.2f}x over the {r.baseline} baseline{pf}")
    for t in r.timings:
        if t.kernels is not None:
            lines += ["", f"## profile ({_shape(t.shape)})", render_kernels(t.kernels)]
    if r.device is not None and r.mode == "cuda":
        lines.append(f"\nGPU: {r.device.name}")
    if r.candidate_output.strip():
        lines += ["", "## what your code printed (not used for grading)", _clip(r.candidate_output, MAX_OUTPUT_CHARS)]
    return "\n".join(lines)
