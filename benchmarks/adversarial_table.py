"""Run the adversarial battery (tests/adversarial/battery.yaml) and print attack -> outcome.

    python benchmarks/adversarial_table.py --mode cpu|cuda [--only NAME ...] [--out results.json]
                                           [--health] [--quick] [--jobs N]

One line per entry as it finishes, then a table: name, class, expected, outcome, error,
reward, OK/FAIL, seconds. OK means the outcome matches the manifest and the reward is no more
than a wrong answer's (controls and neutralised attacks: correct and unflagged). With
--health the problem's known-good solution is evaluated after each entry with the same
evaluator and must stay correct. --quick times with a short schedule (3 warm-up calls, 2 rounds
of 10) to get the table sooner; every check still runs. --jobs N evaluates N entries at once
(each has its own worker processes; on one GPU they share it, so timings are not comparable,
but outcomes are). Exit status 1 if any entry FAILs. Needs no pytest.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "adversarial"))

import battery  # noqa: E402
from rewards import default as default_reward  # noqa: E402


def _row(entry, mode, cache, health):
    try:
        result, seconds = battery.run_entry(entry, mode, cache)
    except Exception as exc:  # noqa: BLE001 (a harness error is a FAIL of this entry, not of the run)
        return {"name": entry.name, "class": entry.klass, "expected": " | ".join(entry.expect),
                "outcome": f"harness_error: {type(exc).__name__}: {exc}"[:300], "error": None, "reward": None,
                "ok": False, "seconds": 0.0, "flags": [], "message": ""}
    ok = battery.matches(entry, result) and battery.reward_ok(entry, result)
    row = {"name": entry.name, "class": entry.klass, "expected": " | ".join(entry.expect),
           "outcome": battery.outcome_of(result), "error": result.error.value if result.error else None,
           "reward": default_reward(result), "ok": ok, "seconds": round(seconds, 1), "flags": result.flags,
           "message": result.message[:500]}
    if health:
        good = battery.evaluator_for(entry, mode, cache).evaluate(battery.known_good(entry))
        row["health"] = battery.outcome_of(good)
        row["ok"] = ok and row["health"] == "correct"
        # what the known-good run measured: its message if it failed, and per shape its reported
        # median next to the harness's wall clock per call (the wall check's margin)
        row["health_message"] = good.message[:500]
        row["health_timing"] = [{"median_ms": t.candidate.median_ms, "wall_check_ms": t.wall_check_ms}
                                for t in good.timings]
    return row


def _table(rows: list[dict]) -> str:
    cols = ["name", "class", "expected", "outcome", "error", "reward", "ok", "seconds"]
    cells = [[str(r["name"]), str(r["class"]), r["expected"], r["outcome"], str(r["error"]),
              "-" if r["reward"] is None else f"{r['reward']:.2f}", "OK" if r["ok"] else "FAIL",
              f"{r['seconds']:.1f}"] for r in rows]
    widths = [min(60, max(len(c), *(len(row[i]) for row in cells))) for i, c in enumerate(cols)]
    fmt = lambda vals: "  ".join(v[:w].ljust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([fmt(cols), fmt(["-" * w for w in widths]), *(fmt(c) for c in cells)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=battery.MODES, required=True)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these entries")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    ap.add_argument("--health", action="store_true", help="evaluate the known-good solution after each entry")
    ap.add_argument("--quick", action="store_true", help="a short timing schedule (outcomes, not timings)")
    ap.add_argument("--jobs", type=int, default=1, help="entries evaluated at once (default 1)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    if args.quick:
        battery.GLOBAL_OVERRIDE = {"timing": {"warmup": 3, "reps": 10, "rounds": 2, "input_sets": 2}}

    entries = battery.load_battery()
    if args.only:
        unknown = set(args.only) - {e.name for e in entries}
        if unknown:
            ap.error(f"unknown entries: {', '.join(sorted(unknown))}")
        entries = [e for e in entries if e.name in args.only]
    if args.mode == "cpu" and battery.triton_version() < (3, 9):
        print("warning: CPU mode needs triton>=3.9 (the interpreter mis-handles masked loads before)", file=sys.stderr)
    todo = [e for e in entries if battery.available(e, args.mode)]
    skipped = [e.name for e in entries if e not in todo]
    if skipped:
        print(f"not available in {args.mode} mode here: {', '.join(skipped)}")
    cache: dict = {}
    rows = []
    started = time.monotonic()
    for entry in todo:  # evaluators are built here, once per configuration, not in the threads
        battery.evaluator_for(entry, args.mode, cache)

    lock = threading.Lock()

    def one(entry):
        row = _row(entry, args.mode, cache, args.health)
        extra = f"  health={row['health']}" if "health" in row else ""
        with lock:
            rows.append(row)
            print(f"[{len(rows)}/{len(todo)}] {entry.name}: {row['outcome']} ({'OK' if row['ok'] else 'FAIL'}, "
                  f"{row['seconds']:.1f} s){extra}", flush=True)
            if args.out:  # after every entry: a run cut short keeps what it finished
                args.out.write_text(json.dumps({"mode": args.mode, "rows": rows}, indent=2))
        return row

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows[:] = list(pool.map(one, todo))
    print()
    print(_table(rows))
    failed = [r["name"] for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} OK in {time.monotonic() - started:.0f} s ({args.mode} mode)"
          + (f"; FAIL: {', '.join(failed)}" if failed else ""))
    if args.out:
        args.out.write_text(json.dumps({"mode": args.mode, "rows": rows}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
