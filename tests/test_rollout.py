"""Parallel rollouts over Ray evaluator actors in CPU mode (two actors, as CI runs them): no
trajectory is lost when a candidate kills its worker or the actor evaluating it, and the pool
comes back to full size."""

from __future__ import annotations

import pytest
from conftest import candidate, requires_cpu_mode

from kb_env.policies import KnownGoodPolicy, ScriptedPolicy
from kb_env.rollout import EvaluatorPool, Task, collect, read_jsonl, rollout

ray = pytest.importorskip("ray")
pytestmark = [requires_cpu_mode, pytest.mark.slow]


@pytest.fixture(scope="module")
def pool():
    ray.init(num_cpus=4, num_gpus=0, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    with EvaluatorPool(num_actors=2, mode="cpu", restart_timeout_s=120) as p:
        yield p
    ray.shutdown()


class _Broken:
    """A policy whose agent raises on its first turn (a failed API call, say)."""

    name = "broken"

    def start(self, problem, seed):
        return self

    def act(self, observation):
        raise ConnectionError("the model's API is down")


def test_actors_are_pinned_to_distinct_slots(pool):
    infos = pool.describe()
    assert [i.slot for i in infos] == [0, 1]
    assert len({i.pid for i in infos}) == 2 and all(i.mode == "cpu" for i in infos)


@pytest.fixture(scope="module")
def killer_rollout(pool, tmp_path_factory):
    """Three episodes on two actors: one whose first candidate kills its actor, one whose first
    candidate kills its own worker process, and an honest one."""
    before = {i.slot: i.pid for i in pool.describe()}
    from kb_env import get_problem

    rmsnorm_solution = get_problem("rmsnorm").solution_paths[0].read_text()
    policy = ScriptedPolicy(script={"rmsnorm": [candidate("kill_evaluator"), rmsnorm_solution],
                                    "softmax": [candidate("segfault")]})
    tasks = [Task(problem="rmsnorm", seed=1), Task(problem="softmax", seed=2)]
    out = tmp_path_factory.mktemp("rollout") / "trajectories.jsonl"
    streamed = list(rollout(policy, tasks, pool, max_turns=2, out=out))
    return before, streamed, out


def test_no_trajectory_is_lost(killer_rollout):
    _, streamed, out = killer_rollout
    assert sorted(t.index for t in streamed) == [0, 1]
    assert all(t.error is None and len(t.steps) == 2 for t in streamed)
    assert [t.task for t in sorted(read_jsonl(out), key=lambda t: t.index)] == [t.task for t in
                                                                                 sorted(streamed, key=lambda t: t.index)]


def test_killing_the_actor_is_a_crash_and_the_actor_comes_back(pool, killer_rollout):
    before, streamed, _ = killer_rollout
    killed = next(t for t in streamed if t.task.problem == "rmsnorm")
    first, second = killed.steps
    assert first.info["error"] == "crash" and not first.info["correct"]
    assert "evaluator actor" in first.info["result"]["message"]
    seg = next(t for t in streamed if t.task.problem == "softmax")
    assert first.reward == seg.steps[0].reward  # graded like the candidate that segfaults
    # The episode went on: the next turn was graded correct by a live actor.
    assert second.info["correct"] and second.reward > first.reward
    assert pool.stats.actor_deaths == 1 and pool.stats.restarts + pool.stats.replacements == 1
    after = pool.describe()
    assert len(after) == pool.size == 2
    dead_slot = first.actor.slot
    assert after[dead_slot].pid != before[dead_slot]


def test_killing_its_own_worker_is_a_crash_on_a_live_actor(pool, killer_rollout):
    _, streamed, _ = killer_rollout
    seg = next(t for t in streamed if t.task.problem == "softmax")
    for step in seg.steps:
        assert step.info["error"] in ("crash", "runtime_error") and not step.info["correct"]
        assert "evaluator actor" not in step.info["result"]["message"]
        assert "SIGSEGV" in step.info["result"]["message"] or "signal" in step.info["result"]["message"]


def test_policy_failure_is_reported_and_others_finish(pool):
    trajs = collect(_Broken(), ["softmax"], pool, max_turns=1, remote_policy=False)
    assert len(trajs) == 1 and trajs[0].steps == []
    assert "ConnectionError" in trajs[0].error and "API is down" in trajs[0].error


def test_known_good_rollout_on_ray_cpu_workers(pool):
    trajs = collect(KnownGoodPolicy(), [("softmax", 0), ("rmsnorm", 0)], pool, max_turns=1)
    assert [t.task.problem for t in trajs] == ["softmax", "rmsnorm"]
    assert all(t.steps[0].info["correct"] and t.steps[0].reward == 1.0 for t in trajs)
    assert all(t.steps[0].actor is not None and t.steps[0].eval_s > 0 for t in trajs)


def test_bad_input_is_refused(pool):
    with pytest.raises(ValueError, match="unknown problem|no problem"):
        list(rollout(KnownGoodPolicy(), ["no_such_problem"], pool))
    with pytest.raises(ValueError, match="max_turns"):
        list(rollout(KnownGoodPolicy(), ["softmax"], pool, max_turns=0))
    with pytest.raises(ValueError, match="no GPUs"):
        EvaluatorPool(mode="cuda")
    with pytest.raises(ValueError, match="mode"):
        EvaluatorPool(mode="tpu")


def test_a_killed_actor_leaves_no_worker_running(pool):
    """The workers of an actor that was shot die with it (they cannot keep a GPU busy under
    the next evaluation): no sandbox worker outlives the killer rollout."""
    import os

    def workers_of(parent: int) -> list[int]:
        """Sandbox workers started by `parent` (their last argument), wherever they are now."""
        out = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if b"kb_env.sandbox.worker" in argv and argv[-2:-1] == [str(parent).encode()]:
                out.append(int(pid))
        return out

    from kb_env import get_problem

    good = get_problem("rmsnorm").solution_paths[0].read_text()
    policy = ScriptedPolicy(script={"rmsnorm": [candidate("kill_evaluator_then_spin"), good]})
    trajs = collect(policy, [Task(problem="rmsnorm", seed=5)], pool, max_turns=2)
    assert trajs[0].steps[0].info["error"] == "crash" and trajs[0].steps[1].info["correct"]
    assert workers_of(trajs[0].steps[0].actor.pid) == []
