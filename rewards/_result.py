"""Accept an EvalResult or its JSON/dict form."""

from __future__ import annotations

from typing import Any

from kb_env.evaluate.result import EvalResult


def as_result(result: EvalResult | dict[str, Any]) -> EvalResult:
    return result if isinstance(result, EvalResult) else EvalResult.model_validate(result)
