"""`kb board`: the tables the field publishes, from a sweep's results.

An episode counts by its best turn (correct and unflagged with the highest speedup, else its
last turn). Tables:
- fast_p (KernelBench): share of all tasks whose best turn is correct with speedup > p
  (p = 0: correct at all); tasks that never produced a correct kernel count in the denominator.
- rates (KernelBench-v3): compiled, correct (and unflagged), flagged and beat-baseline
  (speedup > 1) shares per policy, with tokens and cost where the policy is an LLM; and the same
  per policy and problem level (`rates_by_level`). The reference itself is flagged wherever a
  problem forbids the torch ops it uses.
- peak_fraction (KernelBench-Hard): geometric mean over samples of the best turn's
  peak_fraction, per problem and policy, over the correct samples (n correct shown).
- mega (KernelBench-Mega): for each level-4 problem and policy, the geometric-mean speedup and
  tokens per second per context length over the correct samples, and the megakernel verdict from
  the profiled kernel launches per decode step (one launch per step is a megakernel).
In CPU mode timings are not meaningful: speedup-based columns are left empty, not zero."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from .rollout import StepRecord, Trajectory, read_jsonl
from .sweep import RESULTS

FAST_P = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
MEGA_LEVEL = 4
RATE_COLUMNS = ["tasks", "compiled", "correct", "flagged", "beat_baseline", "input_tokens", "output_tokens",
                "cost_usd", "episode_errors"]


def best_step(traj: Trajectory) -> StepRecord | None:
    good = [s for s in traj.steps if _good(s)]
    if good:
        return max(good, key=lambda s: s.info.get("speedup") or 0.0)
    return traj.steps[-1] if traj.steps else None


def _good(step: StepRecord | None) -> bool:
    return bool(step is not None and step.info.get("correct") and not step.info.get("flags"))


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def level_of(traj: Trajectory) -> int | None:
    """The problem's level: recorded at reset, else looked up in the registry (None if unknown)."""
    level = traj.reset_info.get("level")
    if level is None:
        from .problem import ProblemError, get_problem

        try:
            level = get_problem(traj.task.problem).level
        except ProblemError:
            return None
    return int(level)


def rates(ts: list[Trajectory], timed: bool) -> dict[str, Any]:
    """One row of the KernelBench-v3 table over these episodes."""
    n = len(ts)
    correct = [b for b in map(best_step, ts) if _good(b)]
    usage = [s.policy_info.get("usage", {}) for t in ts for s in t.steps]
    costs = [u.get("cost_usd") for u in usage if u]
    return {
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


def _shape_label(shape: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


def _launch_verdict(steps: list[StepRecord]) -> tuple[int | None, str]:
    """Kernel launches per step (the most over the samples' best turns) and the megakernel verdict."""
    counts = [s.info["kernel_launches"] for s in steps if s.info.get("kernel_launches") is not None]
    if not counts:
        return None, "unknown (no profiled call: CPU mode, or nothing ran)"
    worst = max(counts)
    if worst == 1:
        return 1, "megakernel (1 launch per step)"
    capped = any("too_many_launches" in (s.info.get("flags") or []) for s in steps)
    return worst, f"not a megakernel ({worst} launches per step{'; over the cap: too_many_launches' if capped else ''})"


def mega(ts: list[Trajectory]) -> dict[str, Any]:
    """One KernelBench-Mega row: one policy's episodes on one level-4 (decode) problem. A decode
    problem's ShapeTiming is one context length whose candidate median is the latency of one decode
    step in ms, so tokens per second is 1000 / median_ms."""
    best = [best_step(t) for t in ts]
    correct = [b for b in best if _good(b)]
    timed = [b for b in correct if b.info.get("timing_meaningful")]
    tok_s: dict[str, list[float]] = defaultdict(list)
    base_tok_s: dict[str, list[float]] = defaultdict(list)
    for b in timed:
        for t in (b.info.get("result") or {}).get("timings", []):
            label = _shape_label(t["shape"])
            if t["candidate"]["median_ms"] > 0:
                tok_s[label].append(1000.0 / t["candidate"]["median_ms"])
            if t["baseline"]["median_ms"] > 0:
                base_tok_s[label].append(1000.0 / t["baseline"]["median_ms"])
    launches, verdict = _launch_verdict([b for b in best if b is not None])
    return {"samples": len(ts), "correct": len(correct),
            "speedup": _geomean([b.info.get("speedup") for b in timed]) if timed else None,
            "tok_s": {k: _geomean(v) for k, v in tok_s.items()},
            "baseline_tok_s": {k: _geomean(v) for k, v in base_tok_s.items()},
            "launches_per_step": launches, "verdict": verdict}


def boards(trajs: list[Trajectory]) -> dict[str, Any]:
    by_policy: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_policy[t.policy].append(t)
    timed = all(s.info.get("timing_meaningful") for t in trajs for s in t.steps if s.info.get("correct"))
    fast, rate, by_level, peak = {}, {}, {}, {}
    mega_board: dict[str, dict[str, Any]] = defaultdict(dict)
    for policy, ts in sorted(by_policy.items()):
        best = [best_step(t) for t in ts]
        correct = [b for b in best if _good(b)]
        n = len(ts)
        fast[policy] = {f"fast_{p:g}": (len([b for b in correct if p == 0 or (b.info.get("speedup") or 0) > p]) / n
                                         if p == 0 or timed else None) for p in FAST_P}
        rate[policy] = rates(ts, timed)
        levels: dict[int | None, list[Trajectory]] = defaultdict(list)
        problems: dict[str, list[Trajectory]] = defaultdict(list)
        for t in ts:
            levels[level_of(t)].append(t)
            problems[t.task.problem].append(t)
        by_level[policy] = {("?" if lv is None else str(lv)): rates(group, timed)
                            for lv, group in sorted(levels.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))}
        peak[policy] = {}
        for problem, group in sorted(problems.items()):
            good = [b for b in map(best_step, group) if _good(b)]
            peak[policy][problem] = {"geomean": _geomean([b.info["peak_fraction"] for b in good
                                                          if b.info.get("peak_fraction") is not None]),
                                     "correct": len(good), "samples": len(group)}
            if level_of(group[0]) == MEGA_LEVEL:
                mega_board[problem][policy] = mega(group)
    return {"timing_meaningful": timed, "fast_p": fast, "rates": rate, "rates_by_level": by_level,
            "peak_fraction": peak, "mega": dict(sorted(mega_board.items()))}


# ----- rendering ---------------------------------------------------------------------------
def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3f}"
    return str(x)


