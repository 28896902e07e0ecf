"""The KernelBench importer on a GPU: import a KernelBench-format directory (by default the test
fixtures, tests/kernelbench_fixture) with checks on the GPU where the CPU cannot afford them, then
evaluate candidates on the imported problems in CUDA mode through the real Evaluator.

    python benchmarks/kernelbench_import.py [--dir DIR] [--device cuda] [--out results.json]

The import goes to a temporary cache (the user's import cache is left alone). On the fixtures,
expect: level1-60_Big_matmul (2 GiB, too big for the CPU checks) checked on the GPU with three
stress cases; then, per candidate:

- level2-3_Affine_LeakyReLU: the Triton kernel correct and unflagged, all zeros a mismatch, the
  reference itself correct but flagged (forbidden_op:aten::leaky_relu, ...);
- both matmuls: the Triton kernel with IEEE float32 products correct; the same kernel with TF32
  products a mismatch (float32 problems are graded as float32); the reference flagged
  (forbidden_op:aten::mm).

Nine evaluations; the 2 GiB matmul's IEEE float32 kernel (no tensor cores) dominates: expect a few
minutes on an H100 or H200. Writes JSON to --out, or to $OUT/kernelbench_import.json when $OUT is
set, after every evaluation. Prints a table last."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CANDIDATES = REPO / "tests" / "candidates"


def _candidates(problems: set[str]) -> list[tuple[str, str, str, str]]:
    """(problem, label, source, expected outcome) for the fixture problems that were registered."""
    from kb_env.problem import get_problem

    ieee = (CANDIDATES / "kb_matmul_fp32.py").read_text()
    tf32 = ieee.replace('PRECISION = "ieee"', 'PRECISION = "tf32"')
    rows = []
    affine = "level2-3_Affine_LeakyReLU"
    if affine in problems:
        rows += [(affine, "triton", (CANDIDATES / "kb_affine_leaky_relu.py").read_text(), "correct"),
                 (affine, "zeros", (CANDIDATES / "kb_zeros.py").read_text(), "mismatch"),
                 (affine, "reference", get_problem(affine).reference_source(), "integrity")]
    for mm in ("level1-1_Square_matrix_multiplication_", "level1-60_Big_matmul"):
        if mm in problems:
            rows += [(mm, "triton ieee", ieee, "correct"), (mm, "triton tf32", tf32, "mismatch"),
                     (mm, "reference", get_problem(mm).reference_source(), "integrity")]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=str(REPO / "tests" / "kernelbench_fixture"))
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cuda")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out_path = Path(args.out) if args.out else (Path(os.environ["OUT"]) / "kernelbench_import.json"
                                                if os.environ.get("OUT") else None)
    os.environ["KB_IMPORT_DIR"] = CACHE  # before kb_env reads the registry

    from kb_env.evaluate.evaluator import Evaluator
    from kb_env.kernelbench import register_kernelbench
    from kb_env.problem import get_problem

    report = register_kernelbench(args.dir, device=args.device, progress=lambda f: print(f"probing {f}", flush=True))
    print(report.render(), flush=True)
    results: dict[str, Any] = {"import": report.model_dump(mode="json"), "evaluations": []}
    mode = "cuda" if args.device != "cpu" else "cpu"
    for problem, label, source, expected in _candidates({r.name for r in report.registered}):
        spec = get_problem(problem)
        if mode == "cpu" and spec.gpu_only:
            continue
        res = Evaluator(spec, mode).evaluate(source)
        outcome = "correct" if res.correct and not res.flags else (res.error.value if res.error else "?")
        row = {"problem": problem, "candidate": label, "expected": expected, "outcome": outcome,
               "ok": outcome == expected, "flags": res.flags, "runtime_ms": res.runtime_ms, "baseline_ms": res.baseline_ms,
               "speedup": res.speedup, "peak_fraction": res.peak_fraction, "message": (res.message or "")[:300],
               "gpu": res.device.name if res.device else None}
        results["evaluations"].append(row)
        print(f"{problem} / {label}: {outcome} (expected {expected})", flush=True)
        if out_path:
            out_path.write_text(json.dumps(results, indent=1))

    print("\nKernelBench import: registered", len(report.registered), "skipped", len(report.skipped),
          "| checked on:", ", ".join(f"{r.name}={r.checked_on or 'none'}" for r in report.registered))
    print(f"{'problem':<40} {'candidate':<12} {'expected':<10} {'outcome':<10} {'ok':<3} {'ms':>9} {'base ms':>9} "
          f"{'speedup':>8} {'peak':>6}  flags")
    for r in results["evaluations"]:
        fmt = lambda v, f: format(v, f) if isinstance(v, (int, float)) else "-".rjust(int(f.split(".")[0]))  # noqa: E731
        print(f"{r['problem']:<40} {r['candidate']:<12} {r['expected']:<10} {r['outcome']:<10} "
              f"{'yes' if r['ok'] else 'NO':<3} {fmt(r['runtime_ms'], '9.4f')} {fmt(r['baseline_ms'], '9.4f')} "
              f"{fmt(r['speedup'], '8.2f')} {fmt(r['peak_fraction'], '6.2f')}  {','.join(r['flags'])}")
    return 0 if all(r["ok"] for r in results["evaluations"]) else 1


if __name__ == "__main__":
    CACHE = tempfile.mkdtemp(prefix="kb_import_bench_")
    try:
        sys.exit(main())
    finally:
        shutil.rmtree(CACHE, ignore_errors=True)
