"""`kb bench`: where an evaluation's time goes, how many evaluations a GPU (or this machine, in CPU
mode) gets through, how repeatable a candidate's time is, and whether kb_env's time agrees with
`triton.testing.do_bench` and Nsight Compute.

Sections (each prints its table; everything goes to ``bench.json`` in --out, or $OUT):

1. breakdown: per problem, one *cold* evaluation (``Evaluator(warm=False)``: two freshly spawned
   workers, every cache empty, as before the warm server existed) and the median of the *warm*
   ones: wall seconds per stage, the candidate worker's imports, and how its workers started;
2. stream: a stream of candidates (each problem's known-good solution and three broken ones: a
   crash at import, a wrong answer, a Triton compile error) through warm evaluators, one at a time
   and then `--concurrency` at once with ``overlap`` (see `Evaluator`): evaluations per minute of
   wall time on the one GPU (evaluations per GPU-minute), with the server and reference workers
   already warm;
3. spread: each problem's known-good time per shape over its fresh evaluations (max/min - 1 of the
   medians);
4. do_bench (CUDA): the known-good and the baseline timed by `triton.testing.do_bench` (median, L2
   flushed, in a separate process) against kb_env's medians;
5. ncu (CUDA, where it runs): the known-good's kernel time per shape from Nsight Compute
   (``--clock-control none``, caches flushed) against kb_env's median.

`--budget-s` bounds the whole run: a section that would start past it is skipped and says so."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .evaluate.evaluator import Evaluator
from .evaluate.result import EvalResult
from .problem import Interface, ProblemSpec, all_problems, get_problem

STAGES = ["waiting", "starting", "reference", "loading", "compiling", "correctness", "timing", "baseline", "profiling"]

CRASH = "import os\nos._exit(3)\n"
WRONG = '''

class ModelNew(Model):
    """The reference, answering 1.5 times too much."""

    def forward(self, *args):
        out = super().forward(*args)
        return tuple(o * 1.5 for o in out) if isinstance(out, tuple) else out * 1.5
'''
COMPILE_ERROR = '''
import triton
import triton.language as tl


@triton.jit
def _broken(x_ptr):
    tl.no_such_function(x_ptr)


class ModelNew(Model):
    def forward(self, *args):
        _broken[(1,)](args[0])
        return super().forward(*args)
'''


def broken_candidates(spec: ProblemSpec) -> dict[str, str]:
    """Three deliberately broken candidates for any forward problem: crash, mismatch, compile_error."""
    ref = spec.reference_source()
    return {"crash": CRASH + "\n" + ref.replace("class Model(", "class ModelNew("),
            "wrong": ref + WRONG, "compile_error": ref + COMPILE_ERROR}


def l1_problems(mode: str) -> list[str]:
    """Level-1 forward problems with a known-good solution (in CPU mode, those with CPU shapes)."""
    return sorted(n for n, s in all_problems().items() if s.level == 1 and s.interface is Interface.forward
                  and s.solution_paths and not (mode == "cpu" and s.gpu_only))


def _summary(r: EvalResult) -> dict[str, Any]:
    return {"problem": r.problem, "correct": r.correct, "error": r.error.value if r.error else None,
            "flags": r.flags, "wall_s": r.wall_s, "stage_s": r.stage_s,
            "perf": r.perf.model_dump() if r.perf else None,
            "timings": [{"shape": t.shape, "candidate_ms": t.candidate.median_ms, "iqr": t.candidate.rel_spread,
                         "baseline_ms": t.baseline.median_ms, "baseline_cached": t.baseline_cached,
                         "baseline_check_ms": t.baseline_check_ms} for t in r.timings],
            "device": r.device.model_dump() if r.device else None, "message": r.message[:300]}


class Bench:
    def __init__(self, mode: str, problems: list[str], repeats: int, concurrency: int, budget_s: float,
                 out: Path | None, progress: bool = True):
        self.mode, self.problems, self.repeats, self.concurrency = mode, problems, repeats, concurrency
        self.deadline = time.monotonic() + budget_s
        self.out = out
        self.progress = progress
        self.record: dict[str, Any] = {"mode": mode, "problems": problems, "repeats": repeats,
                                       "concurrency": concurrency, "skipped": []}
        self._lock = threading.Lock()

    # ----- plumbing -------------------------------------------------------------------------
    def say(self, text: str) -> None:
        if self.progress:
            print(text, file=sys.stderr, flush=True)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def skip(self, section: str, why: str) -> None:
        self.record["skipped"].append(f"{section}: {why}")
        self.say(f"[{section}] skipped: {why}")

    def save(self) -> None:
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "bench.json").write_text(json.dumps(self.record, indent=1, default=str))

    def known_good(self, name: str) -> str:
        return get_problem(name).solution_paths[0].read_text()

    # ----- 1. breakdown ---------------------------------------------------------------------
    def breakdown(self) -> None:
        rows = []
        for name in self.problems:
            if self.left() < 60:
                self.skip("breakdown", f"{name} and later: out of time")
                break
            spec = get_problem(name)
            with Evaluator(spec, self.mode, warm=False) as cold_ev:
                cold = cold_ev.evaluate(self.known_good(name))
            self.say(f"[breakdown] {name} cold: {cold.wall_s:.1f} s correct={cold.correct}")
            rows.append({"problem": name, "path": "cold", **_summary(cold)})
            self.save()
        self.record["breakdown"] = rows

    # ----- 2. stream ------------------------------------------------------------------------
    def _stream_jobs(self) -> list[tuple[str, str, str]]:
        jobs = []
        for name in self.problems:
            spec = get_problem(name)
            broken = broken_candidates(spec)
            good = self.known_good(name)
            jobs += [(name, "known-good", good)] * self.repeats + [(name, k, v) for k, v in broken.items()]
        # interleave problems as a real stream would
        by_problem = {n: [j for j in jobs if j[0] == n] for n in self.problems}
        out = []
        while any(by_problem.values()):
            for n in self.problems:
                if by_problem[n]:
                    out.append(by_problem[n].pop(0))
        return out

    def stream(self, overlap: bool, threads: int) -> dict[str, Any] | None:
        label = f"{'overlap' if overlap else 'exclusive'} x{threads}"
        jobs = self._stream_jobs()
        evaluators = {n: Evaluator(get_problem(n), self.mode, overlap=overlap) for n in self.problems}
        try:
            for n, ev in evaluators.items():  # warm: the server, a reference worker, the baseline kept
                if self.left() < 30:
                    self.skip(f"stream {label}", "out of time while warming up")
                    return None
                warm = ev.evaluate(self.known_good(n))
                self.say(f"[stream {label}] warm-up {n}: {warm.wall_s:.1f} s correct={warm.correct}")
            results: list[dict[str, Any]] = []

            def run(job: tuple[str, str, str]) -> None:
                name, kind, source = job
                if self.left() < 5:
                    return
                r = evaluators[name].evaluate(source)
                with self._lock:
                    results.append({"kind": kind, **_summary(r)})
                self.say(f"[stream {label}] {name} {kind}: {r.wall_s:.1f} s error={r.error and r.error.value}")

            t0 = time.monotonic()
            with ThreadPoolExecutor(max_workers=threads) as pool:
                list(pool.map(run, jobs))
            wall = time.monotonic() - t0
        finally:
            for ev in evaluators.values():
                ev.close()
        if len(results) < len(jobs):
            self.record["skipped"].append(f"stream {label}: {len(jobs) - len(results)} of {len(jobs)} jobs not run")
        good = [r for r in results if r["kind"] == "known-good"]
        return {"label": label, "overlap": overlap, "threads": threads, "evaluations": len(results), "wall_s": wall,
                "per_minute": 60 * len(results) / wall if wall > 0 else None,
                "known_good_correct": sum(r["correct"] and not r["flags"] for r in good), "known_good": len(good),
                "expected_errors": sum(r["error"] == {"crash": "crash", "wrong": "mismatch",
                                                      "compile_error": "compile_error"}.get(r["kind"], r["error"])
                                       for r in results if r["kind"] != "known-good"),
                "broken": sum(r["kind"] != "known-good" for r in results),
                "results": results}

    def streams(self) -> None:
        self.record["streams"] = []
        for overlap, threads in ((False, 1), (True, self.concurrency)):
            if self.left() < 90:
                self.skip("stream", f"{'overlap' if overlap else 'exclusive'}: out of time")
                continue
            got = self.stream(overlap, threads)
            if got is not None:
                self.record["streams"].append(got)
                self.save()

    # ----- 3. spread --------------------------------------------------------------------------
    def spread(self) -> None:
        out = []
        for name in self.problems:
            runs = [r for s in self.record.get("streams", []) if not s["overlap"] for r in s["results"]
                    if r["problem"] == name and r["kind"] == "known-good" and r["timings"]]
            if len(runs) < 2:
                continue
            for i, t in enumerate(runs[0]["timings"]):
                meds = [r["timings"][i]["candidate_ms"] for r in runs if len(r["timings"]) > i]
                out.append({"problem": name, "shape": t["shape"], "medians_ms": meds,
                            "spread": max(meds) / min(meds) - 1})
        self.record["spread"] = out

    # ----- 4. do_bench, 5. ncu -------------------------------------------------------------------
    def kb_medians(self) -> dict[tuple[str, str], dict[str, float]]:
        """kb_env's median of the known-good and of the baseline per (problem, shape), over the
        exclusive stream's evaluations."""
        acc: dict[tuple[str, str], dict[str, list[float]]] = {}
        for s in self.record.get("streams", []):
            if s["overlap"]:
                continue
            for r in s["results"]:
                if r["kind"] != "known-good":
                    continue
                for t in r["timings"]:
                    d = acc.setdefault((r["problem"], json.dumps(t["shape"], sort_keys=True)), {"cand": [], "base": []})
                    d["cand"].append(t["candidate_ms"])
                    d["base"].append(t["baseline_ms"])
        return {k: {"cand": statistics.median(v["cand"]), "base": statistics.median(v["base"])} for k, v in acc.items()}

    def dobench(self) -> None:
        rows = []
        kb = self.kb_medians()
        for name in self.problems:
            if self.left() < 45:
                self.skip("do_bench", f"{name} and later: out of time")
                break
            got = _child(["dobench", name], timeout=min(300, self.left()))
            if "error" in got:
                rows.append({"problem": name, "error": got["error"]})
                continue
            for entry in got["shapes"]:
                key = (name, json.dumps(entry["shape"], sort_keys=True))
                mine = kb.get(key, {})
                rows.append({"problem": name, "shape": entry["shape"], "do_bench_ms": entry["candidate_ms"],
                             "kb_ms": mine.get("cand"), "do_bench_base_ms": entry["baseline_ms"],
                             "kb_base_ms": mine.get("base"),
                             "ratio": mine["cand"] / entry["candidate_ms"] if mine.get("cand") else None,
                             "base_ratio": mine["base"] / entry["baseline_ms"] if mine.get("base") else None})
            self.save()
        self.record["do_bench"] = rows

    def ncu(self) -> None:
        exe = shutil.which("ncu")
        if exe is None:
            self.record["ncu"] = {"error": "ncu is not on PATH"}
            return
        if self.left() < 90:
            self.skip("ncu", "out of time")
            return
        name = self.problems[0]
        cmd = [exe, "--clock-control", "none", "--cache-control", "all", "--target-processes", "all",
               "--nvtx", "--nvtx-include", "kb_call/", "--metrics", "gpu__time_duration.sum", "--csv",
               sys.executable, "-c", f"from kb_env.bench import _child_main; _child_main(['ncu_calls', {name!r}])"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=min(240, self.left()))
        except subprocess.TimeoutExpired:
            self.record["ncu"] = {"problem": name, "error": "ncu ran past its time limit"}
            return
        kernels = _parse_ncu_csv(proc.stdout)
        kb = self.kb_medians()
        out: dict[str, Any] = {"problem": name, "returncode": proc.returncode, "kernels": kernels,
                               "stderr_tail": proc.stderr[-1500:], "stdout_tail": proc.stdout[-1500:]}
        shapes = get_problem(name).shapes_for("cuda")
        per_shape = []
        for si, shape in enumerate(shapes):
            ks = [k for k in kernels if k["range"] == f"kb_call_{si}"]
            if ks:
                ms = sum(k["ms"] for k in ks)
                mine = kb.get((name, json.dumps(shape, sort_keys=True)), {}).get("cand")
                per_shape.append({"shape": shape, "ncu_ms": ms, "kb_ms": mine, "ratio": mine / ms if mine else None})
        out["shapes"] = per_shape
        if not kernels:
            out["error"] = "no kernel rows from ncu (see stderr_tail: counters may be off limits here)"
        self.record["ncu"] = out

    # ----- all --------------------------------------------------------------------------------
    def run(self, sections: list[str]) -> dict[str, Any]:
        from .sandbox import server

        t0 = time.monotonic()
        if "breakdown" in sections:
            self.breakdown()
        if "stream" in sections:
            self.streams()
            self.spread()
        if self.mode == "cuda" and "dobench" in sections:
            self.dobench()
        if self.mode == "cuda" and "ncu" in sections:
            self.ncu()
        self.record["server_error"] = server.last_error
        self.record["wall_s"] = time.monotonic() - t0
        self.save()
        return self.record


