"""Parallel rollouts with Ray: one evaluator actor per GPU (CPU mode without one), a built-in
policy, trajectories streamed to a JSON-lines file as episodes finish.

    python examples/ray_rollouts.py [--policy known-good|reference] [--problems softmax rmsnorm]
                                    [--seeds 2] [--max-turns 1] [--actors N] [--out trajectories.jsonl]
                                    [--address auto]

Without --address a local Ray instance is started; `--address auto` joins a running cluster
(every node's GPUs get an actor)."""

from __future__ import annotations

import argparse
from pathlib import Path

import ray
from rich.console import Console
from rich.table import Table

from kb_env.policies import get_policy
from kb_env.problem import all_problems
from kb_env.rollout import EvaluatorPool, Task, rollout, summarize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="known-good", choices=["known-good", "reference"])
    ap.add_argument("--problems", nargs="+", default=["softmax", "rmsnorm"], choices=sorted(all_problems()))
    ap.add_argument("--seeds", type=int, default=1, help="episodes per problem")
    ap.add_argument("--max-turns", type=int, default=1)
    ap.add_argument("--actors", type=int, help="evaluator actors (default: one per GPU; CPU mode: half the CPUs)")
    ap.add_argument("--mode", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--out", type=Path, default=Path("trajectories.jsonl"))
    ap.add_argument("--address", help="a running Ray cluster's address ('auto' finds a local one)")
    args = ap.parse_args()

    ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    console = Console()
    tasks = [Task(problem=p, seed=s) for p in args.problems for s in range(args.seeds)]
    with EvaluatorPool(num_actors=args.actors, mode=args.mode) as pool:
        for info in pool.describe():
            console.print(f"evaluator {info.label()}  {info.gpu_name or ''}")
        table = Table("problem", "seed", "turn", "correct", "error", "reward", "speedup", "actor", "eval s")
        trajs = []
        for traj in rollout(get_policy(args.policy), tasks, pool, max_turns=args.max_turns, out=args.out,
                            progress=True):
            trajs.append(traj)
            for step in traj.steps:
                sp = step.info["speedup"]
                table.add_row(traj.task.problem, str(traj.task.seed), str(step.turn), str(step.info["correct"]),
                              str(step.info["error"]), f"{step.reward:.3f}", "-" if sp is None else f"{sp:.2f}x",
                              f"{step.actor.slot} {step.actor.where}" if step.actor else "-", f"{step.eval_s:.1f}")
            if traj.error:
                console.print(f"[red]{traj.task.problem} seed {traj.task.seed}: {traj.error}")
        console.print(table)
        console.print(f"{summarize(trajs)}  pool: {pool.stats.model_dump()}  trajectories: {args.out}")


if __name__ == "__main__":
    main()
