"""Synthetic sweep results for board and report tests: trajectories whose steps carry real
`EvalResult`s (through the environment's own `step_info`), shaped like GPU results, so the boards
can be checked against hand-computed figures without a GPU or an evaluation."""

from __future__ import annotations

from typing import Any

from kb_env.env import step_info
from kb_env.evaluate.result import EvalResult, KernelReport, Samples, ShapeTiming
from kb_env.rollout import StepRecord, Task, Trajectory


def _samples(ms: float) -> Samples:
    return Samples(median_ms=ms, p25_ms=ms * 0.99, p75_ms=ms * 1.01, min_ms=ms * 0.98, n=50)


def shape_timing(shape: dict[str, int], candidate_ms: float, baseline_ms: float, launches: int | None = None,
                 peak_fraction: float | None = None) -> ShapeTiming:
    kernels = None if launches is None else KernelReport(launches=launches, total_us=candidate_ms * 1e3, own_share=1.0,
                                                         rows=[])
    return ShapeTiming(shape=shape, candidate=_samples(candidate_ms), baseline=_samples(baseline_ms),
                       speedup=baseline_ms / candidate_ms, flops=1e9, bytes=1e9, arithmetic_intensity=1.0,
                       peak_fraction=peak_fraction, kernels=kernels)


def result(problem: str, *, correct: bool = True, compiled: bool = True, flags: list[str] | None = None,
           error: str | None = None, timings: list[ShapeTiming] | None = None, mode: str = "cuda") -> EvalResult:
    """An EvalResult; speedup and peak_fraction are the geometric means of the timings, as the harness has them."""
    from kb_env.evaluate.result import geomean

    timings = timings or []
    timed = mode == "cuda" and bool(timings)
    flags = flags or []
    if error is None and (not correct or flags):
        error = "integrity" if flags else "mismatch"
    return EvalResult(problem=problem, mode=mode, compiled=compiled, correct=correct, error=error, flags=flags,
                      timings=timings, timing_meaningful=timed,
                      speedup=geomean([t.speedup for t in timings]) if timed and correct else None,
                      peak_fraction=(geomean([t.peak_fraction for t in timings])
                                     if timed and correct and all(t.peak_fraction for t in timings) else None),
                      runtime_ms=geomean([t.candidate.median_ms for t in timings]) if timed else None,
                      baseline_ms=geomean([t.baseline.median_ms for t in timings]) if timed else None)


def step(turn: int, res: EvalResult, *, action: str = "# candidate", reward: float = 0.0,
         usage: dict[str, Any] | None = None, prompt: str = "", reply: str = "") -> StepRecord:
    policy_info = {"prompt": prompt, "reply": reply, "usage": usage} if usage or prompt or reply else {}
    return StepRecord(turn=turn, action=action, observation={"feedback": f"feedback on turn {turn}", "turn": turn},
                      reward=reward, terminated=False, truncated=False, info=step_info(res) | {"turn": turn},
                      policy_s=0.0, eval_s=0.0, policy_info=policy_info)


def trajectory(policy: str, problem: str, level: int | None, steps: list[StepRecord], seed: int = 0,
               mode: str = "cuda", error: str | None = None) -> Trajectory:
    reset_info = {"problem": problem, "mode": mode} | ({} if level is None else {"level": level})
    return Trajectory(task=Task(problem=problem, seed=seed), policy=policy, mode=mode,
                      reset_observation={"turn": 0}, reset_info=reset_info, steps=steps, error=error)


CONTEXTS = (2048, 8192, 16384)


def decode_timings(ms_per_token: tuple[float, ...], baseline_ms: tuple[float, ...], launches: int) -> list[ShapeTiming]:
    """A decode problem's timings: one ShapeTiming per context length, the candidate median being
    the latency of one decode step in ms, `launches` kernel launches per step."""
    return [shape_timing({"context": c}, ms, b, launches) for c, ms, b in zip(CONTEXTS, ms_per_token, baseline_ms)]