# ----- children (do_bench and ncu run in their own process, on a GPU) -----------------------------
def _child(args: list[str], timeout: float) -> dict[str, Any]:
    try:
        proc = subprocess.run([sys.executable, "-c", f"from kb_env.bench import _child_main; _child_main({args!r})"],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{args[0]} ran past {timeout:.0f} s"}
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        return {"error": (proc.stderr or proc.stdout)[-1500:]}
    return json.loads(line)


def _models(name: str, shape: dict[str, int]):
    """The known-good candidate and the baseline for one shape, on the GPU, with the same weights,
    and the inputs of one seed (as the workers make them)."""
    import torch

    from .problem import import_file, import_source
    from .sandbox.cases import init_inputs, make_inputs, make_reference_model

    spec = get_problem(name)
    ref_mod = import_source(spec.reference_source(), "kb_reference", str(spec.reference_path))
    sol = import_file(spec.solution_paths[0], "kb_solution")
    ref = make_reference_model(ref_mod, shape, 1234)
    base = ref
    if spec.baseline_path is not None and spec.baseline.value == "baseline.py":
        base_mod = import_source(spec.baseline_path.read_text(), "kb_baseline", str(spec.baseline_path))
        base = base_mod.Model(*init_inputs(ref_mod, shape))
        base.load_state_dict(ref.state_dict(), strict=True)
    cls = getattr(sol, "ModelNew", None) or sol.Model
    cand = cls(*init_inputs(ref_mod, shape))
    cand.load_state_dict(ref.state_dict(), strict=True)
    base = base.cuda().eval()
    if spec.baseline.value == "compile":
        base = torch.compile(base)
    return cand.cuda().eval(), base, make_inputs(ref_mod, shape, 99, "cuda")


def _child_main(args: list[str]) -> None:
    import torch

    what, name = args[0], args[1]
    spec = get_problem(name)
    if what == "dobench":
        from triton.testing import do_bench

        shapes = []
        for shape in spec.shapes_for("cuda"):
            cand, base, inputs = _models(name, shape)
            with torch.no_grad():
                c = do_bench(lambda: cand(*inputs), warmup=100, rep=500, return_mode="median")
                b = do_bench(lambda: base(*inputs), warmup=100, rep=500, return_mode="median")
            shapes.append({"shape": shape, "candidate_ms": c, "baseline_ms": b})
            del cand, base, inputs
            torch.cuda.empty_cache()
        print(json.dumps({"gpu": torch.cuda.get_device_name(0), "shapes": shapes}))
    elif what == "ncu_calls":  # run under ncu: warm-up calls, then one call per shape in an NVTX range
        for si, shape in enumerate(spec.shapes_for("cuda")):
            cand, _, inputs = _models(name, shape)
            with torch.no_grad():
                for _ in range(3):
                    cand(*inputs)
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_push(f"kb_call_{si}")
                cand(*inputs)
                torch.cuda.nvtx.range_pop()
                torch.cuda.synchronize()
            del cand, inputs
        print(json.dumps({"ok": True}))


def _parse_ncu_csv(text: str) -> list[dict[str, Any]]:
    """Kernel rows of `ncu --csv` (gpu__time_duration.sum, in ms) with the NVTX range they ran in."""
    import csv
    import io

    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return []
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    out = []
    for row in rows:
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:
            value = float(str(row.get("Metric Value", "")).replace(",", ""))
        except ValueError:
            continue
        unit = (row.get("Metric Unit") or "").strip()
        scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3}
        ms = value * scale.get(unit, 1e-6)
        nvtx = next((v for k, v in row.items() if k and "NVTX" in k and v), "")
        rng = next((part for part in nvtx.replace("/", " ").replace(":", " ").split() if part.startswith("kb_call_")), "")
        out.append({"kernel": row.get("Kernel Name", "")[:120], "ms": ms, "range": rng})
    return out


