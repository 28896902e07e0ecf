"""What a rollout returns: one `Trajectory` per (problem, seed) task, one `StepRecord` per turn."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from pydantic import BaseModel, Field

from .actor import ActorInfo


class Task(BaseModel):
    """One episode to run: a problem, the seed its `reset` gets, and optionally its own turn budget."""

    problem: str
    seed: int = 0
    max_turns: int | None = Field(default=None, ge=1)


class StepRecord(BaseModel):
    """One turn: the action, what the environment answered, and where and how long it took."""

    turn: int
    action: str
    observation: dict[str, Any]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    policy_s: float = Field(description="wall seconds the policy took to answer")
    eval_s: float = Field(description="wall seconds from submitting the action to the environment's answer")
    actor: ActorInfo | None = Field(default=None, description="the evaluator actor (and GPU) that graded it")
    policy_info: dict[str, Any] = Field(default_factory=dict, description="what the agent reports of its turn "
                                        "(`agent.last_info()`: an LLM's prompt, reply, tokens and cost)")


class Trajectory(BaseModel):
    """One episode. `error` is set when it stopped early for a reason that is not the candidate's
    (the policy raised, the harness failed); the turns finished before that are kept."""

    index: int = Field(default=0, description="position of the task in the rollout's task list")
    task: Task
    policy: str
    mode: str
    reset_observation: dict[str, Any]
    reset_info: dict[str, Any]
    steps: list[StepRecord] = Field(default_factory=list)
    error: str | None = None
    budget_spent: bool = Field(default=False, description="it stopped before max_turns: its wall-clock budget ran out")
    wall_s: float = 0.0

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.steps]

    @property
    def best_reward(self) -> float | None:
        return max(self.rewards) if self.steps else None


def append_jsonl(path: Path, trajectory: Trajectory) -> None:
    """Append one trajectory as a JSON line and flush it to disk (a crash loses nothing finished)."""
    with open(path, "a+b") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":  # a line torn by a crash: start on a fresh line, not glued to it
                f.write(b"\n")
        f.write(trajectory.model_dump_json().encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: Path) -> list[Trajectory]:
    """Trajectories written by `append_jsonl`; a torn last line (a crash mid-write) is skipped."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(Trajectory.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValueError):
            continue
    return out


def summarize(trajectories: Iterable[Trajectory]) -> dict[str, Any]:
    """Counts a progress line or a report needs: episodes, steps, correct steps, crashes, errors."""
    trajs = list(trajectories)
    steps = [s for t in trajs for s in t.steps]
    return {"episodes": len(trajs), "steps": len(steps),
            "correct": sum(bool(s.info.get("correct")) for s in steps),
            "crashes": sum(s.info.get("error") == "crash" for s in steps),
            "errors": sum(t.error is not None for t in trajs)}
