"""The reference and known-good policies over every registered problem, then every board, the
plots and the HTML report, each checked. CPU mode without a GPU (problems without CPU shapes are
left out there); on a GPU the same run fills the speedup, peak_fraction and Mega columns.

    python benchmarks/deck_sweep.py [--device auto|cpu|cuda] [--problems a b ...] [--actors N]
                                    [--out DIR] [--browser]

Checks: an episode for every (policy, problem) (known-good only where a problem has solutions);
every table in board.md and report.html (fast_p, v3 rates and rates by level, Hard
peak_fraction, a Mega table per level-4 problem or the note that there is none); the four plots
as PNGs; every episode in the report's viewer; the known-good solution correct and unflagged on
every problem; the reference correct in value (it may be flagged where a problem forbids the torch
ops it calls). `--browser` also opens the report in headless Chromium (scripts/check_report.py).
The results folder is resumable (`kb sweep`'s); the summary JSON goes to $OUT (or the results
folder). Prints a table per problem last; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kb_env.board import best_step, table_rows, write_board  # noqa: E402
from kb_env.problem import get_problem  # noqa: E402
from kb_env.report import PLOTS, write_report  # noqa: E402
from kb_env.rollout import read_jsonl  # noqa: E402
from kb_env.sweep import RESULTS, SweepConfig, run_sweep  # noqa: E402

POLICIES = ("reference", "known-good")


def expected_pairs(problems: list[str]) -> set[tuple[str, str]]:
    return {(p, n) for n in problems for p in POLICIES if p == "reference" or get_problem(n).solution_paths}


def check_outputs(out: Path, problems: list[str]) -> list[str]:
    """What is missing or wrong in a finished deck sweep's folder (empty: all present and right)."""
    out = Path(out)
    failures: list[str] = []
    trajs = read_jsonl(out / RESULTS) if (out / RESULTS).exists() else []
    seen = {(t.policy, t.task.problem) for t in trajs}
    for pair in sorted(expected_pairs(problems) - seen):
        failures.append(f"no episode for {pair[0]} on {pair[1]}")
    missing = [name for name in ("board.md", "board.json", "report.html") if not (out / name).is_file()]
    if missing:
        return failures + [f"{name} was not written" for name in missing]
    board = json.loads((out / "board.json").read_text())
    md, page = (out / "board.md").read_text(), (out / "report.html").read_text()
    titles = list(table_rows(board))
    for needed in ("fast_p (KernelBench)", "rates (KernelBench-v3)", "rates by level (KernelBench-v3)"):
        if needed not in titles:
            failures.append(f"the {needed} table is missing from the boards")
    if not any("(KernelBench-Hard)" in t for t in titles):
        failures.append("the KernelBench-Hard table is missing from the boards")
    mega = [n for n in problems if get_problem(n).level == 4]
    for n in mega:
        if f"{n} (KernelBench-Mega)" not in titles:
            failures.append(f"no KernelBench-Mega table for level-4 problem {n}")
    if not mega and "KernelBench-Mega" not in titles:
        failures.append("the KernelBench-Mega note is missing")
    for title in titles:
        if f"## {title}" not in md:
            failures.append(f"board.md lacks the {title} table")
        if f"<h2>{title}</h2>" not in page.replace("&amp;", "&"):
            failures.append(f"report.html lacks the {title} table")
    for png in PLOTS:
        path = out / "plots" / png
        if not path.is_file() or path.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
            failures.append(f"plot {png} is missing or not a PNG")
        elif f'src="plots/{png}"' not in page:
            failures.append(f"report.html does not show {png}")
    data = json.loads(page.split('id="episodes-data">')[1].split("</script>")[0].replace("<\\/", "</"))
    if len(data) != len(trajs):
        failures.append(f"the viewer holds {len(data)} episodes of {len(trajs)}")
    for t in trajs:
        b = best_step(t)
        if t.error or b is None:
            failures.append(f"{t.policy} on {t.task.problem}: the episode failed: {t.error}")
        elif t.policy == "known-good" and not (b.info["correct"] and not b.info["flags"]):
            failures.append(f"known-good on {t.task.problem}: {b.info['error']} {b.info['flags']}")
        elif t.policy == "reference" and not b.info["correct"]:
            failures.append(f"reference on {t.task.problem}: not correct ({b.info['error']})")
    return failures


def _row(trajs: list[Any], problem: str) -> dict[str, Any]:
    row: dict[str, Any] = {"problem": problem, "level": get_problem(problem).level}
    for t in trajs:
        if t.task.problem != problem:
            continue
        b = best_step(t)
        info = b.info if b else {}
        outcome = ("error: " + t.error[:40]) if t.error else ("correct" if info.get("correct") and not info.get("flags")
                                                             else info.get("error") or "-")
        row[t.policy] = {"outcome": outcome, "flags": info.get("flags", []), "speedup": info.get("speedup"),
                         "peak_fraction": info.get("peak_fraction"), "launches": info.get("kernel_launches"),
                         "eval_s": round(sum(s.eval_s for s in t.steps), 1)}
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--problems", nargs="+", help="default: every registered problem (with CPU shapes in CPU mode)")
    ap.add_argument("--actors", type=int, help="evaluations at once (CPU mode; default 2); 1 on a GPU")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "runs")) / "deck_sweep")
    ap.add_argument("--browser", action="store_true", help="also check the report in headless Chromium")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args()

    from kb_env.env import resolve_device

    mode = resolve_device(args.device)
    cfg = SweepConfig(name="deck-sweep", policies=list(POLICIES), problems=args.problems, mode=mode,
                      actors=args.actors or (2 if mode == "cpu" else 1))
    problems = cfg.problem_names()
    print(f"{len(problems)} problem(s) in {mode} mode: {', '.join(problems)}", file=sys.stderr)
    run_sweep(cfg, args.out, progress=not args.quiet)
    board = write_board(args.out)
    write_report(args.out)
    failures = check_outputs(args.out, problems)
    browser = None
    if args.browser:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
        from check_report import check_report

        browser = check_report(args.out, args.out / "report.png")
        failures += [f"browser: {f}" for f in browser["failures"]]

    trajs = read_jsonl(args.out / RESULTS)
    rows = [_row(trajs, p) for p in problems]
    summary = {"mode": mode, "problems": problems, "timing_meaningful": board["timing_meaningful"], "rows": rows,
               "failures": failures, "out": str(args.out), "browser": browser}
    json_dir = Path(os.environ.get("OUT", args.out))
    json_dir.mkdir(parents=True, exist_ok=True)
    (json_dir / "deck_sweep.json").write_text(json.dumps(summary, indent=1, default=str))

    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    print(f"\nboards: {args.out / 'board.md'}  report: {args.out / 'report.html'}  plots: {args.out / 'plots'}")
    print("\n| problem | level | reference | known-good | kg speedup | kg peak_fraction | kg launches | kg eval s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ref, kg = r.get("reference", {}), r.get("known-good", {})
        ref_out = ref.get("outcome", "-") + (" (flagged)" if ref.get("flags") else "")
        print(f"| {r['problem']} | {r['level']} | {ref_out} | {kg.get('outcome', 'no solution')} | "
              f"{f(kg.get('speedup'))} | {f(kg.get('peak_fraction'))} | {kg.get('launches') or '-'} | "
              f"{kg.get('eval_s', '-')} |")
    for line in failures:
        print(f"FAIL: {line}")
    print(f"{'all checks passed' if not failures else f'{len(failures)} check(s) failed'} "
          f"({len(problems)} problems, {mode} mode)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
