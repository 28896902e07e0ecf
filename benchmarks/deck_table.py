"""The problem deck on a GPU: per problem and GPU shape, the eager reference, torch.compile of it,
the library bar where the problem ships one (``library.py``: the same contract as the reference,
through a vendor path such as ``torch._scaled_mm``), and every known-good solution: correct
against the reference at the problem's tolerance, its time, speedup over the problem's baseline
and peak_fraction.

    python benchmarks/deck_table.py [--problems a b ...] [--no-compile] [--warm-jobs 8]
                                    [--evaluate] [--out deck.json]

Everything is timed the harness's way (`kb_env.sandbox.timing.time_cuda`: CUDA-event medians
over fresh inputs per call, the L2 flushed before each), in this process: only the problems' own
trusted code runs here (references, baselines, libraries, the shipped known-good solutions).
torch.compile is slow to compile (tens of seconds a shape): `--warm-jobs N` first compiles every
problem in N processes at once, filling inductor's on-disk cache, so the timed pass reuses it.
A problem whose warm-up compile takes longer than `--warm-timeout` is timed without it (its
compile column says n/a, the JSON says why). `--evaluate` also runs each known-good solution through the harness (`Evaluator`, fresh workers,
profiler and checks) and records its verdict, launches and flags. The JSON is rewritten after
every problem, so a run cut short keeps what it finished. Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kb_env import all_problems  # noqa: E402
from kb_env.evaluate.correctness import compare_outputs  # noqa: E402
from kb_env.evaluate.roofline import peak_fraction  # noqa: E402
from kb_env.hardware import lookup  # noqa: E402
from kb_env.problem import BaselineKind, Interface, ProblemSpec, import_file  # noqa: E402
from kb_env.sandbox.cases import as_output_list, init_inputs, make_inputs, make_reference_model  # noqa: E402
from kb_env.sandbox.timing import time_cuda  # noqa: E402

WARMUP, REPS = 5, 30


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _time(model: Any, reference: Any, shape: dict[str, int]) -> float:
    """Median ms of `model` on fresh inputs per call, L2 flushed before each."""
    def make(seed: int) -> list[Any]:
        return make_inputs(reference, shape, seed, "cuda")

    with torch.no_grad():
        times, _ = time_cuda(model, make, list(range(WARMUP + REPS)), WARMUP, 0, "cuda")
    return _median(times)


def _build(module: Any, reference: Any, shape: dict[str, int], state: dict[str, torch.Tensor] | None,
           cls_name: str = "Model") -> torch.nn.Module:
    cls = getattr(module, "ModelNew", None) if cls_name == "ModelNew" else None
    cls = cls or getattr(module, "Model")
    model = cls(*init_inputs(reference, shape))
    if state is not None:
        model.load_state_dict(state, strict=True)
    return model.to("cuda").eval()


def measure(spec: ProblemSpec, compile_too: bool | str) -> list[dict[str, Any]]:
    """Per GPU shape: eager / compiled / library / baseline ms, and each known-good solution's
    correctness (one fresh input set against the eager reference) and ms. `compile_too` as a string:
    why torch.compile is skipped (recorded as the rows' compile_error)."""
    reference = import_file(spec.reference_path, f"deck_ref_{spec.name}")
    library_path = spec.folder / "library.py"
    library = import_file(library_path, f"deck_lib_{spec.name}") if library_path.exists() else None
    baseline = import_file(spec.baseline_path, f"deck_base_{spec.name}") if spec.baseline_path else None
    solutions = {p.name: import_file(p, f"deck_sol_{spec.name}_{p.stem}") for p in spec.solution_paths}
    gpu = lookup(torch.cuda.get_device_name())
    rows = []
    for shape in spec.shapes.gpu:
        ref = make_reference_model(reference, shape, param_seed=0).to("cuda").eval()
        state = ref.state_dict()
        row: dict[str, Any] = {"shape": shape, "eager_ms": _time(ref, reference, shape)}
        if isinstance(compile_too, str):
            row["compile_error"] = compile_too
        elif compile_too:
            try:
                row["compile_ms"] = _time(torch.compile(ref), reference, shape)
            except Exception as exc:  # noqa: BLE001 (a problem torch.compile cannot handle is reported, not fatal)
                row["compile_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        if library is not None:
            row["library_ms"] = _time(_build(library, reference, shape, state), reference, shape)
        if baseline is not None:
            row["baseline_file_ms"] = _time(_build(baseline, reference, shape, state), reference, shape)
        bar = {BaselineKind.eager: "eager_ms", BaselineKind.compile: "compile_ms",
               BaselineKind.file: "baseline_file_ms"}[spec.baseline]
        row["baseline_ms"] = row.get(bar)
        inputs = make_inputs(reference, shape, 12345, "cuda")
        with torch.no_grad():
            expected = [o.detach() for o in as_output_list(ref(*inputs))]
        row["solutions"] = {}
        for name, module in solutions.items():
            sol: dict[str, Any] = {}
            try:
                model = _build(module, reference, shape, state, "ModelNew")
                with torch.no_grad():
                    got = as_output_list(model(*inputs))
                ok, mismatch, stats = compare_outputs(got, expected, spec.tolerance)
                sol.update(correct=ok, rel_l2_err=stats.get("rel_l2_err"),
                           mismatch=mismatch.message if mismatch else None)
                ms = _time(model, reference, shape)
                sol["ms"] = ms
                if row["baseline_ms"]:
                    sol["speedup"] = row["baseline_ms"] / ms
                if gpu is not None:
                    sol["peak_fraction"], sol["regime"] = peak_fraction(spec.flops_of(shape), spec.bytes_of(shape), ms,
                                                                        gpu, spec.compute_dtype)
                del model
            except Exception as exc:  # noqa: BLE001 (a solution that breaks on this GPU is a row, not a crash)
                sol["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            row["solutions"][name] = sol
        del ref, state, inputs, expected
        torch.cuda.empty_cache()
        rows.append(row)
    return rows


def evaluate(spec: ProblemSpec) -> list[dict[str, Any]]:
    """Each known-good solution through the harness, as any candidate."""
    from kb_env.evaluate.evaluator import Evaluator

    out = []
    for path in spec.solution_paths:
        res = Evaluator(spec, "cuda").evaluate(path.read_text())
        out.append({"solution": path.name, "correct": res.correct, "error": res.error.value if res.error else None,
                    "flags": res.flags, "message": res.message[:300], "speedup": res.speedup,
                    "peak_fraction": res.peak_fraction, "launches": res.kernel_launches,
                    "own_share": res.own_kernel_share, "wall_s": round(res.wall_s, 1)})
    return out


def warm(names: list[str], jobs: int, timeout_s: float) -> dict[str, str]:
    """Compile every problem's reference in `jobs` processes at once (fills inductor's disk cache).
    Returns the problems whose compile did not finish within `timeout_s` or failed, with why: the
    timed pass skips torch.compile for them (a reference with a Python loop over chunks unrolls
    into a graph inductor takes many minutes to compile)."""
    def one(name: str) -> tuple[str, str | None]:
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, __file__, "--warm-only", "--problems", name],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # inductor's compile workers too
            proc.wait()
            return name, f"compile not done in {timeout_s:.0f} s"
        if proc.returncode != 0:
            return name, f"compile failed (rc {proc.returncode}): {err.strip()[-200:]}"
        print(f"  warmed {name} in {time.monotonic() - t0:.0f} s", flush=True)
        return name, None

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        skipped = {name: why for name, why in pool.map(one, names) if why}
    for name, why in skipped.items():
        print(f"  {name}: {why}; torch.compile skipped", flush=True)
    return skipped


def _warm_only(spec: ProblemSpec) -> None:
    reference = import_file(spec.reference_path, f"deck_ref_{spec.name}")
    for shape in spec.shapes.gpu:
        ref = torch.compile(make_reference_model(reference, shape, param_seed=0).to("cuda").eval())
        with torch.no_grad():
            ref(*make_inputs(reference, shape, 0, "cuda"))
        torch.cuda.synchronize()


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", nargs="*", help="problem names (default: every forward problem)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--warm-jobs", type=int, default=0, help="compile every problem first in N processes at once")
    ap.add_argument("--warm-timeout", type=float, default=150.0,
                    help="seconds a problem's compile warm-up may take before torch.compile is skipped for it")
    ap.add_argument("--warm-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--evaluate", action="store_true", help="also evaluate each known-good solution through the harness")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "deck_table.json")
    args = ap.parse_args(argv)
    if args.warm_timeout <= 0:
        ap.error("--warm-timeout must be positive")
    if not torch.cuda.is_available():
        print("deck_table: needs a CUDA GPU", file=sys.stderr)
        return 2
    problems = all_problems()
    names = args.problems or sorted(n for n, s in problems.items() if s.interface is Interface.forward)
    unknown = [n for n in names if n not in problems]
    if unknown:
        print(f"deck_table: unknown problem(s) {unknown}", file=sys.stderr)
        return 2
    if args.warm_only:
        for name in names:
            _warm_only(problems[name])
        return 0
    skip_compile: dict[str, str] = {}
    if args.warm_jobs and not args.no_compile:
        t0 = time.monotonic()
        skip_compile = warm(names, args.warm_jobs, args.warm_timeout)
        print(f"compile warm-up: {time.monotonic() - t0:.0f} s", flush=True)
    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "problems": {}}
    for name in names:
        spec = problems[name]
        t0 = time.monotonic()
        entry: dict[str, Any] = {"baseline": spec.baseline.value, "level": spec.level}
        try:
            entry["shapes"] = measure(spec, skip_compile.get(name, not args.no_compile))
            if args.evaluate:
                entry["evaluated"] = evaluate(spec)
        except Exception:  # noqa: BLE001 (one broken problem must not lose the others' rows)
            entry["error"] = traceback.format_exc()[-2000:]
        entry["seconds"] = round(time.monotonic() - t0, 1)
        report["problems"][name] = entry
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        torch.cuda.empty_cache()
        print(f"[{len(report['problems'])}/{len(names)}] {name}: {entry['seconds']} s"
              + (" ERROR " + entry["error"].strip().splitlines()[-1][:200] if "error" in entry else ""), flush=True)

    print(f"\n{report['gpu']}, torch {report['torch']}")
    print("| problem | shape | eager ms | compile ms | library ms | known-good | correct | ms | speedup | peak frac |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, e in report["problems"].items():
        if "error" in e:
            print(f"| {name} | ERROR: {e['error'].strip().splitlines()[-1][:80]} |")
            continue
        for row in e["shapes"]:
            shape = ",".join(f"{k}={v}" for k, v in row["shape"].items())
            sols = row["solutions"] or {"-": {}}
            for sol_name, sol in sols.items():
                ok = sol.get("error", "")[:40] or ("yes" if sol.get("correct") else ("NO" if sol else "-"))
                compiled = _fmt(row.get("compile_ms")) if "compile_error" not in row else "n/a"
                print(f"| {name} | {shape} | {_fmt(row['eager_ms'])} | {compiled} | "
                      f"{_fmt(row.get('library_ms'))} | {sol_name} | {ok} | {_fmt(sol.get('ms'))} | "
                      f"{_fmt(sol.get('speedup'), '.2f')} | {_fmt(sol.get('peak_fraction'))} |")
        for ev in e.get("evaluated", []):
            print(f"| {name} | (harness) | | | | {ev['solution']} | {'yes' if ev['correct'] and not ev['flags'] else ev['error']} "
                  f"{','.join(ev['flags'])} | | {_fmt(ev['speedup'], '.2f')} | {_fmt(ev['peak_fraction'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
