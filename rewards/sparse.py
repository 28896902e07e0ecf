"""Sparse reward: 1.0 for a correct, unflagged kernel faster than the baseline, else 0.0.
In CPU mode, where timing is not meaningful, a correct unflagged kernel earns 1.0."""

from __future__ import annotations

from typing import Any

from kb_env.evaluate.result import EvalResult

from ._result import as_result


def sparse(result: EvalResult | dict[str, Any]) -> float:
    r = as_result(result)
    if not r.correct or r.flags or r.error is not None:
        return 0.0
    if not r.timing_meaningful:
        return 1.0
    return 1.0 if r.speedup is not None and r.speedup > 1.0 else 0.0
