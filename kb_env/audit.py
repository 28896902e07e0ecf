"""`kb audit`: one evaluation read as a list of verdicts, one per trust check, so a person can
see which rule a candidate broke (or that it broke none) without reading the whole result."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from .evaluate.result import ErrorKind, EvalResult
from .feedback import explain

Status = Literal["pass", "FAIL", "skip"]

# check name -> (what it covers, the flag prefixes it owns)
CHECKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "imports": ("no forbidden module, at import or at run time", ("forbidden_import:",)),
    "torch ops": ("the dispatcher saw no forbidden or unlisted torch compute op", ("forbidden_op:", "unlisted_op:")),
    "harness": ("timers, synchronization, init functions, torch flags, the harness and its files untouched",
                ("patched:", "torch_flag:", "dispatch_mode_removed", "protocol_violation", "modified_harness_files")),
    "outputs": ("plain tensors, correct on every seed, in-place rewrite, stress and timed call",
                ("tensor_subclass",)),
    "timing": ("reported times agree with the harness's wall clock; no work left on threads",
               ("timer_implausible", "background_thread")),
    "kernels": ("the GPU time is the candidate's own kernels, within the launch cap, all on joined streams",
                ("library_kernels", "too_many_launches", "unjoined_stream", "work_after_return", "profile_failed")),
    "cold cache": ("no persisting-L2 set-aside or access-policy window", ("l2_persistence",)),
    "processes": ("no process left running", ("leftover_process",)),
}


class Verdict(BaseModel):
    check: str
    status: Status
    detail: str


def verdicts(result: EvalResult) -> list[Verdict]:
    """A verdict per check in `CHECKS`, plus whether the candidate ran at all."""
    r = result
    out = []
    ran = r.error not in (ErrorKind.compile_error, ErrorKind.runtime_error, ErrorKind.timeout, ErrorKind.crash)
    out.append(Verdict(check="runs", status="pass" if ran else "FAIL",
                       detail="loaded and ran" if ran else f"{r.error.value}: {r.message.splitlines()[0][:160] if r.message else ''}"))
    for name, (covers, prefixes) in CHECKS.items():
        hits = [f for f in r.flags if f.startswith(prefixes)]
        if hits:
            out.append(Verdict(check=name, status="FAIL", detail="; ".join(f"{f} ({explain(f)})" for f in hits)))
        elif name == "outputs" and r.checks and not r.correct:
            bad = next(c for c in r.checks if not c.ok)
            out.append(Verdict(check=name, status="FAIL", detail=f"{bad.kind} case: {bad.mismatch.message if bad.mismatch else 'mismatch'}"))
        elif name == "outputs" and not r.checks:
            out.append(Verdict(check=name, status="skip", detail="no output was checked"))
        elif name in ("kernels", "cold cache") and r.mode != "cuda":
            out.append(Verdict(check=name, status="skip", detail="needs a GPU (CPU mode runs no kernels)"))
        elif name in ("kernels", "timing") and not r.timings:
            out.append(Verdict(check=name, status="skip", detail="not reached (the candidate failed earlier)"))
        else:
            detail = covers
            if name == "timing" and r.mode != "cuda":
                detail = "no work left on threads (CPU-mode times are not meaningful and not checked)"
            if name == "outputs":
                detail = f"{sum(c.ok for c in r.checks)} of {len(r.checks)} cases passed ({covers})"
            if name == "kernels" and r.own_kernel_share is not None:
                detail = f"{100 * r.own_kernel_share:.0f}% own kernel time, {r.kernel_launches} launches per call"
            out.append(Verdict(check=name, status="pass", detail=detail))
    return out


def render(result: EvalResult) -> str:
    lines = [f"audit of a candidate for {result.problem} ({result.mode} mode)"]
    for v in verdicts(result):
        lines.append(f"  {v.status:<4}  {v.check:<11} {v.detail}")
    flagged = bool(result.flags)
    lines.append("verdict: " + ("FLAGGED" if flagged else "clean" if result.correct else "not flagged, but not correct"))
    return "\n".join(lines)