def table_rows(board: dict[str, Any]) -> dict[str, tuple[list[str], list[list[Any]]]]:
    """Every board as (columns, rows), by title: what board.md and the HTML report print."""
    cols = [f"fast_{p:g}" for p in FAST_P]
    out = {"fast_p (KernelBench)": (["policy", *cols], [[pol, *(row[c] for c in cols)]
                                                         for pol, row in board["fast_p"].items()])}
    out["rates (KernelBench-v3)"] = (["policy", *RATE_COLUMNS], [[pol, *(row[c] for c in RATE_COLUMNS)]
                                                               for pol, row in board["rates"].items()])
    out["rates by level (KernelBench-v3)"] = (
        ["policy", "level", *RATE_COLUMNS],
        [[pol, lv, *(row[c] for c in RATE_COLUMNS)] for pol, rows in board["rates_by_level"].items()
         for lv, row in rows.items()])
    problems = sorted({p for rows in board["peak_fraction"].values() for p in rows})
    cell = lambda r: "-" if r is None else f"{_fmt(r['geomean'])} ({r['correct']}/{r['samples']})"  # noqa: E731
    out["peak_fraction, geometric mean over correct samples (KernelBench-Hard)"] = (
        ["policy", *problems],
        [[pol, *(cell(rows.get(p)) for p in problems)] for pol, rows in board["peak_fraction"].items()])
    for problem, rows in board["mega"].items():
        shapes = list(dict.fromkeys(k for r in rows.values() for k in (*r["tok_s"], *r["baseline_tok_s"])))
        out[f"{problem} (KernelBench-Mega)"] = (
            ["policy", "correct", "speedup (geomean)", *(f"tok/s {s}" for s in shapes),
             *(f"baseline tok/s {s}" for s in shapes), "launches/step", "verdict"],
            [[pol, f"{r['correct']}/{r['samples']}", r["speedup"], *(r["tok_s"].get(s) for s in shapes),
              *(r["baseline_tok_s"].get(s) for s in shapes), r["launches_per_step"], r["verdict"]]
             for pol, r in rows.items()])
    if not board["mega"]:
        out["KernelBench-Mega"] = (["note"], [["no level-4 (Mega) problem in these results"]])
    return out


def render(board: dict[str, Any]) -> str:
    """The boards as Markdown tables."""
    lines = []
    if not board["timing_meaningful"]:
        lines.append("_CPU mode (or mixed): timings are not meaningful, so speedup columns are empty._\n")
    for title, (cols, rows) in table_rows(board).items():
        lines += [f"## {title}", "", "| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
        lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
        lines.append("")
    return "\n".join(lines)


def write_board(out: Path) -> dict[str, Any]:
    """Read `<out>/results.jsonl`, write `board.md` and `board.json` beside it; returns the boards."""
    path = Path(out) / RESULTS
    if not path.exists():
        raise FileNotFoundError(f"{path}: no results (run `kb sweep --out {out}` first)")
    board = boards(read_jsonl(path))
    (Path(out) / "board.md").write_text(render(board))
    (Path(out) / "board.json").write_text(json.dumps(board, indent=1))
    return board
