"""The multi-turn episode in CPU mode: each kind of answer gets the right info and the
reward ordering compile error < wrong answer < correct, with flagged answers no better
than wrong ones."""

from __future__ import annotations

import gymnasium as gym
import pytest
from conftest import candidate, requires_cpu_mode

import kb_env  # noqa: F401  (registers the environments)

pytestmark = requires_cpu_mode

SYNTAX_ERROR = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x)\n        return x\n"


@pytest.fixture(scope="module")
def episode(softmax_solution):
    """One 5-turn episode on softmax: syntax error, wrong kernel, known-good, zeros, torch op."""
    env = gym.make("KernelBench/softmax-v0", device="cpu", max_turns=5)
    obs0, info0 = env.reset(seed=123)
    steps = [env.step(src) for src in (SYNTAX_ERROR, candidate("softmax_wrong"), softmax_solution,
                                      candidate("softmax_zeros"), candidate("torch_softmax"))]
    env.close()
    return obs0, info0, steps


def test_reset_observation(episode):
    obs, info, _ = episode
    assert "class Model" in obs["reference"] and "torch.softmax" in obs["reference"]
    assert obs["feedback"] == "" and obs["turn"] == 0
    assert info["mode"] == "cpu" and info["problem"] == "softmax"


def test_syntax_error_is_a_compile_error(episode):
    obs, reward, terminated, truncated, info = episode[2][0]
    assert info["compiled"] is False and info["correct"] is False
    assert info["error"] == "compile_error"
    assert "SyntaxError" in obs["feedback"] and "line 3" in obs["feedback"]
    assert obs["turn"] == 1 and not terminated and not truncated


def test_wrong_kernel_is_a_mismatch_with_location(episode):
    obs, reward, _, _, info = episode[2][1]
    assert info["compiled"] is True and info["correct"] is False
    assert info["error"] == "mismatch"
    mm = info["result"]["checks"][0]["mismatch"]
    assert mm["index"] is not None and mm["got"] is not None and mm["expected"] is not None
    assert "WRONG ANSWER" in obs["feedback"] and "expected" in obs["feedback"]


def test_known_good_solution_is_correct(episode):
    obs, reward, _, _, info = episode[2][2]
    assert info["compiled"] and info["correct"] and info["error"] is None and info["flags"] == []
    assert info["mode"] == "cpu"
    # CPU mode: timing is not meaningful, so no speedup or peak fraction is claimed.
    assert info["timing_meaningful"] is False and info["speedup"] is None and info["peak_fraction"] is None
    assert info["runtime_ms"] is not None and info["baseline_ms"] is not None
    assert "NOT meaningful" in obs["feedback"]
    checks = info["result"]["checks"]
    assert all(c["ok"] for c in checks)
    assert {c["kind"] for c in checks} == {"grading", "stress", "timing"}  # stress case run, timed outputs re-checked


def test_all_zeros_is_rejected(episode):
    _, reward, _, _, info = episode[2][3]
    assert info["correct"] is False and info["error"] == "mismatch"
    assert "relative L2" in info["result"]["message"] or "outside" in info["result"]["message"]


def test_torch_op_instead_of_kernel_is_flagged(episode):
    _, reward, _, _, info = episode[2][4]
    assert info["correct"] is True  # right values ...
    assert info["error"] == "integrity"  # ... but not a kernel
    assert "forbidden_op:aten::_softmax" in info["flags"]


def test_reward_ordering(episode):
    rewards = [step[1] for step in episode[2]]
    syntax, wrong, good, zeros, flagged = rewards
    assert syntax < wrong < good
    assert zeros <= wrong < good
    assert flagged <= wrong
    assert good == pytest.approx(1.0)  # CPU mode: correctness terms only


def test_episode_truncates_after_max_turns(episode, softmax_solution):
    assert [s[3] for s in episode[2]] == [False, False, False, False, True]
    env = gym.make("KernelBench/softmax-v0", device="cpu", max_turns=1)
    env.reset(seed=0)
    *_, truncated, _ = env.step(SYNTAX_ERROR)
    assert truncated
    with pytest.raises(RuntimeError, match="reset"):
        env.step(SYNTAX_ERROR)


def test_reset_starts_a_new_episode(softmax_solution):
    env = gym.make("KernelBench/softmax-v0", device="cpu", max_turns=1)
    env.reset(seed=0)
    env.step(SYNTAX_ERROR)
    obs, _ = env.reset(seed=1)
    assert obs["turn"] == 0 and obs["feedback"] == ""


def test_check_env_passes():
    from gymnasium.utils.env_checker import check_env

    env = gym.make("KernelBench/softmax-v0", device="cpu", max_turns=3)
    check_env(env.unwrapped, skip_render_check=True)


def test_every_problem_is_registered():
    for name in kb_env.all_problems():
        assert f"KernelBench/{name}-v0" in gym.registry


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="device"):
        gym.make("KernelBench/softmax-v0", device="tpu")
    with pytest.raises(ValueError, match="max_turns"):
        gym.make("KernelBench/softmax-v0", device="cpu", max_turns=0)
    with pytest.raises(ValueError, match="unknown reward"):
        gym.make("KernelBench/softmax-v0", device="cpu", reward="nope")


def test_custom_reward_callable(softmax_solution):
    env = gym.make("KernelBench/softmax-v0", device="cpu", reward=lambda r: 42.0 if r.correct else -1.0)
    env.reset(seed=0)
    assert env.step(SYNTAX_ERROR)[1] == -1.0