# ----- the report ----------------------------------------------------------------------------------
def render(record: dict[str, Any]) -> str:
    mode = record["mode"]
    gpu = next((r["device"]["name"] for s in record.get("streams", []) for r in s["results"] if r.get("device")), None)
    lines = [f"kb bench: {mode} mode" + (f" on {gpu}" if gpu else "") + (" (CPU figures: timing not meaningful)"
                                                                         if mode == "cpu" else "")]
    if record.get("server_error"):
        lines.append(f"warm server: {record['server_error']}")
    warm_rows = []
    for s in record.get("streams", []):
        if s["overlap"]:
            continue
        for name in record["problems"]:
            rs = [r for r in s["results"] if r["problem"] == name and r["kind"] == "known-good"]
            if rs:
                warm_rows.append({"problem": name, "path": "warm (median)", "wall_s": statistics.median(r["wall_s"] for r in rs),
                                  "stage_s": {k: statistics.median(r["stage_s"].get(k, 0.0) for r in rs) for k in STAGES},
                                  "perf": rs[-1]["perf"]})
    rows = record.get("breakdown", []) + warm_rows
    if rows:
        lines += ["", "| problem | evaluation | wall s | " + " | ".join(STAGES) + " | imports s | candidate start |",
                  "|---|---|---|" + "---|" * len(STAGES) + "---|---|"]
        for r in sorted(rows, key=lambda r: (r["problem"], r["path"])):
            perf = r.get("perf") or {}
            imports = "-" if perf.get("import_s") is None else f"{perf['import_s']:.2f}"
            stages = " | ".join(f"{r['stage_s'].get(k, 0.0):.2f}" for k in STAGES)
            lines.append(f"| {r['problem']} | {r['path']} | {r['wall_s']:.2f} | {stages} | {imports} | "
                         f"{perf.get('candidate_start')} |")
    if record.get("streams"):
        per = "GPU-minute" if mode == "cuda" else "minute (CPU mode, this machine)"
        lines += ["", f"| stream | evaluations | wall s | evaluations per {per} | known-good correct | broken graded as expected |",
                  "|---|---|---|---|---|---|"]
        for s in record["streams"]:
            lines.append(f"| {s['label']} | {s['evaluations']} | {s['wall_s']:.1f} | {s['per_minute']:.1f} | "
                         f"{s['known_good_correct']}/{s['known_good']} | {s['expected_errors']}/{s['broken']} |")
    if record.get("spread"):
        lines += ["", "| problem | shape | known-good median ms per fresh evaluation | spread (max/min - 1) |", "|---|---|---|---|"]
        for r in record["spread"]:
            lines.append(f"| {r['problem']} | {r['shape']} | {', '.join(f'{m:.4f}' for m in r['medians_ms'])} | "
                         f"{r['spread']:.2%} |")
    if record.get("do_bench"):
        lines += ["", "| problem | shape | kb_env ms | do_bench ms | kb/do_bench | baseline kb ms | baseline do_bench ms | kb/do_bench |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in record["do_bench"]:
            if "error" in r:
                lines.append(f"| {r['problem']} | error: {r['error'].splitlines()[-1][:100] if r['error'] else ''} |")
                continue
            f = lambda v, spec: format(v, spec) if v is not None else "-"  # noqa: E731
            lines.append(f"| {r['problem']} | {r['shape']} | {f(r['kb_ms'], '.4f')} | {r['do_bench_ms']:.4f} | "
                         f"{f(r['ratio'], '.3f')} | {f(r['kb_base_ms'], '.4f')} | {r['do_bench_base_ms']:.4f} | "
                         f"{f(r['base_ratio'], '.3f')} |")
    if record.get("ncu"):
        n = record["ncu"]
        if n.get("shapes"):
            lines += ["", "| problem | shape | kb_env ms | ncu kernel ms | kb/ncu |", "|---|---|---|---|---|"]
            for r in n["shapes"]:
                lines.append(f"| {n['problem']} | {r['shape']} | {r['kb_ms'] if r['kb_ms'] is None else format(r['kb_ms'], '.4f')} | "
                             f"{r['ncu_ms']:.4f} | {r['ratio'] if r['ratio'] is None else format(r['ratio'], '.3f')} |")
        if n.get("error"):
            lines.append(f"ncu: {n['error']}")
    for s in record.get("skipped", []):
        lines.append(f"skipped: {s}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="kb bench", description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    return run_cli(ap.parse_args(argv))


def add_arguments(ap) -> None:
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--problems", nargs="+", help="default: every level-1 forward problem with a known-good solution")
    ap.add_argument("--repeats", type=int, default=4, help="known-good evaluations per problem in each stream")
    ap.add_argument("--concurrency", type=int, default=3, help="evaluations at once in the overlapped stream")
    ap.add_argument("--sections", nargs="+", default=["breakdown", "stream", "dobench", "ncu"],
                    choices=["breakdown", "stream", "dobench", "ncu"])
    ap.add_argument("--budget-s", type=float, default=450.0, help="stop starting sections past this (seconds)")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for bench.json (default: $OUT)")


def run_cli(args) -> int:
    from .env import resolve_device

    mode = resolve_device(args.device)
    problems = args.problems or l1_problems(mode)
    for name in problems:
        get_problem(name)
    bench = Bench(mode, problems, args.repeats, args.concurrency, args.budget_s, Path(args.out) if args.out else None)
    record = bench.run(args.sections)
    print(render(record))
    return 0
