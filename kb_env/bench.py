"""`kb bench`: where an evaluation's time goes, how many evaluations a GPU (or this machine, in CPU
mode) gets through, how repeatable a candidate's time is, and whether kb_env's time agrees with
`triton.testing.do_bench` and Nsight Compute.

Sections, in the order they run (each prints its table; everything goes to ``bench.json`` in
--out, or $OUT):

1. stream: warm evaluators, one per problem, each warmed by one evaluation of its known-good
   solution (the warm server started, a reference worker set up, the baseline measured); then a
   stream interleaving the problems: `--repeats` evaluations of each known-good solution and one
   broken candidate per problem (a crash at import, a wrong answer or a Triton compile error, in
   turn), one at a time. Evaluations per minute of wall time on the one GPU (evaluations per
   GPU-minute), over the whole stream and over the known-good evaluations alone; per-stage
   medians of the known-good evaluations;
2. spread: each known-good time per shape over its `--repeats` fresh evaluations of the stream
   (each a fresh candidate process): max/min - 1 of their medians;
3. do_bench (CUDA): the known-good and the baseline timed by `triton.testing.do_bench` (median,
   its L2 flush) in one separate process, against kb_env's medians from the stream;
4. breakdown: a *cold* evaluation (``Evaluator(warm=False)``: two freshly spawned workers, every
   cache empty) of the first `--cold` problems, beside the warm medians of the stream;
5. overlap: the same stream `--concurrency` evaluations at once with ``overlap`` (compiling and
   checking while another evaluation measures; see `Evaluator`);
6. ncu (CUDA, where it runs): the first problem's known-good kernel time per shape from Nsight
   Compute (``--clock-control none``, caches flushed) against kb_env's median.

`--budget-s` bounds the whole run: each section has a share of what is left, a section that would
start too late is skipped and says so, and a failing section is recorded and the next one runs.
The last thing printed is a short summary table beside the issue's targets."""

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
                 out: Path | None, cold: int = 3, progress: bool = True):
        self.mode, self.problems, self.repeats, self.concurrency = mode, problems, repeats, concurrency
        self.cold = cold
        self.deadline = time.monotonic() + budget_s
        self.out = out
        self.progress = progress
        self.record: dict[str, Any] = {"mode": mode, "problems": problems, "repeats": repeats,
                                       "concurrency": concurrency, "budget_s": budget_s, "skipped": [], "errors": []}
        self._lock = threading.Lock()
        self._evaluators: dict[str, Evaluator] = {}

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

    def evaluator(self, name: str) -> Evaluator:
        if name not in self._evaluators:
            self._evaluators[name] = Evaluator(get_problem(name), self.mode)
        return self._evaluators[name]

    # ----- 1. stream ------------------------------------------------------------------------
    def _stream_jobs(self) -> list[tuple[str, str, str]]:
        """Each problem's known-good `repeats` times and one broken candidate (the kinds in turn),
        problems interleaved as a real stream would have them."""
        kinds = ["crash", "wrong", "compile_error"]
        by_problem = {}
        for i, name in enumerate(self.problems):
            kind = kinds[i % len(kinds)]
            by_problem[name] = [(name, "known-good", self.known_good(name))] * self.repeats + \
                [(name, kind, broken_candidates(get_problem(name))[kind])]
        out = []
        while any(by_problem.values()):
            for name in self.problems:
                if by_problem[name]:
                    out.append(by_problem[name].pop(0))
        return out

    def warm_up(self, until: float) -> bool:
        """One known-good evaluation per problem: the server, a reference worker and the baseline
        ready. False if time ran out first."""
        rows = self.record.setdefault("warm_up", [])
        for name in self.problems:
            if name in {r["problem"] for r in rows}:
                continue
            if time.monotonic() > until:
                self.skip("stream", f"out of time while warming up ({name})")
                return False
            r = self.evaluator(name).evaluate(self.known_good(name))
            rows.append({"kind": "warm-up", **_summary(r)})
            self.say(f"[warm-up] {name}: {r.wall_s:.1f} s correct={r.correct} {r.message[:120] if r.error else ''}")
        return True

    def stream(self, overlap: bool, threads: int, until: float) -> dict[str, Any] | None:
        label = f"{'overlap' if overlap else 'exclusive'} x{threads}"
        if not self.warm_up(until):
            return None
        for ev in self._evaluators.values():
            ev.overlap = overlap
        jobs = self._stream_jobs()
        results: list[dict[str, Any]] = []

        def run(job: tuple[str, str, str]) -> None:
            name, kind, source = job
            if time.monotonic() > until:
                return
            r = self._evaluators[name].evaluate(source)
            with self._lock:
                results.append({"kind": kind, **_summary(r)})
            self.say(f"[stream {label}] {name} {kind}: {r.wall_s:.1f} s error={r.error and r.error.value}")

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(run, jobs))
        wall = time.monotonic() - t0
        if len(results) < len(jobs):
            self.record["skipped"].append(f"stream {label}: {len(jobs) - len(results)} of {len(jobs)} jobs not run "
                                          "(out of time)")
        good = [r for r in results if r["kind"] == "known-good"]
        # a wrong answer built on the reference may also call ops the problem forbids: integrity
        expected = {"crash": {"crash"}, "wrong": {"mismatch", "integrity"}, "compile_error": {"compile_error"}}
        good_wall = sum(r["wall_s"] for r in good)
        return {"label": label, "overlap": overlap, "threads": threads, "evaluations": len(results), "wall_s": wall,
                "per_minute": 60 * len(results) / wall if wall > 0 and results else None,
                # one at a time, the known-good evaluations' own wall time is the GPU's time for them
                "known_good_per_minute": 60 * len(good) / good_wall if good_wall > 0 and not overlap else None,
                "known_good_correct": sum(bool(r["correct"] and not r["flags"]) for r in good), "known_good": len(good),
                "expected_errors": sum(r["error"] in expected[r["kind"]] for r in results if r["kind"] != "known-good"),
                "broken": sum(r["kind"] != "known-good" for r in results),
                "stage_median_s": {k: statistics.median(r["stage_s"].get(k, 0.0) for r in good) for k in STAGES}
                if good else {},
                "results": results}

    def streams(self, overlap: bool, share: float) -> None:
        name = "overlap" if overlap else "stream"
        if self.left() < 20:
            self.skip(name, "out of time")
            return
        got = self.stream(overlap, self.concurrency if overlap else 1, time.monotonic() + share * self.left())
        if got is not None:
            self.record.setdefault("streams", []).append(got)

    # ----- 2. spread --------------------------------------------------------------------------
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

    # ----- 3. do_bench, 6. ncu -------------------------------------------------------------------
    def kb_medians(self) -> dict[tuple[str, str], dict[str, float]]:
        """kb_env's median of the known-good and of the baseline per (problem, shape), over the
        one-at-a-time stream's evaluations."""
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

    def dobench(self, share: float) -> None:
        if self.left() < 30:
            self.skip("do_bench", "out of time")
            return
        got = _child(["dobench", *self.problems], timeout=share * self.left())
        kb = self.kb_medians()
        rows = []
        for entry in got["problems"]:
            name = entry["problem"]
            if "error" in entry:
                rows.append({"problem": name, "error": entry["error"]})
                continue
            for shape in entry["shapes"]:
                mine = kb.get((name, json.dumps(shape["shape"], sort_keys=True)), {})
                rows.append({"problem": name, "shape": shape["shape"], "do_bench_ms": shape["candidate_ms"],
                             "kb_ms": mine.get("cand"), "do_bench_base_ms": shape["baseline_ms"],
                             "kb_base_ms": mine.get("base"),
                             "ratio": mine["cand"] / shape["candidate_ms"] if mine.get("cand") else None,
                             "base_ratio": mine["base"] / shape["baseline_ms"] if mine.get("base") else None})
        done = {e["problem"] for e in got["problems"]}
        if got.get("error"):
            self.record["errors"].append(f"do_bench: {got['error'][-400:]}")
        if missing := [n for n in self.problems if n not in done]:
            self.skip("do_bench", f"not reached: {', '.join(missing)}")
        self.record["do_bench"] = rows

    def ncu(self) -> None:
        exe = shutil.which("ncu")
        if exe is None:
            self.record["ncu"] = {"error": "ncu is not on PATH"}
            return
        if self.left() < 40:
            self.skip("ncu", "out of time")
            return
        name = self.problems[0]
        cmd = [exe, "--clock-control", "none", "--cache-control", "all", "--target-processes", "all",
               "--nvtx", "--nvtx-include", "kb_call/", "--metrics", "gpu__time_duration.sum", "--csv",
               sys.executable, "-c", f"from kb_env.bench import _child_main; _child_main(['ncu_calls', {name!r}])"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10.0, self.left() - 5))
        except subprocess.TimeoutExpired:
            self.record["ncu"] = {"problem": name, "error": "ncu ran past its time limit"}
            return
        kernels = _parse_ncu_csv(proc.stdout)
        kb = self.kb_medians()
        out: dict[str, Any] = {"problem": name, "returncode": proc.returncode, "kernels": kernels,
                               "stderr_tail": proc.stderr[-1500:], "stdout_tail": proc.stdout[-1500:]}
        per_shape = []
        for si, shape in enumerate(get_problem(name).shapes_for("cuda")):
            ks = [k for k in kernels if k["range"] == f"kb_call_{si}"]
            if ks:
                ms = sum(k["ms"] for k in ks)
                mine = kb.get((name, json.dumps(shape, sort_keys=True)), {}).get("cand")
                per_shape.append({"shape": shape, "ncu_ms": ms, "kb_ms": mine, "ratio": mine / ms if mine else None})
        out["shapes"] = per_shape
        if not kernels:
            out["error"] = "no kernel rows from ncu (see stderr_tail: counters may be off limits here)"
        self.record["ncu"] = out

    # ----- 4. breakdown ---------------------------------------------------------------------
    def breakdown(self, share: float) -> None:
        rows = self.record.setdefault("breakdown", [])
        until = time.monotonic() + share * self.left()
        for name in self.problems[:self.cold]:
            if time.monotonic() > until:
                self.skip("breakdown", f"{name} and later: out of time")
                break
            with Evaluator(get_problem(name), self.mode, warm=False) as cold_ev:
                cold = cold_ev.evaluate(self.known_good(name))
            self.say(f"[breakdown] {name} cold: {cold.wall_s:.1f} s correct={cold.correct}")
            rows.append({"problem": name, "path": "cold", **_summary(cold)})

    # ----- all --------------------------------------------------------------------------------
    def run(self, sections: list[str]) -> dict[str, Any]:
        from .sandbox import server

        t0 = time.monotonic()
        cuda = self.mode == "cuda"
        # (section, share of the time left when it starts)
        plan = [("stream", lambda: self.streams(False, 0.6)), ("stream", self.spread),
                ("dobench", lambda: self.dobench(0.4) if cuda else None),
                ("breakdown", lambda: self.breakdown(0.35)),
                ("overlap", lambda: self.streams(True, 0.8 if cuda and "ncu" in sections else 0.95)),
                ("ncu", lambda: self.ncu() if cuda else None)]
        try:
            for section, step in plan:
                if section not in sections:
                    continue
                try:
                    step()
                except Exception as exc:  # noqa: BLE001 (record it; the other sections still run)
                    self.record["errors"].append(f"{section}: {type(exc).__name__}: {exc}")
                    self.say(f"[{section}] failed: {type(exc).__name__}: {exc}")
                self.save()
        finally:
            for ev in self._evaluators.values():
                ev.close()
        self.record["server_error"] = server.last_error
        self.record["wall_s"] = time.monotonic() - t0
        self.save()
        return self.record


