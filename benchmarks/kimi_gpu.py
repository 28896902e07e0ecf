"""kimi_linear_decode on a GPU: each candidate evaluated `--runs` times by the harness (fresh
workers each time), with per context the baseline's and the candidate's ms per token (median over
the runs, and their spread), tok/s, speedup over the baseline, peak_fraction against memory
bandwidth, kernel launches per step and the flags.

    python benchmarks/kimi_gpu.py [FILE ...] [--runs 3] [--no-launch-cap] [--out kimi_gpu.json]

With no FILE: the problem's solutions/*.py. The JSON (every run's EvalResult summary) is rewritten
after each evaluation. Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kb_env import get_problem  # noqa: E402
from kb_env.evaluate.evaluator import Evaluator  # noqa: E402


def summary(res) -> dict[str, Any]:
    return {"correct": res.correct, "error": res.error.value if res.error else None, "flags": res.flags,
            "message": res.message[:600], "launches": res.kernel_launches, "own_share": res.own_kernel_share,
            "speedup": res.speedup, "peak_fraction": res.peak_fraction, "wall_s": round(res.wall_s, 1),
            "stage_s": res.stage_s, "device": res.device.name if res.device else None,
            "checks": [{"kind": c.kind, "context": c.shape.get("context"), "ok": c.ok,
                        "mismatch": c.mismatch.message if c.mismatch else None} for c in res.checks if not c.ok],
            "contexts": [{"context": t.shape["context"], "ms": t.candidate.median_ms, "ms_p25": t.candidate.p25_ms,
                          "ms_p75": t.candidate.p75_ms, "baseline_ms": t.baseline.median_ms,
                          "baseline_p25": t.baseline.p25_ms, "baseline_p75": t.baseline.p75_ms,
                          "peak_fraction": t.peak_fraction, "wall_check_ms": t.wall_check_ms,
                          "launches": t.kernels.launches if t.kernels else None} for t in res.timings]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-launch-cap", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "kimi_gpu.json")
    args = ap.parse_args(argv)
    spec = get_problem("kimi_linear_decode")
    files = args.files or spec.solution_paths
    missing = [f for f in files if not f.is_file()]
    if missing:
        print(f"kimi_gpu: no such file: {missing}", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"runs": {}}
    for f in files:
        for r in range(args.runs):
            t0 = time.monotonic()
            ev = Evaluator(spec, "cuda", launch_cap=not args.no_launch_cap,
                           progress=lambda m: print(f"  {f.name} run {r + 1}: {m}", flush=True))
            res = ev.evaluate(f.read_text())
            report["runs"].setdefault(f.name, []).append(summary(res))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=2))
            print(f"{f.name} run {r + 1}: correct={res.correct} flags={res.flags} launches={res.kernel_launches} "
                  f"speedup={res.speedup} ({time.monotonic() - t0:.0f} s) {res.message[:300]}", flush=True)

    print("\n| candidate | context | baseline ms/tok (runs) | ms/tok (runs) | tok/s | speedup | peak frac | launches | flags |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, runs in report["runs"].items():
        flags = sorted({f for r in runs for f in r["flags"]})
        ok = [r for r in runs if r["contexts"]]
        if not ok:
            print(f"| {name} | - | - | - | - | - | - | {runs[0]['launches']} | {','.join(flags) or runs[0]['error']} |")
            continue
        for i, ctx in enumerate(ok[0]["contexts"]):
            base = [r["contexts"][i]["baseline_ms"] for r in ok]
            cand = [r["contexts"][i]["ms"] for r in ok]
            bm, cm = statistics.median(base), statistics.median(cand)
            pf = statistics.median([r["contexts"][i]["peak_fraction"] or 0 for r in ok])
            print(f"| {name} | {ctx['context']} | {bm:.3f} ({min(base):.3f}-{max(base):.3f}) | "
                  f"{cm:.4f} ({min(cand):.4f}-{max(cand):.4f}) | {1e3 / cm:.0f} | {bm / cm:.2f}x | {pf:.3f} | "
                  f"{ctx['launches']} | {','.join(flags) or '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
