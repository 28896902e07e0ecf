"""`kb sweep`: policies x problems x samples, resumable.

Results go to `<out>/results.jsonl`, one trajectory per line, appended and fsynced as each
episode finishes: a crash or Ctrl-C loses nothing finished, and a rerun skips every
(policy, problem, sample) already there (a line torn by a crash is redone). The sweep's
settings are written beside it as `sweep.json`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .policies import LLMPolicy, ModelConfig, get_policy
from .problem import ProblemError, all_problems, get_problem
from .rollout import EvaluatorPool, LocalPool, Task, Trajectory, read_jsonl, rollout

RESULTS = "results.jsonl"


class SweepConfig(BaseModel):
    """What to run. `policies` are built-in names; `models` are LLM policies. A roster (rosters/*.yaml)
    is one of these written down: `name` and `about` say which published sweep it reproduces."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, description="a label for the sweep (a roster's name)")
    about: str | None = Field(default=None, description="what the sweep reproduces and where its settings come from")
    policies: list[str] = Field(default_factory=list)
    models: list[ModelConfig] = Field(default_factory=list)
    problems: list[str] | None = Field(default=None, description="default: every problem (in CPU mode, every one "
                                       "with CPU shapes)")
    levels: list[int] | None = Field(default=None, description="only problems of these levels (1-4)")
    samples: int = Field(default=1, ge=1, description="episodes per (policy, problem); the sample is the seed")
    max_turns: int = Field(default=1, ge=1, description="turns per episode, unless turns_by_level names the level")
    turns_by_level: dict[int, int] = Field(default_factory=dict, description="turns per episode by problem level, "
                                           "e.g. {1: 10, 2: 12, 3: 15, 4: 15} (KernelBench-v3)")
    budget_s: float | None = Field(default=None, gt=0, description="wall-clock seconds per episode (policy and "
                                   "evaluations together): no new turn starts after it")
    mode: Literal["auto", "cuda", "cpu"] = "auto"
    ray: bool = Field(default=False, description="evaluate on Ray actors (one per GPU) instead of this process")
    actors: int | None = Field(default=None, ge=1)
    concurrency: int | None = Field(default=None, ge=1, description="episodes at once (default: 2 per actor)")

    @field_validator("levels")
    @classmethod
    def _known_levels(cls, levels: list[int] | None) -> list[int] | None:
        if levels is not None and (not levels or any(lv not in (1, 2, 3, 4) for lv in levels)):
            raise ValueError(f"levels must name levels 1 to 4, not {levels}")
        return levels

    @field_validator("turns_by_level")
    @classmethod
    def _turn_budgets(cls, turns: dict[int, int]) -> dict[int, int]:
        for level, n in turns.items():
            if level not in (1, 2, 3, 4) or n < 1:
                raise ValueError(f"turns_by_level maps levels 1-4 to at least one turn, not {level}: {n}")
        return turns

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

    def only(self, names: list[str]) -> "SweepConfig":
        """The same sweep with only the named policies and models (a roster's subset)."""
        known = [*self.policies, *(m.name for m in self.models)]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"not in this sweep: {', '.join(unknown)}; it has: {', '.join(known)}")
        return self.model_copy(update={"policies": [p for p in self.policies if p in names],
                                       "models": [m for m in self.models if m.name in names]})

    def check_keys(self) -> None:
        """Every model's API key is set (RuntimeError naming the variable otherwise)."""
        for m in self.models:
            m.key()

    def turns_for(self, problem: str) -> int:
        """The turn budget of one problem's episodes."""
        return self.turns_by_level.get(get_problem(problem).level, self.max_turns)

    def problem_names(self) -> list[str]:
        """The problems to run. Named problems must exist (and, in CPU mode, have CPU shapes); without
        names, every problem of the chosen levels, leaving out GPU-only ones in CPU mode."""
        from .env import resolve_device

        cpu = resolve_device(self.mode) == "cpu"
        if self.problems:
            specs = [get_problem(n) for n in self.problems]
            for spec in specs:
                if cpu and spec.gpu_only:
                    raise ProblemError(f"{spec.name} is GPU-only (it declares no CPU shapes); sweep it in CUDA mode")
        else:
            specs = [s for _, s in sorted(all_problems().items()) if not (cpu and s.gpu_only)]
        names = [s.name for s in specs if self.levels is None or s.level in self.levels]
        if not names:
            raise ProblemError(f"no problem to sweep (levels {self.levels}, {'CPU' if cpu else 'CUDA'} mode)")
        return names


def done_keys(out: Path) -> set[tuple[str, str, int]]:
    """(policy, problem, sample) of every finished episode in `out`."""
    path = out / RESULTS
    return {(t.policy, t.task.problem, t.task.seed) for t in read_jsonl(path)} if path.exists() else set()


def run_sweep(cfg: SweepConfig, out: Path, progress: bool = True) -> list[Trajectory]:
    """Run what is not done yet; returns the trajectories this call added. A policy that cannot play a
    problem (known-good on a problem without solutions) skips it, and the sweep says so on stderr."""
    policies = ([get_policy(name) for name in cfg.policies]
                + [LLMPolicy(m, cfg.max_turns, cfg.turns_by_level, cfg.budget_s) for m in cfg.models])
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
            playable = [p for p in problems if _plays(policy, p)]
            todo = [Task(problem=p, seed=s, max_turns=cfg.turns_for(p)) for p in playable for s in range(cfg.samples)
                    if (policy.name, p, s) not in done]
            if not todo:
                continue
            added += rollout(policy, todo, pool, max_turns=cfg.max_turns, out=out / RESULTS, progress=progress,
                             remote_policy=cfg.ray, concurrency=cfg.concurrency, budget_s=cfg.budget_s)
    return added


def _plays(policy, problem: str) -> bool:
    reason = policy.skip_reason(problem) if hasattr(policy, "skip_reason") else None
    if reason:
        print(f"kb sweep: {policy.name} skips {problem}: {reason}", file=sys.stderr)
    return reason is None


def load_config(path: Path) -> SweepConfig:
    """A sweep (or roster) from a YAML or JSON file. Top-level keys starting with `x-` are YAML
    anchors' homes (shared model settings) and are dropped before validation."""
    text = Path(path).read_text()
    if str(path).endswith((".yaml", ".yml")):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of sweep settings at the top level")
    return SweepConfig.model_validate({k: v for k, v in data.items() if not str(k).startswith("x-")})
