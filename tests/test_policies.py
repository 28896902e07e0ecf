"""Built-in policies and the trajectory file: what a rollout's user relies on, without Ray."""

from __future__ import annotations

import pickle

import pytest

from kb_env import get_problem
from kb_env.policies import KnownGoodPolicy, ReferencePolicy, ScriptedPolicy, get_policy
from kb_env.rollout import Task, Trajectory, append_jsonl, read_jsonl


def test_reference_policy_submits_the_reference():
    agent = ReferencePolicy().start("softmax", 0)
    assert agent.act({"turn": 0}) == get_problem("softmax").reference_source()


def test_known_good_policy_submits_solutions_and_repeats_the_last():
    paths = get_problem("rmsnorm").solution_paths
    agent = KnownGoodPolicy().start("rmsnorm", 0)
    sources = [agent.act({}) for _ in range(len(paths) + 2)]
    assert sources[: len(paths)] == [p.read_text() for p in paths]
    assert sources[-1] == paths[-1].read_text()


def test_agents_survive_pickling_with_their_state():
    agent = ScriptedPolicy(default=["a", "b", "c"]).start("softmax", 0)
    assert agent.act({}) == "a"
    clone = pickle.loads(pickle.dumps(agent))  # what a Ray task does with it
    assert clone.act({}) == "b" and clone.act({}) == "c" and clone.act({}) == "c"


def test_bad_policy_input_is_refused():
    with pytest.raises(ValueError, match="unknown policy"):
        get_policy("gpt-9")
    with pytest.raises(ValueError, match="no sources"):
        ScriptedPolicy(script={"rmsnorm": ["x"]}).start("softmax", 0)
    assert get_policy("known-good").name == "known-good"


def test_trajectory_file_keeps_finished_episodes_after_a_torn_write(tmp_path):
    path = tmp_path / "t.jsonl"
    for i in range(3):
        append_jsonl(path, Trajectory(index=i, task=Task(problem="softmax", seed=i), policy="p", mode="cpu",
                                      reset_observation={"turn": 0}, reset_info={}))
    with open(path, "a") as f:
        f.write('{"index": 3, "task": {"probl')  # the process died mid-write
    back = read_jsonl(path)
    assert [t.index for t in back] == [0, 1, 2] and back[2].task.seed == 2


def test_task_validation():
    with pytest.raises(ValueError):
        Task(problem="softmax", max_turns=0)
