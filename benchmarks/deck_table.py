"""The problem deck on a GPU: per problem and GPU shape, the eager reference, torch.compile of it,
the library bar where the problem ships one (``library.py``: the same contract as the reference,
through a vendor path such as ``torch._scaled_mm``), and every known-good solution evaluated by
the harness (correct, flags, ms, speedup over the problem's baseline, peak_fraction, launches).

    python benchmarks/deck_table.py [--problems a b ...] [--no-compile] [--out deck.json]

Eager, compiled and library times are CUDA-event medians over fresh inputs per call with the L2
flushed before each (`kb_env.sandbox.timing.time_cuda`), in this process: only the problems' own
trusted code runs here. Known-good solutions run through `Evaluator` like any candidate. The JSON
is rewritten after every problem, so a run cut short keeps what it finished. Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kb_env import all_problems  # noqa: E402
from kb_env.evaluate.evaluator import Evaluator  # noqa: E402
from kb_env.problem import Interface, ProblemSpec, import_file  # noqa: E402
from kb_env.sandbox.cases import init_inputs, make_inputs, make_reference_model  # noqa: E402
from kb_env.sandbox.timing import time_cuda  # noqa: E402

WARMUP, REPS = 5, 30


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _time(model: torch.nn.Module, reference: Any, shape: dict[str, int]) -> float:
    """Median ms of `model` on fresh inputs per call, L2 flushed before each."""
    def make(seed: int) -> list[Any]:
        return make_inputs(reference, shape, seed, "cuda")

    with torch.no_grad():
        times, _ = time_cuda(model, make, list(range(WARMUP + REPS)), WARMUP, 0, "cuda")
    return _median(times)


def baselines(spec: ProblemSpec, compile_too: bool) -> list[dict[str, Any]]:
    """Eager / compiled / library ms per GPU shape."""
    reference = import_file(spec.reference_path, f"deck_ref_{spec.name}")
    library_path = spec.folder / "library.py"
    library = import_file(library_path, f"deck_lib_{spec.name}") if library_path.exists() else None
    rows = []
    for shape in spec.shapes.gpu:
        ref = make_reference_model(reference, shape, param_seed=0).to("cuda").eval()
        row: dict[str, Any] = {"shape": shape, "eager_ms": _time(ref, reference, shape)}
        if compile_too:
            try:
                row["compile_ms"] = _time(torch.compile(ref), reference, shape)
            except Exception as exc:  # noqa: BLE001 (a problem torch.compile cannot handle is reported, not fatal)
                row["compile_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        if library is not None:
            lib = library.Model(*init_inputs(reference, shape))
            lib.load_state_dict(ref.state_dict(), strict=True)
            row["library_ms"] = _time(lib.to("cuda").eval(), reference, shape)
        del ref
        torch.cuda.empty_cache()
        rows.append(row)
    return rows


def known_good(spec: ProblemSpec) -> list[dict[str, Any]]:
    out = []
    for path in spec.solution_paths:
        res = Evaluator(spec, "cuda").evaluate(path.read_text())
        out.append({"solution": path.name, "correct": res.correct, "error": res.error.value if res.error else None,
                    "flags": res.flags, "message": res.message[:300], "runtime_ms": res.runtime_ms,
                    "baseline_ms": res.baseline_ms, "speedup": res.speedup, "peak_fraction": res.peak_fraction,
                    "launches": res.kernel_launches, "wall_s": round(res.wall_s, 1),
                    "per_shape": [{"shape": t.shape, "ms": t.candidate.median_ms, "baseline_ms": t.baseline.median_ms,
                                   "peak_fraction": t.peak_fraction} for t in res.timings]})
    return out


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", nargs="*", help="problem names (default: every forward problem)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (it takes a while per shape)")
    ap.add_argument("--no-solutions", action="store_true", help="baselines only")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "deck_table.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("deck_table: needs a CUDA GPU", file=sys.stderr)
        return 2
    problems = all_problems()
    names = args.problems or sorted(n for n, s in problems.items() if s.interface is Interface.forward)
    unknown = [n for n in names if n not in problems]
    if unknown:
        print(f"deck_table: unknown problem(s) {unknown}", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "problems": {}}
    for name in names:
        spec = problems[name]
        t0 = time.monotonic()
        entry: dict[str, Any] = {"baseline": spec.baseline.value, "regime": spec.regime}
        try:
            entry["shapes"] = baselines(spec, not args.no_compile)
            entry["solutions"] = [] if args.no_solutions else known_good(spec)
        except Exception:  # noqa: BLE001 (one broken problem must not lose the others' rows)
            entry["error"] = traceback.format_exc()[-2000:]
        entry["seconds"] = round(time.monotonic() - t0, 1)
        report["problems"][name] = entry
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(f"[{len(report['problems'])}/{len(names)}] {name}: {entry['seconds']} s"
              + (" ERROR" if "error" in entry else ""), flush=True)

    print(f"\n{report['gpu']}, torch {report['torch']}")
    print("| problem | shape | eager ms | compile ms | library ms | solution | ok | ms | speedup | peak frac | launches |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, e in report["problems"].items():
        if "error" in e:
            print(f"| {name} | ERROR: {e['error'].strip().splitlines()[-1][:80]} |")
            continue
        sols = e["solutions"] or [{}]
        for i, row in enumerate(e["shapes"]):
            shape = ",".join(f"{k}={v}" for k, v in row["shape"].items())
            for sol in sols:
                per = (sol.get("per_shape") or [{}] * len(e["shapes"]))[i] if sol else {}
                ok = "yes" if sol.get("correct") and not sol.get("flags") else (
                    ("FLAG " + ",".join(sol["flags"])) if sol.get("flags") else (sol.get("error") or "-"))
                print(f"| {name} | {shape} | {_fmt(row['eager_ms'])} | {_fmt(row.get('compile_ms'))} | "
                      f"{_fmt(row.get('library_ms'))} | {sol.get('solution', '-')} | {ok} | {_fmt(per.get('ms'))} | "
                      f"{_fmt(sol.get('speedup'), '.2f')} | {_fmt(per.get('peak_fraction'))} | {sol.get('launches', '-')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
