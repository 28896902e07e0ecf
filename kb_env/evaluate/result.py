"""What an evaluation returns: `EvalResult` and its parts (pydantic, JSON-serialisable)."""

from __future__ import annotations

import math
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field


class ErrorKind(str, Enum):
    compile_error = "compile_error"
    runtime_error = "runtime_error"
    timeout = "timeout"
    crash = "crash"
    mismatch = "mismatch"
    integrity = "integrity"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Mismatch(_Model):
    """Where and how an output differed from the reference."""

    output: int = Field(description="which output of the forward (0-based)")
    reason: str = Field(description="values | count | shape | dtype | nonfinite | invalid")
    message: str
    index: list[int] | None = Field(default=None, description="first offending element")
    got: float | None = None
    expected: float | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    rel_l2_err: float | None = None
    cosine: float | None = None
    n_bad: int | None = None
    n_total: int | None = None


class CaseCheck(_Model):
    """One graded case: a shape and a seed (its index, never the secret seed itself)."""

    kind: str = Field(description="'grading' (a grading seed) or 'timing' (a timed input set, re-checked)")
    shape: dict[str, int]
    seed_index: int
    ok: bool
    rel_l2_err: float | None = None
    max_abs_err: float | None = None
    mismatch: Mismatch | None = None


class Samples(_Model):
    """Timing samples of one implementation on one shape, in milliseconds."""

    median_ms: float
    p25_ms: float
    p75_ms: float
    min_ms: float
    n: int

    @property
    def rel_spread(self) -> float:
        """Interquartile range over the median."""
        return (self.p75_ms - self.p25_ms) / self.median_ms if self.median_ms > 0 else math.inf

    @classmethod
    def of(cls, values: list[float]) -> "Samples":
        xs = sorted(values)
        q = lambda f: xs[min(len(xs) - 1, max(0, round(f * (len(xs) - 1))))]  # noqa: E731
        return cls(median_ms=q(0.5), p25_ms=q(0.25), p75_ms=q(0.75), min_ms=xs[0], n=len(xs))


class KernelRow(_Model):
    name: str
    launches: int
    total_us: float
    share: float = Field(description="of the call's kernel time")
    own: bool


class KernelReport(_Model):
    """What one profiled call launched (the feedback table and `info`)."""

    launches: int
    total_us: float
    own_share: float = Field(description="share of kernel time in the candidate's own kernels")
    rows: list[KernelRow] = Field(description="the top kernels by time")
    late_kernels: int = Field(0, description="kernels that ran after the call returned or on unjoined streams")
    achieved_gbps: float | None = None
    achieved_tflops: float | None = None
    peak_gbps: float | None = None
    peak_tflops: float | None = None


class ShapeTiming(_Model):
    shape: dict[str, int]
    candidate: Samples
    baseline: Samples
    speedup: float
    flops: float
    bytes: float
    arithmetic_intensity: float = Field(description="FLOPs per byte")
    regime: str | None = Field(default=None, description="'memory-bound' or 'compute-bound' on this GPU")
    peak_fraction: float | None = Field(default=None, description="roofline time over measured time")
    wall_check_ms: float | None = Field(default=None, description="harness wall clock per call, for the timer check")
    baseline_cached: bool = Field(default=False, description="the baseline is this process's kept measurement, "
                                                             "confirmed by a check batch (else timed interleaved)")
    baseline_check_ms: float | None = Field(default=None, description="median of this evaluation's baseline check batch")
    kernels: KernelReport | None = Field(default=None, description="what one profiled call launched (CUDA mode)")


class DeviceInfo(_Model):
    mode: str
    name: str
    hardware_key: str | None = Field(default=None, description="row of the hardware table used for ceilings")
    capability: str | None = None
    uuid: str | None = None
    sm_count: int | None = None
    l2_bytes: int | None = None
    driver: str | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    torch: str
    triton: str | None = None
    python: str


class PerfStats(_Model):
    """How an evaluation's workers started and what the warm caches saved it."""

    candidate_start: str | None = Field(default=None, description="'spare' (started ahead), 'server' (forked from "
                                                                   "the warm server) or 'spawn' (a fresh interpreter)")
    reference_start: str | None = Field(default=None, description="'warm' (kept from an earlier evaluation), "
                                                                   "'server' or 'spawn'")
    reference_uses: int = Field(default=0, description="evaluations the reference worker served before this one")
    import_s: float | None = Field(default=None, description="the candidate worker's own imports (0 when forked)")
    device_s: float | None = Field(default=None, description="CUDA initialization of a spare, done ahead")
    reference_cache_hits: int = 0
    reference_computed: int = 0
    waited_s: float = Field(default=0.0, description="waiting for this process's GPU lock")


class EvalResult(_Model):
    """Everything one evaluation of one candidate found. `error` is None only for a correct,
    unflagged candidate."""

    problem: str
    mode: str
    compiled: bool = False
    correct: bool = False
    error: ErrorKind | None = None
    message: str = Field(default="", description="compiler/runtime error text or mismatch summary")
    flags: list[str] = Field(default_factory=list, description="integrity violations, short names")
    checks: list[CaseCheck] = Field(default_factory=list)
    timings: list[ShapeTiming] = Field(default_factory=list)
    timing_meaningful: bool = False
    runtime_ms: float | None = Field(default=None, description="geometric mean over shapes of the median")
    baseline_ms: float | None = None
    speedup: float | None = Field(default=None, description="geometric mean over shapes")
    peak_fraction: float | None = Field(default=None, description="geometric mean over shapes")
    baseline: str = "eager"
    interface: str = Field(default="forward", description="'forward' (one call) or 'decode' (one step: times are "
                                                          "per token)")
    max_launches: int | None = Field(default=None, description="the kernel launches per call the problem allowed "
                                                               "(None: no cap)")
    torch_ops: list[str] = Field(default_factory=list, description="ATen operators the candidate ran")
    device: DeviceInfo | None = None
    candidate_output: str = Field(default="", description="tail of what the candidate printed")
    wall_s: float = 0.0
    stage_s: dict[str, float] = Field(default_factory=dict, description="wall seconds per stage: waiting (for the "
                                      "GPU lock), starting (workers up, the reference set up), reference, loading, "
                                      "compiling, correctness, timing, baseline, profiling")
    perf: PerfStats | None = Field(default=None, description="worker starts and cache use")

    @property
    def own_kernel_share(self) -> float | None:
        """The smallest share of kernel time in the candidate's own kernels over the profiled shapes."""
        shares = [t.kernels.own_share for t in self.timings if t.kernels is not None]
        return min(shares) if shares else None

    @property
    def kernel_launches(self) -> int | None:
        """The most kernel launches one call made over the profiled shapes."""
        counts = [t.kernels.launches for t in self.timings if t.kernels is not None]
        return max(counts) if counts else None

    @property
    def first_mismatch(self) -> Mismatch | None:
        return next((c.mismatch for c in self.checks if c.mismatch is not None), None)


def geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals or len(vals) != len(values):
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))
