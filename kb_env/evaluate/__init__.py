"""Trusted side of an evaluation: static checks, orchestration of the reference and
candidate workers, correctness, timing statistics, roofline."""

from .evaluator import Evaluator, evaluate
from .result import EvalResult, ErrorKind

__all__ = ["EvalResult", "ErrorKind", "Evaluator", "evaluate"]
