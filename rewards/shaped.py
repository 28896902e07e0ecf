"""The default, shaped reward.

    flagged (any integrity violation)      0.0   no more than any wrong answer
    compile error                          0.0
    runtime error, timeout, crash          0.1
    mismatch (wrong answer)                0.2
    correct                                1.0
        + PEAK_WEIGHT * min(peak_fraction, 1)                        (GPU only)
        + SPEEDUP_WEIGHT * clip(log2(speedup), -1, 3) / 3            (GPU only)

So a correct kernel earns 0.83 to 2.5, growing with how close it runs to the roofline and
(logarithmically, clipped at 8x) with its speedup over the baseline. In CPU mode timing is not
meaningful: a correct answer earns exactly 1.0.
"""

from __future__ import annotations

import math
from typing import Any

from kb_env.evaluate.result import ErrorKind, EvalResult

from ._result import as_result

FLAGGED = 0.0
COMPILE_ERROR = 0.0
RUNTIME_ERROR = 0.1
MISMATCH = 0.2
CORRECT = 1.0
PEAK_WEIGHT = 1.0
SPEEDUP_WEIGHT = 0.5
SPEEDUP_LOG2_RANGE = (-1.0, 3.0)


def default(result: EvalResult | dict[str, Any]) -> float:
    r = as_result(result)
    if r.flags or r.error is ErrorKind.integrity:
        return FLAGGED
    if not r.correct:
        if r.error is ErrorKind.compile_error:
            return COMPILE_ERROR
        if r.error is ErrorKind.mismatch:
            return MISMATCH
        return RUNTIME_ERROR  # runtime error, timeout, crash (also while loading)
    reward = CORRECT
    if r.timing_meaningful:
        if r.peak_fraction is not None and math.isfinite(r.peak_fraction):
            reward += PEAK_WEIGHT * min(max(r.peak_fraction, 0.0), 1.0)
        if r.speedup is not None and r.speedup > 0 and math.isfinite(r.speedup):
            lo, hi = SPEEDUP_LOG2_RANGE
            reward += SPEEDUP_WEIGHT * min(max(math.log2(r.speedup), lo), hi) / hi
    return reward
