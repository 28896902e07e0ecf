"""Parallel rollouts: episodes over a pool of GPU-pinned evaluators, policies on CPU workers.

Each episode is a `KernelBenchEnv` in this (driver) process whose evaluator is the pool, so
rewards, feedback and truncation are exactly the environment's. Episodes run in threads: while
one waits for its policy (a Ray task on a CPU worker, `num_gpus=0`) another's candidate is
being timed, so the GPUs stay busy. Trajectories stream out as episodes finish."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable

from ..env import KernelBenchEnv
from ..policies.base import Agent, Policy
from ..problem import get_problem
from .local import LocalPool
from .pool import EvaluatorPool, PoolEvaluator
from .trajectory import StepRecord, Task, Trajectory, append_jsonl, summarize

AnyPool = EvaluatorPool | LocalPool  # Ray actors, or evaluations from this process


def _act(agent: Agent, observation: dict[str, Any]) -> tuple[str, Agent]:
    """One policy turn, run wherever Ray puts it; the agent comes back with its new state."""
    return agent.act(observation), agent


class _PolicyRunner:
    """Runs agents' turns as Ray tasks on CPU workers (or here, with `remote=False`)."""

    def __init__(self, remote: bool, cpus: float):
        self.remote = remote
        if remote:
            import ray

            self._task = ray.remote(_act).options(num_cpus=cpus, num_gpus=0, max_retries=0)

    def act(self, agent: Agent, observation: dict[str, Any]) -> tuple[str, Agent]:
        if not self.remote:
            return _act(agent, observation)
        import ray

        return ray.get(self._task.remote(agent, observation))


def _tasks(tasks: Iterable[Task | tuple[str, int] | str]) -> list[Task]:
    out = []
    for t in tasks:
        task = t if isinstance(t, Task) else Task(problem=t) if isinstance(t, str) else Task(problem=t[0], seed=t[1])
        get_problem(task.problem)  # an unknown problem fails here, before any episode starts
        out.append(task)
    return out


def _episode(index: int, task: Task, policy: Policy, runner: _PolicyRunner, pool: AnyPool, max_turns: int,
             reward: str | Callable[..., float], timeout_s: float | None, profile: bool,
             stop: threading.Event, budget_s: float | None = None) -> Trajectory:
    started = time.monotonic()
    evaluator = PoolEvaluator(pool, task.problem, timeout_s, profile)
    env = KernelBenchEnv(task.problem, max_turns=task.max_turns or max_turns, reward=reward, evaluator=evaluator)
    obs, info = env.reset(seed=task.seed)
    traj = Trajectory(index=index, task=task, policy=policy.name, mode=env.mode, reset_observation=obs, reset_info=info)
    try:
        agent = policy.start(task.problem, task.seed)
        while not stop.is_set():
            if budget_s is not None and time.monotonic() - started >= budget_s:
                traj.budget_spent = True  # no new turn after the episode's wall-clock budget
                break
            t0 = time.monotonic()
            action, agent = runner.act(agent, obs)
            t1 = time.monotonic()
            policy_info = agent.last_info() if hasattr(agent, "last_info") else {}
            obs, r, terminated, truncated, info = env.step(action)
            traj.steps.append(StepRecord(turn=obs["turn"], action=action, observation=obs, reward=r,
                                         terminated=terminated, truncated=truncated, info=info,
                                         policy_s=t1 - t0, eval_s=time.monotonic() - t1,
                                         actor=evaluator.last_actor, policy_info=policy_info))
            if terminated or truncated:
                break
        else:
            traj.error = "stopped: the rollout was interrupted"
    except Exception as exc:  # noqa: BLE001 (the policy or the harness failed: keep what finished)
        traj.error = f"{type(exc).__name__}: {exc}"[:2000]
    traj.wall_s = time.monotonic() - started
    return traj


def rollout(policy: Policy, tasks: Iterable[Task | tuple[str, int] | str], pool: AnyPool, *,
            max_turns: int = 4, reward: str | Callable[..., float] = "default", timeout_s: float | None = None,
            profile: bool = True, concurrency: int | None = None, remote_policy: bool | None = None,
            policy_cpus: float = 0.0, out: Path | None = None, progress: bool = False,
            budget_s: float | None = None) -> Iterator[Trajectory]:
    """Run one episode per task over `pool` and yield trajectories as they finish.

    `concurrency` episodes run at once (default: twice the pool's size, so a GPU is never idle
    while a policy thinks). The policy's turns run as Ray tasks on CPU workers (`remote_policy`;
    default: with an `EvaluatorPool`, not with a `LocalPool`; `policy_cpus` each, 0 suits
    policies that wait on an API). With `out`, each trajectory is
    appended to that JSON-lines file as it finishes. With `budget_s`, an episode starts no new turn
    once that many wall seconds have passed since its reset (`traj.budget_spent`); the turn under
    way finishes. Ctrl-C stops new turns and re-raises."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, not {max_turns}")
    if budget_s is not None and budget_s <= 0:
        raise ValueError(f"budget_s must be positive, not {budget_s}")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    todo = _tasks(tasks)
    workers = concurrency or 2 * pool.size
    remote = isinstance(pool, EvaluatorPool) if remote_policy is None else remote_policy
    runner = _PolicyRunner(remote, policy_cpus)
    stop = threading.Event()
    bar = _Progress(len(todo), policy.name, pool) if progress else None
    done: list[Trajectory] = []
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kb-episode") as ex:
        pending: set[Future] = {ex.submit(_episode, i, t, policy, runner, pool, max_turns, reward, timeout_s,
                                          profile, stop, budget_s) for i, t in enumerate(todo)}
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    traj = fut.result()
                    if out is not None:
                        append_jsonl(Path(out), traj)
                    done.append(traj)
                    if bar:
                        bar.update(done)
                    yield traj
        except BaseException:
            stop.set()
            for fut in pending:
                fut.cancel()
            raise
        finally:
            if bar:
                bar.close()


def collect(policy: Policy, tasks: Iterable[Task | tuple[str, int] | str], pool: AnyPool,
            **kwargs: Any) -> list[Trajectory]:
    """`rollout` gathered into a list, in task order."""
    return sorted(rollout(policy, tasks, pool, **kwargs), key=lambda t: t.index)


class _Progress:
    """A rich progress bar with episodes done, ETA and running counts."""

    def __init__(self, total: int, policy: str, pool: AnyPool):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn

        self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[counts]}"))
        self._pool = pool
        self._task = self._bar.add_task(f"{policy} on {pool.size} {pool.mode} actor(s)", total=total, counts="")
        self._bar.start()

    def update(self, done: list[Trajectory]) -> None:
        s = summarize(done)
        counts = (f"steps {s['steps']}  correct {s['correct']}  crashes {s['crashes']}  "
                  f"episode errors {s['errors']}  actors restarted {self._pool.stats.restarts + self._pool.stats.replacements}")
        self._bar.update(self._task, completed=len(done), counts=counts)

    def close(self) -> None:
        self._bar.stop()
