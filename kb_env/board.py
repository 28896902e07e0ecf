"""`kb board`: the tables the field publishes, from a sweep's results.

An episode counts by its best turn (correct and unflagged with the highest speedup, else its
last turn). Tables:
- fast_p (KernelBench): share of all tasks whose best turn is correct with speedup > p
  (p = 0: correct at all); tasks that never produced a correct kernel count in the denominator.
- rates (KernelBench-v3): compiled, correct (and unflagged), flagged and beat-baseline
  (speedup > 1) shares per policy, with tokens and cost where the policy is an LLM. The
  reference itself is flagged wherever a problem forbids the torch ops it uses.
- peak_fraction (KernelBench-Hard): geometric mean over samples of the best turn's
  peak_fraction, per problem and policy, over the correct samples (n correct shown).
In CPU mode timings are not meaningful: speedup-based columns are left empty, not zero."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from .rollout import StepRecord, Trajectory, read_jsonl
from .sweep import RESULTS

FAST_P = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)


def best_step(traj: Trajectory) -> StepRecord | None:
    good = [s for s in traj.steps if s.info.get("correct") and not s.info.get("flags")]
    if good:
        return max(good, key=lambda s: s.info.get("speedup") or 0.0)
    return traj.steps[-1] if traj.steps else None


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def boards(trajs: list[Trajectory]) -> dict[str, Any]:
    by_policy: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_policy[t.policy].append(t)
    timed = all(s.info.get("timing_meaningful") for t in trajs for s in t.steps if s.info.get("correct"))
    fast, rates, peak = {}, {}, {}
    for policy, ts in sorted(by_policy.items()):
        best = [best_step(t) for t in ts]
        correct = [b for b in best if b is not None and b.info.get("correct") and not b.info.get("flags")]
        n = len(ts)
        fast[policy] = {f"fast_{p:g}": (len([b for b in correct if p == 0 or (b.info.get("speedup") or 0) > p]) / n
                                         if p == 0 or timed else None) for p in FAST_P}
        usage = [s.policy_info.get("usage", {}) for t in ts for s in t.steps]
        costs = [u.get("cost_usd") for u in usage if u]
        rates[policy] = {
            "tasks": n,
            "compiled": sum(any(s.info.get("compiled") for s in t.steps) for t in ts) / n,
            "correct": len(correct) / n,
            "flagged": sum(any(s.info.get("flags") for s in t.steps) for t in ts) / n,
            "beat_baseline": (len([b for b in correct if (b.info.get("speedup") or 0) > 1]) / n) if timed else None,
            "input_tokens": sum(u.get("input_tokens", 0) for u in usage if u),
            "output_tokens": sum(u.get("output_tokens", 0) for u in usage if u),
            "cost_usd": sum(costs) if costs and all(c is not None for c in costs) else None,
            "episode_errors": sum(t.error is not None for t in ts),
        }
        per_problem: dict[str, list[float]] = defaultdict(list)
        totals: dict[str, int] = defaultdict(int)
        wins: dict[str, int] = defaultdict(int)
        for t, b in zip(ts, best):
            totals[t.task.problem] += 1
            if b in correct:
                wins[t.task.problem] += 1
                if b.info.get("peak_fraction") is not None:
                    per_problem[t.task.problem].append(b.info["peak_fraction"])
        peak[policy] = {p: {"geomean": _geomean(per_problem[p]), "correct": wins[p], "samples": totals[p]}
                        for p in sorted(totals)}
    return {"timing_meaningful": timed, "fast_p": fast, "rates": rates, "peak_fraction": peak}


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3f}"
    return str(x)


def render(board: dict[str, Any]) -> str:
    """The boards as Markdown tables."""
    lines = []
    if not board["timing_meaningful"]:
        lines.append("_CPU mode (or mixed): timings are not meaningful, so speedup columns are empty._\n")
    cols = [f"fast_{p:g}" for p in FAST_P]
    lines += ["## fast_p (KernelBench)", "", "| policy | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    lines += [f"| {pol} | " + " | ".join(_fmt(row[c]) for c in cols) + " |" for pol, row in board["fast_p"].items()]
    rcols = ["tasks", "compiled", "correct", "flagged", "beat_baseline", "input_tokens", "output_tokens", "cost_usd",
             "episode_errors"]
    lines += ["", "## rates (KernelBench-v3)", "", "| policy | " + " | ".join(rcols) + " |", "|---" * (len(rcols) + 1) + "|"]
    lines += [f"| {pol} | " + " | ".join(_fmt(row[c]) for c in rcols) + " |" for pol, row in board["rates"].items()]
    problems = sorted({p for rows in board["peak_fraction"].values() for p in rows})
    lines += ["", "## peak_fraction, geometric mean over correct samples (KernelBench-Hard)", "",
              "| policy | " + " | ".join(problems) + " |", "|---" * (len(problems) + 1) + "|"]
    for pol, rows in board["peak_fraction"].items():
        cells = []
        for p in problems:
            r = rows.get(p)
            cells.append("-" if r is None else f"{_fmt(r['geomean'])} ({r['correct']}/{r['samples']})")
        lines.append(f"| {pol} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_board(out: Path) -> dict[str, Any]:
    """Read `<out>/results.jsonl`, write `board.md` and `board.json` beside it; returns the boards."""
    import json

    path = Path(out) / RESULTS
    if not path.exists():
        raise FileNotFoundError(f"{path}: no results (run `kb sweep --out {out}` first)")
    board = boards(read_jsonl(path))
    (Path(out) / "board.md").write_text(render(board))
    (Path(out) / "board.json").write_text(json.dumps(board, indent=1))
    return board
