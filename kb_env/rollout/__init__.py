"""Ray: GPU-pinned evaluator actors and parallel rollouts (see README, "Parallel rollouts")."""

from .actor import ActorInfo, EvaluatorActor
from .local import LocalPool
from .pool import EvaluatorPool, PoolEvaluator, PoolStats
from .rollout import collect, rollout
from .trajectory import StepRecord, Task, Trajectory, append_jsonl, read_jsonl, summarize

__all__ = ["ActorInfo", "EvaluatorActor", "EvaluatorPool", "LocalPool", "PoolEvaluator", "PoolStats", "collect", "rollout",
           "StepRecord", "Task", "Trajectory", "append_jsonl", "read_jsonl", "summarize"]