# ----- children (do_bench and ncu run in their own process, on a GPU) -----------------------------
def _child(args: list[str], timeout: float) -> dict[str, Any]:
    """Run `_child_main(args)` in a fresh interpreter: the JSON lines it printed (each a problem's
    result) as {"problems": [...]}, with "error" when it failed or ran past `timeout`."""
    cmd = [sys.executable, "-c", f"from kb_env.bench import _child_main; _child_main({args!r})"]
    error = None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        stdout, stderr = proc.stdout, proc.stderr
        if proc.returncode != 0:
            error = f"exit status {proc.returncode}: {stderr[-1500:]}"
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        error = f"{args[0]} ran past {timeout:.0f} s"
    problems = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                problems.append(json.loads(line))
            except ValueError:
                pass
    return {"problems": problems, **({"error": error} if error else {})}


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

    what = args[0]
    if what == "dobench":  # one JSON line per problem, as each is done
        from triton.testing import do_bench

        for name in args[1:]:
            try:
                shapes = []
                for shape in get_problem(name).shapes_for("cuda"):
                    cand, base, inputs = _models(name, shape)
                    with torch.no_grad():
                        c = do_bench(lambda: cand(*inputs), return_mode="median")
                        b = do_bench(lambda: base(*inputs), return_mode="median")
                    shapes.append({"shape": shape, "candidate_ms": c, "baseline_ms": b})
                    del cand, base, inputs
                    torch.cuda.empty_cache()
                print(json.dumps({"problem": name, "gpu": torch.cuda.get_device_name(0), "shapes": shapes}), flush=True)
            except Exception as exc:  # noqa: BLE001 (the next problem still runs)
                print(json.dumps({"problem": name, "error": f"{type(exc).__name__}: {exc}"[:1500]}), flush=True)
    elif what == "ncu_calls":  # run under ncu: warm-up calls, then one call per shape in an NVTX range
        name = args[1]
        for si, shape in enumerate(get_problem(name).shapes_for("cuda")):
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
def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _warm_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Per problem, the median of the one-at-a-time stream's known-good evaluations."""
    rows = []
    for s in record.get("streams", []):
        if s["overlap"]:
            continue
        for name in record["problems"]:
            rs = [r for r in s["results"] if r["problem"] == name and r["kind"] == "known-good"]
            if rs:
                rows.append({"problem": name, "path": "warm (median)", "wall_s": statistics.median(r["wall_s"] for r in rs),
                             "stage_s": {k: statistics.median(r["stage_s"].get(k, 0.0) for r in rs) for k in STAGES},
                             "perf": rs[-1]["perf"]})
    return rows


