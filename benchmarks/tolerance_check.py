"""Does a problem's tolerance hold at its GPU shapes? The reference, in the problem's dtype, against
its float64 oracle on every grading shape, for a plain seed and every stress case.

    python benchmarks/tolerance_check.py [--problems a b ...] [--device cuda|cpu] [--shapes gpu|cpu]
                                        [--override '{"B": 1}'] [--out tolerance_check.json]

tests/test_problem_tolerances.py calibrates each bar on the CPU shapes only; errors grow with the
shapes (longer reductions, more elements, so larger extremes) and with the stress cases (scaled and
heavy-tailed inputs). A float64-exact candidate differs from the reference by exactly the error
measured here, so a bar this check fails would fail an exact kernel. Per case it reports the
relative L2 error against the bar and the smallest atol that would pass every element at the
problem's rtol ("need atol"); PASS means the reference passes against the oracle with the
problem's tolerance. On a GPU the reference runs as the harness runs it (cuBLAS, flash attention);
on the CPU (slow: minutes per GPU shape) `--override` can shrink a batch dimension.
Prints a table last; writes JSON to the directory in $OUT (default: the current one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kb_env import all_problems  # noqa: E402
from kb_env.evaluate.correctness import compare_outputs  # noqa: E402
from kb_env.problem import Interface, ProblemSpec, import_file  # noqa: E402
from kb_env.sandbox.cases import as_output_list, make_inputs, make_reference_model  # noqa: E402

SEED, PARAM_SEED = 11, 7


def _oracle(reference: Any, model: torch.nn.Module, shape: dict[str, int], inputs: list[Any], device: str) -> list[Any]:
    if hasattr(reference, "oracle"):
        return as_output_list(reference.oracle(model, inputs))
    model64 = make_reference_model(reference, shape, PARAM_SEED).double().to(device).eval()
    return as_output_list(model64(*[x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                                    for x in inputs]))


def check(spec: ProblemSpec, shape: dict[str, int], device: str) -> list[dict[str, Any]]:
    reference = import_file(spec.reference_path, f"tolcheck_{spec.name}")
    model = make_reference_model(reference, shape, PARAM_SEED).to(device).eval()
    rows = []
    for stress in [None] + [s.model_dump() for s in spec.stress]:
        t0 = time.monotonic()
        inputs = make_inputs(reference, shape, SEED, device, stress)
        with torch.no_grad():
            outs = as_output_list(model(*inputs))
            oracle = _oracle(reference, model, shape, inputs, device)
        ok, mismatch, _ = compare_outputs(outs, [o.to(r.dtype) for o, r in zip(oracle, outs)], spec.tolerance)
        for i, (out, orc) in enumerate(zip(outs, oracle)):
            if not out.is_floating_point():
                continue
            tol = spec.tolerance[str(out.dtype).removeprefix("torch.")]
            err = (out.double() - orc.double()).abs()
            rows.append({"shape": shape, "stress": stress, "output": i, "passes": ok,
                         "rel_l2": float(err.norm() / orc.double().norm()), "bar": tol.max_rel_l2,
                         "need_atol": max(0.0, float((err - tol.rtol * orc.double().abs()).max())), "atol": tol.atol,
                         "out_rms": float(orc.double().pow(2).mean().sqrt()), "out_max": float(orc.double().abs().max()),
                         "mismatch": None if ok else mismatch.message, "seconds": round(time.monotonic() - t0, 1)})
        del inputs, outs, oracle
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", nargs="*", help="problem names (default: every forward problem)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", choices=["gpu", "cpu"], default="gpu")
    ap.add_argument("--override", type=json.loads, default={}, help="shape variables to replace, as JSON")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "tolerance_check.json")
    args = ap.parse_args(argv)
    problems = all_problems()
    names = args.problems or sorted(n for n, s in problems.items() if s.interface is Interface.forward)
    unknown = [n for n in names if n not in problems]
    if unknown:
        print(f"tolerance_check: unknown problem(s) {unknown}", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                              "torch": torch.__version__, "problems": {}}
    for name in names:
        spec = problems[name]
        rows = []
        for shape in getattr(spec.shapes, args.shapes):
            rows += check(spec, {**shape, **{k: v for k, v in args.override.items() if k in shape}}, args.device)
        report["problems"][name] = rows
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(f"{name}: {'PASS' if all(r['passes'] for r in rows) else 'FAIL'}", flush=True)

    print(f"\n{report['device']}, torch {report['torch']}")
    print("| problem | shape | stress | out | rel L2 | bar | need atol | atol | out rms | out max | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, rows in report["problems"].items():
        for r in rows:
            shape = ",".join(f"{k}={v}" for k, v in r["shape"].items())
            stress = "-" if r["stress"] is None else ",".join(f"{k}={v}" for k, v in r["stress"].items() if v is not None)
            print(f"| {name} | {shape} | {stress} | {r['output']} | {r['rel_l2']:.2e} | {r['bar']:g} | "
                  f"{r['need_atol']:.3g} | {r['atol']:g} | {r['out_rms']:.3g} | {r['out_max']:.3g} | "
                  f"{'PASS' if r['passes'] else 'FAIL'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
