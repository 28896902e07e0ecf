"""Ray rollouts on every GPU: actor pinning, health after faults, evaluations per minute on 1
GPU and on all of them, and the same candidate's time on each GPU.

    python benchmarks/ray_scaling.py [--phases pinning health rollout single spread]
                                     [--seeds 2] [--problems ...] [--mode auto|cuda|cpu] [--out results.json]

Phases:
  pinning  each actor's GPU (Ray's id, CUDA_VISIBLE_DEVICES, UUID): all must differ
  health   on the last slot: an illegal-memory candidate, then a known-good one (the next
           candidate must see a healthy GPU); a candidate that kills its actor, then a known-good
           one (the slot comes back, on the same GPU)
  rollout  known-good and reference policies over the problems x seeds, one actor per GPU
  single   the same workload on a pool of one actor (evaluations per minute on 1 GPU)
  spread   each problem's known-good solution evaluated on every slot: runtime per GPU
Prints a table last; writes everything to --out."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kb_env import get_problem  # noqa: E402
from kb_env.policies import KnownGoodPolicy, ReferencePolicy  # noqa: E402
from kb_env.rollout import EvaluatorPool, Task, collect, summarize  # noqa: E402

PROBLEMS = ["softmax", "rmsnorm", "gemm_bias_gelu"]
PHASES = ["pinning", "health", "rollout", "single", "spread"]  # the order they run in


def _candidate(name: str) -> str:
    return (ROOT / "tests" / "candidates" / f"{name}.py").read_text()


def _short(result) -> str:
    return "correct" if result.correct and not result.flags else f"{result.error.value if result.error else '-'}"


def pinning(pool: EvaluatorPool) -> dict:
    infos = pool.describe()
    for i in infos:
        print(f"  slot {i.slot}: ray gpu {i.gpu_ids}  CUDA_VISIBLE_DEVICES={i.cuda_visible_devices}  "
              f"{i.gpu_name}  {i.gpu_uuid}  pid {i.pid}")
    ids = [i.gpu_uuid or ",".join(i.gpu_ids) or f"cpu-slot-{i.slot}" for i in infos]
    return {"actors": [i.model_dump() for i in infos], "distinct": len(set(ids)) == len(ids)}


def health(pool: EvaluatorPool) -> dict:
    slot = pool.size - 1
    good = get_problem("softmax").solution_paths[0].read_text()
    rows = []
    for name, source in [("illegal_memory", _candidate("illegal_memory")), ("known_good", good),
                         ("kill_evaluator", _candidate("kill_evaluator")), ("known_good", good)]:
        result, info = pool.evaluate("softmax", source, slot=slot)
        after = pool.describe()[slot]
        rows.append({"candidate": name, "outcome": _short(result), "message": result.message[:200],
                     "pid_before": info.pid, "pid_after": after.pid, "gpu_before": info.gpu_uuid,
                     "gpu_after": after.gpu_uuid})
        print(f"  {name:15s} -> {_short(result):14s} actor pid {info.pid} -> {after.pid}  "
              f"GPU {info.gpu_uuid} -> {after.gpu_uuid}")
    return {"slot": slot, "rows": rows, "stats": pool.stats.model_dump()}


def workload(pool: EvaluatorPool, problems: list[str], seeds: int) -> dict:
    tasks = [Task(problem=p, seed=s) for p in problems for s in range(seeds)]
    started = time.monotonic()
    with ThreadPoolExecutor(2) as ex:  # both policies stream into the pool at once: no idle tail between them
        runs = list(ex.map(lambda policy: collect(policy, tasks, pool, max_turns=1),
                           (KnownGoodPolicy(), ReferencePolicy())))
    trajs = [t for run in runs for t in run]
    wall = time.monotonic() - started
    evals = sum(len(t.steps) for t in trajs)
    rows = [{"policy": t.policy, "problem": t.task.problem, "seed": t.task.seed, "correct": t.steps[0].info["correct"],
             "speedup": t.steps[0].info["speedup"], "runtime_ms": t.steps[0].info["runtime_ms"],
             "slot": t.steps[0].actor.slot, "gpu": t.steps[0].actor.gpu_uuid, "eval_s": round(t.steps[0].eval_s, 2),
             "error": t.error} for t in trajs]
    s = summarize(trajs)
    print(f"  {evals} evaluations in {wall:.1f} s on {pool.size} actor(s): {60 * evals / wall:.2f} per minute; "
          f"correct {s['correct']}/{s['steps']}, episode errors {s['errors']}")
    return {"actors": pool.size, "evaluations": evals, "wall_s": wall, "per_minute": 60 * evals / wall,
            "rows": rows, "summary": s}


def spread(pool: EvaluatorPool, problems: list[str]) -> dict:
    out = {}
    for problem in problems:
        source = get_problem(problem).solution_paths[0].read_text()
        with ThreadPoolExecutor(pool.size) as ex:
            results = list(ex.map(lambda slot: pool.evaluate(problem, source, slot=slot), range(pool.size)))
        times = [r.runtime_ms for r, _ in results]
        ok = all(r.correct for r, _ in results)
        diff = (max(times) - min(times)) / statistics.mean(times) * 100 if ok and all(times) else None
        out[problem] = {"runtime_ms": times, "gpus": [i.gpu_uuid for _, i in results], "spread_pct": diff}
        print(f"  {problem:15s} " + "  ".join(f"slot {i}: {t:.4f} ms" if t else f"slot {i}: -" for i, t in enumerate(times))
              + (f"  spread {diff:.2f}%" if diff is not None else "  (not all correct)"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", nargs="+", choices=PHASES, default=PHASES)
    ap.add_argument("--problems", nargs="+", default=PROBLEMS)
    ap.add_argument("--seeds", type=int, default=2, help="episodes per (policy, problem)")
    ap.add_argument("--mode", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    for p in args.problems:
        get_problem(p)

    import ray

    t0 = time.monotonic()
    ray.init(include_dashboard=False, log_to_driver=False)
    print(f"ray up in {time.monotonic() - t0:.1f} s: {ray.cluster_resources()}")
    report: dict = {}
    pool, pool_kind = None, None
    try:
        for phase in [p for p in PHASES if p in args.phases]:  # pinning, health, rollout, single, spread
            kind = "one" if phase == "single" else "all"
            if kind != pool_kind:  # the single-actor phase gets its own pool; the others share one
                if pool is not None:
                    pool.close()
                pool, pool_kind = EvaluatorPool(num_actors=1 if kind == "one" else None, mode=args.mode), kind
                print(f"pool: {pool.size} {pool.mode} actor(s)")
            print(f"[{phase}]")
            if phase == "pinning":
                report[phase] = pinning(pool)
            elif phase == "health":
                report[phase] = health(pool)
            elif phase in ("rollout", "single"):
                report[phase] = workload(pool, args.problems, args.seeds)
            else:
                report[phase] = spread(pool, args.problems)
            if args.out:  # after every phase: a run cut short keeps what it measured
                args.out.write_text(json.dumps(report, indent=1, default=str))
    finally:
        if pool is not None:
            pool.close()

    print("\n== summary ==")
    if "pinning" in report:
        print(f"actors on distinct GPUs: {report['pinning']['distinct']} "
              f"({', '.join(str(a['gpu_ids']) for a in report['pinning']['actors'])})")
    if "health" in report:
        print("health: " + ", ".join(f"{r['candidate']}->{r['outcome']}" for r in report["health"]["rows"])
              + f"  stats {report['health']['stats']}")
    for key in ("single", "rollout"):
        if key in report:
            r = report[key]
            print(f"{key:8s}: {r['actors']} actor(s)  {r['evaluations']} evals  {r['wall_s']:.1f} s  "
                  f"{r['per_minute']:.2f} evals/min  correct {r['summary']['correct']}/{r['summary']['steps']}")
    if "single" in report and "rollout" in report:
        print(f"scaling: {report['rollout']['per_minute'] / report['single']['per_minute']:.2f}x "
              f"with {report['rollout']['actors']} actors")
    if "spread" in report:
        for p, r in report["spread"].items():
            sp = "-" if r["spread_pct"] is None else f"{r['spread_pct']:.2f}%"
            print(f"spread {p:15s} {sp}  {r['runtime_ms']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
