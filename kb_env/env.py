"""KernelBenchEnv: one problem as a multi-turn Gymnasium environment.

reset() shows the reference; each step(source) evaluates one candidate in isolated worker
processes and returns the feedback an agent needs to improve it. Episodes end by truncation
after `max_turns` steps."""

from __future__ import annotations

import string
from typing import Any, Callable, Protocol

import gymnasium as gym
from gymnasium import spaces

from rewards import get_reward

from .evaluate.evaluator import Evaluator
from .evaluate.result import EvalResult
from .evaluate.static import MAX_SOURCE_BYTES
from .feedback import render
from .problem import ProblemSpec, get_problem

MAX_TEXT = 1 << 20


class SourceText(spaces.Text):
    """Any Python string up to `max_length` characters (code and compiler output hold any
    character); `sample()` draws printable ASCII."""

    def __init__(self, max_length: int, seed: int | None = None):
        super().__init__(max_length=max_length, min_length=0, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"SourceText(max_length={self.max_length})"


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when a GPU is visible, else 'cpu'. 'cuda' without a GPU is an error."""
    import torch

    if device not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', not {device!r}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no CUDA device is visible; use device='cpu' (CPU mode) or 'auto'")
    return device


def step_info(result: EvalResult) -> dict[str, Any]:
    """The public `info` contract of a step (DESIGN.md), plus the full result as a dict."""
    return {
        "compiled": result.compiled,
        "correct": result.correct,
        "speedup": result.speedup,
        "peak_fraction": result.peak_fraction,
        "runtime_ms": result.runtime_ms,
        "baseline_ms": result.baseline_ms,
        "error": result.error.value if result.error else None,
        "flags": list(result.flags),
        "mode": result.mode,
        "timing_meaningful": result.timing_meaningful,
        "own_kernel_share": result.own_kernel_share,
        "kernel_launches": result.kernel_launches,
        "result": result.model_dump(mode="json"),
    }


class EvaluatesCandidates(Protocol):
    """What the environment needs from an evaluator: a mode and `evaluate(source, salt)`.
    `Evaluator` runs candidates here; `kb_env.rollout.PoolEvaluator` sends them to a Ray actor
    that owns a GPU."""

    mode: str

    def evaluate(self, source: str, salt: int | None = None) -> EvalResult: ...


class KernelBenchEnv(gym.Env):
    """Observation: {reference, feedback, turn}. Action: candidate source. Reward: `reward(result)`."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, problem: str | ProblemSpec, device: str = "auto", max_turns: int = 4,
                 reward: str | Callable[..., float] = "default", timeout_s: float | None = None,
                 render_mode: str | None = None, profile: bool = True, launch_cap: bool = True,
                 evaluator: EvaluatesCandidates | None = None):
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, not {max_turns}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', not {render_mode!r}")
        self.spec_problem = get_problem(problem) if isinstance(problem, str) else problem
        # An injected evaluator (a Ray actor's GPU) decides the mode; `device` is then unused.
        self.mode = evaluator.mode if evaluator is not None else resolve_device(device)
        self.max_turns = max_turns
        self.reward_fn = get_reward(reward)
        self.render_mode = render_mode
        self._owns_evaluator = evaluator is None  # close() ends its warm workers
        self.evaluator = evaluator or Evaluator(self.spec_problem, self.mode, timeout_s, profile=profile,
                                                launch_cap=launch_cap)
        self.reference = self.spec_problem.reference_source()
        self.observation_space = spaces.Dict({
            "reference": SourceText(MAX_TEXT),
            "feedback": SourceText(MAX_TEXT),
            "turn": spaces.Discrete(max_turns + 1),
        })
        self.action_space = SourceText(MAX_SOURCE_BYTES)
        self.turn = 0
        self.last_result: EvalResult | None = None
        self._feedback = ""

    def _obs(self) -> dict[str, Any]:
        return {"reference": self.reference, "feedback": self._feedback, "turn": self.turn}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.turn = 0
        self.last_result = None
        self._feedback = ""
        info = {"problem": self.spec_problem.name, "level": self.spec_problem.level, "mode": self.mode,
                "max_turns": self.max_turns,
                "description": self.spec_problem.description, "shapes": self.spec_problem.shapes_for(self.mode)}
        return self._obs(), info

    def step(self, action: str):
        if self.turn >= self.max_turns:
            raise RuntimeError(f"the episode ended after {self.max_turns} turns; call reset()")
        salt = int(self.np_random.integers(0, 2**63 - 1))  # secret per evaluation; the candidate never sees it
        result = self.evaluator.evaluate(action, salt)
        self.turn += 1
        self.last_result = result
        self._feedback = render(result, self.turn, self.max_turns)
        reward = float(self.reward_fn(result))
        info = step_info(result) | {"turn": self.turn}
        return self._obs(), reward, False, self.turn >= self.max_turns, info

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._feedback
        return None

    def close(self) -> None:
        """End the evaluator's warm workers (an injected evaluator is its owner's to close)."""
        if self._owns_evaluator:
            close = getattr(self.evaluator, "close", None)
            if close is not None:
                close()
        super().close()
