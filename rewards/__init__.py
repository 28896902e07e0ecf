"""Reward functions: pure functions of an evaluation result (`kb_env.EvalResult`, or its dict)
to a float. No GPU, no I/O. `default` is what environments use unless told otherwise."""

from __future__ import annotations

from typing import Callable

from .shaped import default
from .sparse import sparse

RewardFn = Callable[..., float]

REWARDS: dict[str, RewardFn] = {"default": default, "sparse": sparse}


def get_reward(reward: str | RewardFn) -> RewardFn:
    """A reward function by name, or `reward` itself if it is callable."""
    if callable(reward):
        return reward
    if reward not in REWARDS:
        raise ValueError(f"unknown reward {reward!r}; known: {', '.join(sorted(REWARDS))} (or pass a callable)")
    return REWARDS[reward]


__all__ = ["REWARDS", "default", "get_reward", "sparse"]
