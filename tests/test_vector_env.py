"""Gymnasium's own vector environments run kb_env environments (CPU mode): sync, and async with
shared_memory=False (Text observations do not fit shared memory)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import candidate, requires_cpu_mode

import kb_env  # noqa: F401  (registers the environments)

pytestmark = [requires_cpu_mode, pytest.mark.slow]


@pytest.mark.parametrize("mode,vector_kwargs", [("sync", {}), ("async", {"shared_memory": False})])
def test_vector_env_steps_two_candidates(mode, vector_kwargs, softmax_solution):
    envs = gym.make_vec("KernelBench/softmax-v0", num_envs=2, vectorization_mode=mode, vector_kwargs=vector_kwargs,
                        device="cpu", max_turns=1)
    try:
        obs, info = envs.reset(seed=[3, 4])
        assert len(obs["reference"]) == 2 and all("torch.softmax" in r for r in obs["reference"])
        assert list(obs["feedback"]) == ["", ""]
        obs, rewards, terminated, truncated, info = envs.step((softmax_solution, candidate("softmax_zeros")))
        assert rewards.shape == (2,) and rewards[0] > rewards[1]
        assert list(info["correct"]) == [True, False]
        assert info["error"][1] == "mismatch"
        assert np.all(truncated) and not np.any(terminated)  # max_turns=1: both episodes end
        assert "WRONG ANSWER" in obs["feedback"][1] and "NOT meaningful" in obs["feedback"][0]
    finally:
        envs.close()
