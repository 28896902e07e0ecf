"""`kb sweep`: policies x problems x samples, resumable.

Results go to `<out>/results.jsonl`, one trajectory per line, appended and fsynced as each
episode finishes: a crash or Ctrl-C loses nothing finished, and a rerun skips every
(policy, problem, sample) already there (a line torn by a crash is redone). The sweep's
settings are written beside it as `sweep.json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from .policies import LLMPolicy, ModelConfig, get_policy
from .problem import all_problems, get_problem
from .rollout import EvaluatorPool, LocalPool, Task, Trajectory, read_jsonl, rollout

RESULTS = "results.jsonl"


class SweepConfig(BaseModel):
    """What to run. `policies` are built-in names; `models` are LLM policies."""

    policies: list[str] = Field(default_factory=list)
    models: list[ModelConfig] = Field(default_factory=list)
    problems: list[str] | None = Field(default=None, description="default: every problem")
    samples: int = Field(default=1, ge=1, description="episodes per (policy, problem); the sample is the seed")
    max_turns: int = Field(default=1, ge=1)
    mode: Literal["auto", "cuda", "cpu"] = "auto"
    ray: bool = Field(default=False, description="evaluate on Ray actors (one per GPU) instead of this process")
    actors: int | None = Field(default=None, ge=1)
    concurrency: int | None = Field(default=None, ge=1, description="episodes at once (default: 2 per actor)")

    @model_validator(mode="after")
    def _policies_named_once(self) -> "SweepConfig":
        names = [*self.policies, *(m.name for m in self.models)]
        if not names:
            raise ValueError("a sweep needs at least one policy or model")
        if len(set(names)) != len(names):
            raise ValueError(f"policy and model names must be unique: {names}")
        for name in self.policies:
            get_policy(name)  # an unknown built-in fails here
        return self

    def problem_names(self) -> list[str]:
        names = self.problems or sorted(all_problems())
        for n in names:
            get_problem(n)
        return names


def done_keys(out: Path) -> set[tuple[str, str, int]]:
    """(policy, problem, sample) of every finished episode in `out`."""
    path = out / RESULTS
    return {(t.policy, t.task.problem, t.task.seed) for t in read_jsonl(path)} if path.exists() else set()


def run_sweep(cfg: SweepConfig, out: Path, progress: bool = True) -> list[Trajectory]:
    """Run what is not done yet; returns the trajectories this call added."""
    policies = [get_policy(name) for name in cfg.policies] + [LLMPolicy(m, cfg.max_turns) for m in cfg.models]
    problems = cfg.problem_names()
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(cfg.model_dump_json(indent=1))
    done = done_keys(out)
    added: list[Trajectory] = []
    if cfg.ray:
        import ray

        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        pool = EvaluatorPool(num_actors=cfg.actors, mode=cfg.mode)
    else:
        pool = LocalPool(cfg.mode, cfg.actors or 1)
    with pool:
        for policy in policies:
            todo = [Task(problem=p, seed=s) for p in problems for s in range(cfg.samples)
                    if (policy.name, p, s) not in done]
            if not todo:
                continue
            added += rollout(policy, todo, pool, max_turns=cfg.max_turns, out=out / RESULTS, progress=progress,
                             remote_policy=cfg.ray, concurrency=cfg.concurrency)
    return added


def load_config(path: Path) -> SweepConfig:
    """A sweep (or roster) from a YAML or JSON file."""
    text = Path(path).read_text()
    if str(path).endswith((".yaml", ".yml")):
        import yaml

        return SweepConfig.model_validate(yaml.safe_load(text))
    return SweepConfig.model_validate(json.loads(text))
