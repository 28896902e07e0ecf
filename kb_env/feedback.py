"""EvalResult -> the text an agent reads after each step: what went wrong and where, or how
fast the kernel ran against the baseline and the roofline."""

from __future__ import annotations

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


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit // 3] + "\n[...]\n" + text[-(2 * limit) // 3:]


def _shape(shape: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in shape.items()) or "?"


def render(result: EvalResult, turn: int | None = None, max_turns: int | None = None) -> str:
    """A plain-text report, most important first."""
    r = result
    lines: list[str] = []
    where = f" (turn {turn} of {max_turns})" if turn is not None and max_turns is not None else ""
    headline = _HEADLINE[r.error] if not (r.correct and r.error is ErrorKind.integrity) else "CORRECT BUT FLAGGED"
    lines.append(f"# {headline}: {r.problem}, {r.mode} mode{where}")
    lines.append(f"compiled: {'yes' if r.compiled else 'no'}; correct: {'yes' if r.correct else 'no'}")
    if r.flags:
        lines.append("integrity flags (a flagged kernel earns no more than a wrong one): " + ", ".join(r.flags))
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
        lines.append("| shape | yours (ms) | baseline (ms) | speedup | peak fraction | regime |")
        lines.append("|---|---|---|---|---|---|")
        for t in r.timings:
            pf = f"{t.peak_fraction:.3f}" if t.peak_fraction is not None else "n/a"
            speedup = f"{t.speedup:.2f}x" if r.timing_meaningful else "n/a"
            lines.append(f"| {_shape(t.shape)} | {t.candidate.median_ms:.4f} ±{t.candidate.rel_spread:.1%} | "
                         f"{t.baseline.median_ms:.4f} | {speedup} | {pf} | {t.regime or 'n/a'} |")
        if r.timing_meaningful and r.speedup is not None:
            pf = f", peak fraction {r.peak_fraction:.3f}" if r.peak_fraction is not None else ""
            lines.append(f"overall (geometric mean): speedup {r.speedup:.2f}x over the {r.baseline} baseline{pf}")
    if r.device is not None and r.mode == "cuda":
        lines.append(f"\nGPU: {r.device.name}")
    if r.candidate_output.strip():
        lines += ["", "## what your code printed (not used for grading)", _clip(r.candidate_output, MAX_OUTPUT_CHARS)]
    return "\n".join(lines)