def summary(record: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(figure, value, the issue's target) rows of the short table printed last."""
    rows: list[tuple[str, str, str]] = []
    cuda = record["mode"] == "cuda"
    for s in record.get("streams", []):
        unit = "GPU-minute" if cuda else "minute (CPU mode)"
        value = f"{_fmt(s['per_minute'], '.1f')} ({s['evaluations']} in {s['wall_s']:.0f} s)"
        rows.append((f"evaluations per {unit}, {s['label']}", value, ">= 60" if not s["overlap"] and cuda else ""))
        if s.get("known_good_per_minute") is not None:
            rows.append((f"known-good evaluations per {unit}, {s['label']}", f"{s['known_good_per_minute']:.1f}",
                         ">= 60" if cuda else ""))
        rows.append((f"graded as expected, {s['label']}",
                     f"known-good {s['known_good_correct']}/{s['known_good']}, broken {s['expected_errors']}/{s['broken']}",
                     "all"))
    warm = _warm_rows(record)
    if warm:
        med = statistics.median(r["wall_s"] for r in warm)
        stages = {k: statistics.median(r["stage_s"].get(k, 0.0) for r in warm) for k in STAGES}
        top = ", ".join(f"{k} {v:.2f}" for k, v in sorted(stages.items(), key=lambda kv: -kv[1])[:3] if v > 0)
        rows.append(("warm known-good evaluation, median wall s", f"{med:.2f} ({top})", "<= 1.0 for 60/min"))
    cold = [r for r in record.get("breakdown", []) if r["path"] == "cold"]
    if cold:
        rows.append(("cold evaluation, median wall s", f"{statistics.median(r['wall_s'] for r in cold):.2f}", ""))
    spread = record.get("spread") or []
    if spread:
        worst = max(spread, key=lambda r: r["spread"])
        within = sum(r["spread"] <= 0.02 for r in spread)
        rows.append(("same candidate over fresh evaluations, max/min - 1",
                     f"worst {worst['spread']:.2%} ({worst['problem']}); {within}/{len(spread)} shapes within 2%",
                     "<= 2%" if cuda else "(CPU: not meaningful)"))
    ratios = [r["ratio"] for r in record.get("do_bench") or [] if r.get("ratio")]
    if ratios:
        within = sum(abs(x - 1) <= 0.05 for x in ratios)
        rows.append(("kb_env / do_bench, known-good",
                     f"{min(ratios):.3f} .. {max(ratios):.3f}; {within}/{len(ratios)} shapes within 5%", "0.95 .. 1.05"))
    base = [r["base_ratio"] for r in record.get("do_bench") or [] if r.get("base_ratio")]
    if base:
        rows.append(("kb_env / do_bench, baseline", f"{min(base):.3f} .. {max(base):.3f}", "0.95 .. 1.05"))
    ncu = [r["ratio"] for r in (record.get("ncu") or {}).get("shapes", []) if r.get("ratio")]
    if ncu:
        rows.append(("kb_env / ncu kernel time", f"{min(ncu):.3f} .. {max(ncu):.3f}", ""))
    return rows


def render(record: dict[str, Any]) -> str:
    mode = record["mode"]
    gpu = next((r["device"]["name"] for s in record.get("streams", []) for r in s["results"] if r.get("device")), None)
    lines = [f"kb bench: {mode} mode" + (f" on {gpu}" if gpu else "") + (" (CPU figures: timing not meaningful)"
                                                                         if mode == "cpu" else "")]
    if record.get("server_error"):
        lines.append(f"warm server: {record['server_error']}")
    rows = record.get("breakdown", []) + _warm_rows(record)
    if rows:
        lines += ["", "| problem | evaluation | wall s | " + " | ".join(STAGES) + " | imports s | candidate start |",
                  "|---|---|---|" + "---|" * len(STAGES) + "---|---|"]
        for r in sorted(rows, key=lambda r: (r["problem"], r["path"])):
            perf = r.get("perf") or {}
            stages = " | ".join(f"{r['stage_s'].get(k, 0.0):.2f}" for k in STAGES)
            lines.append(f"| {r['problem']} | {r['path']} | {r['wall_s']:.2f} | {stages} | "
                         f"{_fmt(perf.get('import_s'), '.2f')} | {perf.get('candidate_start')} |")
    if record.get("spread"):
        lines += ["", "| problem | shape | known-good median ms per fresh evaluation | spread (max/min - 1) |",
                  "|---|---|---|---|"]
        for r in record["spread"]:
            lines.append(f"| {r['problem']} | {r['shape']} | {', '.join(f'{m:.4f}' for m in r['medians_ms'])} | "
                         f"{r['spread']:.2%} |")
    if record.get("do_bench"):
        lines += ["", "| problem | shape | kb_env ms | do_bench ms | kb/do_bench | baseline kb ms | "
                      "baseline do_bench ms | kb/do_bench |", "|---|---|---|---|---|---|---|---|"]
        for r in record["do_bench"]:
            if "error" in r:
                lines.append(f"| {r['problem']} | error: {(r['error'] or '').splitlines()[-1][:100] if r['error'] else ''} |")
                continue
            lines.append(f"| {r['problem']} | {r['shape']} | {_fmt(r['kb_ms'], '.4f')} | {r['do_bench_ms']:.4f} | "
                         f"{_fmt(r['ratio'], '.3f')} | {_fmt(r['kb_base_ms'], '.4f')} | {r['do_bench_base_ms']:.4f} | "
                         f"{_fmt(r['base_ratio'], '.3f')} |")
    n = record.get("ncu") or {}
    if n.get("shapes"):
        lines += ["", "| problem | shape | kb_env ms | ncu kernel ms | kb/ncu |", "|---|---|---|---|---|"]
        for r in n["shapes"]:
            lines.append(f"| {n['problem']} | {r['shape']} | {_fmt(r['kb_ms'], '.4f')} | {r['ncu_ms']:.4f} | "
                         f"{_fmt(r['ratio'], '.3f')} |")
    if n.get("error"):
        lines.append(f"ncu: {n['error']}")
    for s in record.get("skipped", []):
        lines.append(f"skipped: {s}")
    for e in record.get("errors", []):
        lines.append(f"error: {e}")
    lines += ["", f"summary ({record.get('wall_s', 0):.0f} s)" + (f", {gpu}" if gpu else ""),
              "| figure | value | target |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in summary(record)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="kb bench", description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    return run_cli(ap.parse_args(argv))


SECTIONS = ["stream", "dobench", "breakdown", "overlap", "ncu"]


def add_arguments(ap) -> None:
    ap.add_argument("--device", "--mode", dest="device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--problems", nargs="+", help="default: every level-1 forward problem with a known-good solution")
    ap.add_argument("--repeats", type=int, default=3, help="known-good evaluations per problem in each stream "
                                                          "(fresh evaluations for the spread)")
    ap.add_argument("--concurrency", type=int, default=4, help="evaluations at once in the overlapped stream")
    ap.add_argument("--cold", type=int, default=3, help="problems evaluated cold for the breakdown")
    ap.add_argument("--sections", nargs="+", default=SECTIONS, choices=SECTIONS)
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="the run's time budget: sections share it and stop starting work past it (seconds)")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for bench.json (default: $OUT)")


def run_cli(args) -> int:
    from .env import resolve_device

    mode = resolve_device(args.device)
    problems = args.problems or l1_problems(mode)
    for name in problems:
        get_problem(name)
    if args.repeats < 1 or args.concurrency < 1 or args.budget_s <= 0:
        raise ValueError("--repeats, --concurrency and --budget-s must be positive")
    bench = Bench(mode, problems, args.repeats, args.concurrency, args.budget_s,
                  Path(args.out) if args.out else None, cold=args.cold)
    record = bench.run(args.sections)
    print(render(record))
    return 0
