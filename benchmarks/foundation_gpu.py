"""GPU check-and-measure pass for the foundation: hardware ceilings, each known-good solution
and the reference (as a candidate) against the eager baseline, and the spread of the same
candidate over fresh evaluations.

    python benchmarks/foundation_gpu.py [--repeats 3] [--out results.json]

Prints a table last; writes every EvalResult to --out."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kb_env import evaluate, get_problem  # noqa: E402

PROBLEMS = ["softmax", "rmsnorm", "gemm_bias_gelu"]


def ceilings() -> dict[str, float]:
    """Copy bandwidth (bytes read + written) and dense matmul rates, medians of CUDA-event timings."""
    def med(fn, reps=20):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); fn(); e.record(); torch.cuda.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        return sorted(times)[len(times) // 2]

    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    out = {"copy_gbps": 2 * n / med(lambda: b.copy_(a)) / 1e9}
    del a, b
    m = 8192
    for dt in (torch.float16, torch.bfloat16):
        x = torch.randn(m, m, device="cuda", dtype=dt)
        y = torch.randn(m, m, device="cuda", dtype=dt)
        out[f"{str(dt)[6:]}_tflops"] = 2 * m**3 / med(lambda: x @ y, reps=10) / 1e12
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3, help="fresh evaluations of each known-good solution")
    ap.add_argument("--problems", nargs="*", default=PROBLEMS)
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--out", default="foundation_gpu.json")
    ap.add_argument("--reps", type=int, default=None, help="override each problem's timed calls per round")
    ap.add_argument("--rounds", type=int, default=None, help="override each problem's interleaved rounds")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("foundation_gpu.py: needs a CUDA GPU")

    record: dict = {"gpu": torch.cuda.get_device_name(0), "ceilings": ceilings(), "runs": []}
    print(f"GPU: {record['gpu']}  ceilings: " + ", ".join(f"{k}={v:.0f}" for k, v in record["ceilings"].items()), flush=True)
    rows = []
    for name in args.problems:
        spec = get_problem(name)
        overrides = {k: v for k, v in (("reps", args.reps), ("rounds", args.rounds)) if v is not None}
        if overrides:
            spec = spec.model_copy(update={"timing": spec.timing.model_copy(update=overrides)})
        jobs = [("known-good", spec.solution_paths[0].read_text())] * args.repeats
        if not args.no_reference:
            jobs.append(("reference", spec.reference_source()))
        for label, src in jobs:
            t0 = time.time()
            r = evaluate(spec, src, mode="cuda")
            record["runs"].append({"problem": name, "candidate": label, "result": r.model_dump(mode="json")})
            Path(args.out).write_text(json.dumps(record, indent=1))  # nothing lost if cut short
            print(f"{name:15s} {label:10s} correct={r.correct} error={r.error and r.error.value} flags={r.flags} "
                  f"speedup={r.speedup} wall={time.time() - t0:.1f}s {r.message[:300] if not r.correct else ''}",
                  flush=True)
            for t in r.timings:
                rows.append((name, label, t.shape, t.candidate.median_ms, t.candidate.rel_spread,
                             t.baseline.median_ms, t.speedup, t.peak_fraction, t.regime))
    print("\n| problem | candidate | shape | ms | IQR/med | baseline ms | speedup | peak_fraction | regime |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, label, shape, ms, spread, base, sp, pf, regime in rows:
        pf_s = f"{pf:.3f}" if pf is not None else "n/a"
        print(f"| {name} | {label} | {shape} | {ms:.4f} | {spread:.1%} | {base:.4f} | {sp:.3f} | {pf_s} | {regime} |")
    print("\nrepeatability (same known-good candidate, fresh evaluations): max/min - 1 of the median")
    for name in args.problems:
        runs = [x["result"] for x in record["runs"] if x["problem"] == name and x["candidate"] == "known-good"]
        if len(runs) < 2 or not all(r["timings"] for r in runs):
            continue
        for i, shape in enumerate(runs[0]["timings"]):
            meds = [r["timings"][i]["candidate"]["median_ms"] for r in runs]
            print(f"  {name} {shape['shape']}: {', '.join(f'{m:.4f}' for m in meds)} ms -> {max(meds) / min(meds) - 1:.2%}")


if __name__ == "__main__":
    main()
