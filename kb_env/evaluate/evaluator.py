"""One evaluation of one candidate, end to end, from the trusted side.

Two worker processes per evaluation: a *reference* worker (trusted; it computes reference
outputs, keeps them, checks candidate outputs against them and times the baseline) and a
*candidate* worker (the candidate's module is imported there, nowhere else). This process only
relays: reference outputs never exist in the candidate's memory or here.

Warm (the default): the candidate worker is fresh for every evaluation, forked from the warm
worker server before any candidate code or CUDA context exists in it (`kb_env.sandbox.server`);
the reference worker is kept across evaluations of the problem with its models and the
reference outputs of pooled grading seeds (`workers.ReferencePool`); baseline timings are kept
per process and confirmed each evaluation (`baseline`). ``warm=False`` is the cold path: two
freshly spawned processes, every seed from the salt, the baseline timed in full every time.

Seeds are derived from secrets the candidate never sees (`seeds`): it gets inputs, not seeds
ahead of its calls (both workers draw the same inputs from the seed the harness sends each).
"""

from __future__ import annotations

import contextlib
import math
import secrets
import shutil
import statistics
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator

from ..hardware import lookup
from ..problem import Interface, ProblemSpec, Stress
from ..sandbox.runner import ProtocolViolation, WorkerDied, WorkerProcess, WorkerTimeout
from . import baseline as baselines
from .filewatch import changed_files, tree_digest
from .kernels import analyze
from .oprules import op_flags
from .result import CaseCheck, DeviceInfo, ErrorKind, EvalResult, Mismatch, PerfStats, Samples, ShapeTiming, geomean
from .roofline import peak_fraction
from .seeds import SeedPlan, derive_seed
from .static import check_source
from .workers import REF_MAX_USES, CandidateSpares, ReferencePool, gpu_lock, measure_lock

REFERENCE_TIMEOUT_S = 900.0
BEGIN_TIMEOUT_S = 60.0  # a kept reference worker's "begin": it forgets the last cases, reads the clocks
MAX_MESSAGE_CHARS = 20_000
CPU_TIMING = {"warmup": 1, "reps": 3, "rounds": 1, "input_sets": 1}
# Wall-clock check: flag a reported time under this fraction of the harness's own wall clock
# per call (less the flush), once that is long enough to measure over launch overhead. Honest
# candidates reported 1.0 to 1.9 times that wall clock on an H200 (benchmarks/RESULTS.md runs).
WALL_CHECK_FRACTION = 0.2
WALL_CHECK_MIN_MS = 0.02
WALL_CHECK_CONFIRM = 2  # extra estimates taken when the first says "implausible"; the median decides
# Each estimate times a dedicated batch long enough that a request's fixed cost and host jitter
# (about a millisecond) are a few percent of it: short batches (a --quick round is 12 calls of
# 0.1 ms) gave estimates from -0.08 to +0.3 ms per call for the same honest kernel on an H200.
WALL_BATCH_MS = 40.0
WALL_BATCH_MAX_CALLS = 4000
# Reference outputs the reference worker may keep (pooled grading cases), by mode: a GPU's memory
# is shared with the candidate's worker.
REF_CACHE_BYTES = {"cuda": 4 << 30, "cpu": 256 << 20}


class HarnessError(RuntimeError):
    """The trusted side failed (broken problem, reference worker crash): not the candidate's fault."""


def _outputs(value: Any) -> list:
    """A candidate's outputs: a list of tensors, or ProtocolViolation."""
    import torch

    if not isinstance(value, list) or not all(isinstance(v, torch.Tensor) for v in value):
        raise ProtocolViolation("outputs are not a list of tensors")
    return value


def _package_dirs() -> list[Path]:
    """The installed kb_env and rewards packages (what the workers import)."""
    import importlib.util

    dirs = [Path(__file__).resolve().parents[1]]
    spec = importlib.util.find_spec("rewards")
    if spec is not None and spec.origin:
        dirs.append(Path(spec.origin).resolve().parent)
    return dirs


def _str_list(value: Any) -> list[str]:
    """A list of short names from the candidate's worker (anything else is dropped)."""
    if not isinstance(value, list):
        return []
    return [v[:200] for v in value if isinstance(v, str)]


def _times(value: Any, reps: int) -> list[float] | None:
    """Reported per-call times if they are `reps` positive finite numbers, else None."""
    if not isinstance(value, list) or len(value) != reps:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in value):
        return None
    return [float(v) for v in value]


class _StageClock:
    """Wall seconds per evaluation stage (the first word of each progress message), passing the
    messages on: where an evaluation's time goes."""

    def __init__(self, report: Callable[[str], None]):
        self.report = report
        self.seconds: dict[str, float] = {}
        self._stage: str | None = None
        self._since = time.monotonic()

    def __call__(self, message: str) -> None:
        self.stop()
        self._stage = message.split()[0]
        self.report(message)

    def stop(self) -> dict[str, float]:
        now = time.monotonic()
        if self._stage is not None:
            self.seconds[self._stage] = self.seconds.get(self._stage, 0.0) + now - self._since
        self._stage, self._since = None, now
        return self.seconds

    @contextlib.contextmanager
    def part(self, stage: str) -> Iterator[None]:
        """Charge the time inside to `stage` (no progress message), then go back to the current one."""
        current = self._stage
        self.stop()
        self._stage = stage
        try:
            yield
        finally:
            self.stop()
            self._stage = current


class _Budget:
    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def extend(self, seconds: float) -> None:
        """Time the candidate did not use (waiting for the GPU) is not taken from it."""
        self.deadline += seconds


class _Confirm:
    """Makes the dedicated batches of the wall-clock check for one shape: each like a timed round
    (fresh seeds from the secret salt, the warm-up calls of a later round), `calls` calls long (a
    decode run counts its `per` chained steps); the kept calls' cases (made by `kept_cases`, as for
    the rounds) go to the reference worker so that their outputs are checked."""

    def __init__(self, ref: WorkerProcess, base: dict[str, Any], timing: dict[str, int], salt: int, shape_index: int,
                 per: int, kept_cases: Callable[[list[int], str], list[dict[str, Any]]]):
        self.ref, self.base, self.salt, self.si, self.per = ref, base, salt, shape_index, per
        self.reps, self.warmup = timing["reps"], min(2, timing["warmup"])
        self.kept_cases = kept_cases

    def batch(self, attempt: int, calls: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        timed = max(1, -(-calls // self.per))  # seeds: calls, or decode runs of `per` steps
        seeds = [derive_seed(self.salt, f"timing:{self.si}:wall{attempt}:{i}") for i in range(timed + self.warmup)]
        sets = self.kept_cases(seeds, f"w{attempt}.") if self.base.get("keep") else []
        return {**self.base, "seeds": seeds, "warmup": self.warmup}, sets


class Evaluator:
    """Evaluates candidates for one problem in one mode ("cuda" or "cpu"). With `profile` (the
    default) a correct candidate's call is profiled once per shape on a GPU: the kernel table
    in the feedback, and the kernel checks (own share, launch cap, side streams, late work).

    `warm` (default): workers forked from the warm server, the reference worker and baseline
    timings kept (see the module docstring); ``close()`` (or dropping the evaluator) ends its
    workers. `pool_key` fixes the secret the pooled grading seeds come from (default: drawn here).

    `compile_pass` (default: in CUDA mode) runs each shape's first call on ungraded fresh inputs
    before correctness, so compilation has its own stage and happens before the GPU is measured.

    Several threads may evaluate at once. They never measure at once on one GPU: timing and
    profiling hold this process's `gpu_lock`. With `overlap` off (the default) an evaluation in
    CUDA mode holds it from its first worker request to its last, so no other candidate's process
    has the GPU while one is measured. With `overlap` on, it holds it only to measure: another
    evaluation's workers start, compile and check correctness meanwhile (on the CPU cores, and
    briefly on the GPU), and a candidate waiting for the lock is frozen (SIGSTOP) until it has it.
    That trades isolation for throughput: a co-running candidate's GPU work (a hostile one may
    launch as much as it likes while it compiles) lands in the measured evaluation's timing; the
    baseline check then sees it and falls back to interleaved rounds, which cancel it in the
    speedup, but not in peak_fraction (see docs/PERFORMANCE.md)."""

    def __init__(self, spec: ProblemSpec, mode: str, timeout_s: float | None = None,
                 progress: Callable[[str], None] | None = None, profile: bool = True, launch_cap: bool = True,
                 warm: bool = True, overlap: bool = False, compile_pass: bool | None = None,
                 pool_key: int | None = None):
        if mode not in ("cuda", "cpu"):
            raise ValueError(f"mode must be 'cuda' or 'cpu', not {mode!r}")
        if mode == "cpu" and spec.gpu_only:
            raise ValueError(f"{spec.name} is GPU-only (it declares no CPU shapes); evaluate it in CUDA mode on a GPU")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s}")
        if not launch_cap:  # the problem's launch cap off (plain fused-kernel work on a megakernel problem)
            spec = spec.model_copy(update={"forbidden": spec.forbidden.model_copy(update={"max_launches": None})})
        self.spec = spec
        self.mode = mode
        self.profile = profile
        self.decode = spec.interface is Interface.decode
        self.timeout_s = timeout_s if timeout_s is not None else spec.limits.load_s + spec.limits.run_s
        self._report = progress or (lambda stage: None)
        self._local = threading.local()
        # Problem code is read once and sent to the workers as text; trusted files are watched.
        self.reference_source = spec.reference_source()
        self.baseline_source = spec.baseline_path.read_text() if spec.baseline_path else None
        self._watched = [spec.folder, *_package_dirs()]
        self._digest = tree_digest(self._watched)
        self.warm, self.overlap = warm, overlap
        self.compile_pass = (mode == "cuda") if compile_pass is None else compile_pass
        self._pool_key = (secrets.randbits(63) if pool_key is None else pool_key) if warm else None
        self._workers_lock = threading.Lock()
        self._refs: ReferencePool | None = None
        self._spares: CandidateSpares | None = None
        self._finalizer: weakref.finalize | None = None

    # ----- workers --------------------------------------------------------------------
    def _pools(self) -> tuple[ReferencePool, CandidateSpares]:
        """This evaluator's reference workers and candidate worker starter, made on first use."""
        with self._workers_lock:
            if self._refs is None or self._spares is None:
                start = "auto" if self.warm else "spawn"
                setup = {"op": "setup", "mode": self.mode, "problem_dir": str(self.spec.folder),
                         "reference_source": self.reference_source, "interface": self.spec.interface.value,
                         "role": "reference", "baseline": self.spec.baseline.value,
                         "baseline_source": self.baseline_source, "spec": self.spec.model_dump(mode="json"),
                         "cache_bytes": REF_CACHE_BYTES[self.mode] if self.warm else 0}
                self._refs = ReferencePool(self.mode, setup, max_uses=REF_MAX_USES if self.warm else 1, start=start)
                self._spares = CandidateSpares(self.mode, self.spec.limits.max_file_mb << 20,
                                               self.spec.limits.max_memory_mb << 20,
                                               ahead=self.warm and self.mode == "cuda", start=start)
                self._finalizer = weakref.finalize(self, _close_pools, self._refs, self._spares)
            return self._refs, self._spares

    def close(self) -> None:
        """End this evaluator's workers (warm reference workers, a spare candidate worker). It can
        still evaluate afterwards: it starts new ones."""
        with self._workers_lock:
            refs, spares, self._refs, self._spares = self._refs, self._spares, None, None
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
        _close_pools(refs, spares)

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def seeds_of(self, salt: int) -> list[int]:
        """Every seed an evaluation with `salt` may send a worker, the whole pool included (for
        tests that look for seeds where they must not be)."""
        plan = SeedPlan(salt, self._pool_key)
        shapes = self.spec.shapes_for(self.mode)
        timing = self.spec.timing.model_dump() if self.mode == "cuda" else dict(CPU_TIMING)
        out = [plan.param_seed, *plan.all_pooled(len(shapes))]
        out += [seed for si in range(len(shapes)) for seed, _ in plan.grading(si, self.spec.seeds)]
        out += [plan.stress(k) for k in range(len(self.spec.stress))]
        out += [seed for calls in _timed_calls(plan, len(shapes), timing).values() for seed in calls]
        out += [plan.fresh(f"{what}:{si}") for si in range(len(shapes)) for what in ("compile", "profile")]
        out += [plan.fresh(f"timing:{si}:baseline:{i}") for si in range(len(shapes)) for i in range(4)]
        return out

    def progress(self, message: str) -> None:
        """Report a stage (and time it, inside an evaluation)."""
        getattr(self._local, "clock", self._report)(message)

    # ----- public --------------------------------------------------------------------
    def evaluate(self, source: str, salt: int | None = None) -> EvalResult:
        changed = changed_files(self._digest, tree_digest(self._watched))
        if changed:
            raise HarnessError(f"trusted files changed on disk since this evaluator started ({', '.join(changed[:3])}); "
                               "restore them (reinstall kb_env) and start a new environment")
        started = time.monotonic()
        stages = _StageClock(self._report)
        self._local.clock = stages  # per thread: one Evaluator may serve several threads at once
        salt = secrets.randbits(63) if salt is None else salt
        res = EvalResult(problem=self.spec.name, mode=self.mode, baseline=self.spec.baseline.value,
                         timing_meaningful=False, interface=self.spec.interface.value,
                         max_launches=self.spec.forbidden.max_launches)
        static = check_source(source, self.spec.forbidden.imports)
        if static.error:
            res.error, res.message = ErrorKind.compile_error, static.error
        elif static.flags:
            res.compiled, res.flags = True, static.flags
            res.error = ErrorKind.integrity
            res.message = "not run: the source imports what this problem forbids (" + ", ".join(static.flags) + ")"
        else:
            self._run(source, salt, res)
            if changed_files(self._digest, tree_digest(self._watched)):
                res.flags = sorted({*res.flags, "modified_harness_files"})
                res.error = ErrorKind.integrity
                res.message = "the candidate modified the problem's or the harness's files on disk"
        res.wall_s = time.monotonic() - started
        res.stage_s = {k: round(v, 4) for k, v in stages.stop().items()}
        return res

    # ----- the two workers -------------------------------------------------------------
    def _run(self, source: str, salt: int, res: EvalResult) -> None:
        budget = _Budget(self.timeout_s)
        refs, spares = self._pools()
        exclusive = self.mode == "cuda" and not self.overlap
        with self._gpu(exclusive, budget, res):
            self.progress("starting workers")
            held = list(refs.acquire())  # [reference worker, whether new]: `_begin` may replace it
            healthy = False
            spare = None
            try:
                spare, ahead = spares.take()
                cand = spare.worker
                cand_path = spare.folder / "candidate" / "candidate.py"
                cand_path.write_text(source)
                cand.send({"op": "setup", "mode": self.mode, "problem_dir": str(self.spec.folder),
                           "reference_source": self.reference_source, "interface": self.spec.interface.value,
                           "role": "candidate", "candidate_path": str(cand_path),
                           "forbidden_imports": list(self.spec.forbidden.imports)})
                device = self._begin(refs, held)
                ref, new_ref = held
                res.device = self._device_info(device)
                res.perf = PerfStats(candidate_start="spare" if ahead else cand.started_by,
                                     reference_start=ref.worker.started_by if new_ref else "warm",
                                     reference_uses=ref.uses,
                                     device_s=(spare.warm_reply or {}).get("device_s") if ahead else None,
                                     waited_s=res.perf.waited_s if res.perf else 0.0)
                self._candidate(ref.worker, cand, budget, salt, res)
                healthy = True
            except WorkerTimeout as exc:
                res.error, res.message = ErrorKind.timeout, f"the candidate ran past its {self.timeout_s:.0f} s limit ({exc})"
                res.correct = False
                healthy = True
            except WorkerDied as exc:
                res.error, res.message = ErrorKind.crash, f"the candidate's worker process died: {exc.how}"
                res.correct = False
                healthy = True
            except ProtocolViolation as exc:
                res.error, res.message = ErrorKind.crash, f"the candidate's worker broke the protocol: {exc}"
                res.correct = False
                res.flags = sorted({*res.flags, "protocol_violation"})
                healthy = True
            finally:
                if spare is not None:
                    res.candidate_output = spare.worker.output_tail()
                    spare.discard()
                if held[0] is not None:
                    refs.release(held[0], healthy)

    def _begin(self, refs: ReferencePool, held: list[Any]) -> dict[str, Any]:
        """Start the evaluation on the reference worker `held` = [worker, whether new] (a new one's
        setup answered first); the device it reports. A kept worker that died since its last
        evaluation is replaced (in `held`) by a new one; a new one failing is the harness's failure."""
        for attempt in range(2):
            ref, new = held
            try:
                if new:
                    ref.setup_reply = self._ref(ref.worker, None)
                # short: a kept worker that a candidate stopped (SIGSTOP) is replaced, not waited for
                return self._ref(ref.worker, {"op": "begin"}, BEGIN_TIMEOUT_S)["device"]
            except HarnessError:
                if new or attempt:
                    raise
            refs.release(ref, healthy=False)
            held[:] = [None, True]
            held[:] = list(refs.acquire(fresh=True))
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _gpu(self, hold: bool, budget: _Budget, res: EvalResult) -> Iterator[None]:
        """Hold this process's GPU lock for the block if `hold` (the wait is not the candidate's time)."""
        if not hold:
            yield
            return
        lock = gpu_lock(self.mode)
        t0 = time.monotonic()
        if not lock.acquire(blocking=False):
            self.progress("waiting for the GPU")
            lock.acquire()
        waited = time.monotonic() - t0
        budget.extend(waited)
        if res.perf is None:
            res.perf = PerfStats()
        res.perf.waited_s += waited
        try:
            yield
        finally:
            lock.release()

    @contextlib.contextmanager
    def _measuring(self, cand: WorkerProcess, budget: _Budget, res: EvalResult) -> Iterator[None]:
        """The measuring phase (timing, profiling), under this process's `measure_lock` (no spare
        creates a CUDA context meanwhile). With `overlap`, it takes the GPU lock here, the candidate
        frozen while it waits; without, the whole evaluation already holds it in CUDA mode."""
        if not self.overlap:
            with self._measure_lock(budget):
                yield
            return
        cand.freeze()
        try:
            with self._gpu(True, budget, res), self._measure_lock(budget):
                cand.thaw()
                yield
        finally:
            cand.thaw()

    @contextlib.contextmanager
    def _measure_lock(self, budget: _Budget) -> Iterator[None]:
        lock = measure_lock(self.mode)
        t0 = time.monotonic()
        with lock:
            budget.extend(time.monotonic() - t0)  # a spare's CUDA start is not the candidate's time
            yield

    def _part(self, stage: str) -> contextlib.AbstractContextManager:
        clock = getattr(self._local, "clock", None)
        return clock.part(stage) if clock is not None else contextlib.nullcontext()

    def _ref(self, ref: WorkerProcess, message: dict[str, Any] | None,
             timeout_s: float = REFERENCE_TIMEOUT_S) -> dict[str, Any]:
        """A request to the trusted worker; any failure there is the harness's, not the candidate's."""
        try:
            reply = ref.request(message, timeout_s) if message else ref.recv(timeout_s)
        except (WorkerDied, WorkerTimeout, ProtocolViolation) as exc:
            raise HarnessError(f"reference worker failed: {exc}\n{ref.output_tail()}") from None
        if not reply.get("ok"):
            raise HarnessError(f"reference worker failed on {self.spec.name}: {reply.get('message')}")
        return reply

    def _device_info(self, raw: dict[str, Any]) -> DeviceInfo:
        info = DeviceInfo(**raw)
        if self.mode == "cuda":
            gpu = lookup(info.name)
            info.hardware_key = gpu.key if gpu else None
        return info

    # ----- correctness, then timing ------------------------------------------------------
    def _candidate(self, ref: WorkerProcess, cand: WorkerProcess, budget: _Budget, salt: int, res: EvalResult) -> None:
        spec = self.spec
        shapes = spec.shapes_for(self.mode)
        plan = SeedPlan(salt, self._pool_key)
        param_seed = plan.param_seed
        timing = spec.timing.model_dump() if self.mode == "cuda" else dict(CPU_TIMING)
        # Grading seeds: pooled (their reference outputs may be cached) but one per shape, see
        # `seeds`. Every grading seed after a shape's first is written into the previous call's tensors.
        cases = [{"id": f"g{si}.{k}", "kind": "grading", "shape": shape, "shape_index": si, "seed_index": k,
                  "seed": seed, "param_seed": param_seed, "in_place": k > 0, "cache": pooled}
                 for si, shape in enumerate(shapes) for k, (seed, pooled) in enumerate(plan.grading(si, spec.seeds))]
        cases += [{"id": f"s{si}.{k}", "kind": "stress", "shape": shape, "shape_index": si, "seed_index": k,
                   "seed": plan.stress(k), "param_seed": param_seed, "stress": stress.model_dump()}
                  for si, shape in enumerate(shapes) for k, stress in enumerate(spec.stress)]
        # A fresh seed for every timed call (decode: every timed run of chained steps); the last
        # `input_sets` calls of a shape are checked (decode: the last run's first and last steps).
        calls = _timed_calls(plan, len(shapes), timing)
        timed = [case for si, shape in enumerate(shapes)
                 for case in self._kept_cases(si, shape, calls[(si, timing["rounds"] - 1)], param_seed, timing, "t")]
        self.progress("reference outputs")
        got = self._ref(ref, {"op": "reference_outputs",
                              "cases": cases + [c for c in timed if not c.get("teacher_forced")]})
        if res.perf is not None:
            res.perf.reference_cache_hits = int(got.get("cache_hits") or 0)
            res.perf.reference_computed = int(got.get("computed") or 0)

        self.progress("loading the candidate")
        flags: set[str] = set()
        reply = cand.recv(budget.left())
        flags.update(_str_list(reply.get("integrity")))
        if res.perf is not None and isinstance(reply.get("import_s"), (int, float)):
            res.perf.import_s = float(reply["import_s"])
        if not reply.get("ok"):
            self._fail(res, reply, flags)
            return
        res.compiled = True

        ops: set[str] = set()
        if self.compile_pass:
            self.progress("compiling")
            warmups = [{"id": f"c{si}", "kind": "compile", "shape": shape, "shape_index": si, "seed_index": 0,
                        "seed": plan.fresh(f"compile:{si}"), "param_seed": param_seed} for si, shape in enumerate(shapes)]
            reply = cand.request({"op": "compile", "cases": warmups}, budget.left())
            flags.update(_str_list(reply.get("integrity")))
            flags.update(_str_list(reply.get("output_flags")))
            ops.update(_str_list(reply.get("ops")))
            if not reply.get("ok"):
                self._fail(res, reply, flags, ops)
                return

        for n, case in enumerate(cases, 1):
            self.progress(f"correctness {n}/{len(cases)} ({_fmt_shape(case['shape'])})")
            reply = cand.request({"op": "run", "case": case}, budget.left())
            flags.update(_str_list(reply.get("integrity")))
            flags.update(_str_list(reply.get("output_flags")))
            ops.update(_str_list(reply.get("ops")))
            if not reply.get("ok"):
                self._fail(res, reply, flags, ops, case)
                return
            if not self._check(ref, case, _outputs(reply.get("outputs")), res, reply.get("names")):
                self._finish(res, flags, ops)
                return
        res.correct = True
        with self._measuring(cand, budget, res):
            self._time(ref, cand, budget, shapes, calls, timed, timing, param_seed, salt, res, flags)
            if res.correct and self.mode == "cuda" and self.profile:
                self._profile(cand, budget, shapes, param_seed, salt, res, flags)
        self._finish(res, flags, ops)

    def _kept_cases(self, si: int, shape: dict[str, int], seeds: list[int], param_seed: int, timing: dict[str, int],
                    tag: str) -> list[dict[str, Any]]:
        """The cases whose outputs a timed batch keeps for checking: a forward problem's last
        `input_sets` calls; a decode problem's last run's first step (from the fresh state of its
        seed) and last step (teacher-forced: from the state the candidate's own previous step
        returned, its reference computed once that state is known)."""
        base = {"kind": "timing", "shape": shape, "shape_index": si, "param_seed": param_seed}
        if self.decode:
            return [{**base, "id": f"{tag}{si}.first", "seed_index": 0, "seed": seeds[-1]},
                    {**base, "id": f"{tag}{si}.last", "seed_index": 1, "seed": seeds[-1], "teacher_forced": True}]
        keep = min(timing["input_sets"], timing["reps"])
        return [{**base, "id": f"{tag}{si}.{j}", "seed_index": j, "seed": seed} for j, seed in enumerate(seeds[-keep:])]

    def _check(self, ref: WorkerProcess, case: dict[str, Any], outputs: list, res: EvalResult,
               names: list[str] | None = None) -> bool:
        chk = self._ref(ref, {"op": "check", "case_id": case["id"], "outputs": outputs, "names": _str_list(names)})
        mismatch = Mismatch.model_validate(chk["mismatch"]) if chk["mismatch"] else None
        res.checks.append(CaseCheck(kind=case["kind"], shape=case["shape"], seed_index=case["seed_index"],
                                    ok=chk["passed"], rel_l2_err=_finite(chk.get("rel_l2_err")),
                                    max_abs_err=_finite(chk.get("max_abs_err")), mismatch=mismatch))
        if not chk["passed"]:
            res.correct = False
            res.error = ErrorKind.mismatch
            where = {"timing": "a timed call's output",
                     "stress": f"output on {Stress.model_validate(case.get('stress') or {}).describe()}"
                     }.get(case["kind"], "output")
            res.message = f"{where} differs from the reference on shape {_fmt_shape(case['shape'])}: {mismatch.message}"
        return bool(chk["passed"])

    def _time(self, ref: WorkerProcess, cand: WorkerProcess, budget: _Budget, shapes: list[dict[str, int]],
              calls: dict[tuple[int, int], list[int]], timed: list[dict[str, Any]], timing: dict[str, int],
              param_seed: int, salt: int, res: EvalResult, flags: set[str]) -> None:
        gpu = lookup(res.device.name) if res.device and self.mode == "cuda" else None
        timings: list[ShapeTiming] = []
        for si, shape in enumerate(shapes):
            self.progress(f"timing {si + 1}/{len(shapes)} ({_fmt_shape(shape)})")
            sets = [c for c in timed if c["shape_index"] == si]
            base = {"op": "time", "shape": shape, "param_seed": param_seed, "keep": len(sets)}
            per = shape["steps"] if self.decode else 1  # timed calls per seed: a decode run's chained steps
            cached, check, key = self._baseline_check(ref, base, shape, si, timing, salt, res)
            cand_ms: list[float] = []
            base_ms: list[float] = []
            walls: list[float] = []
            for r in range(timing["rounds"]):
                seeds = calls[(si, r)]
                req = {**base, "seeds": seeds, "warmup": len(seeds) - timing["reps"]}
                if cached is None:  # interleaved with the candidate's rounds
                    with self._part("baseline"):
                        base_ms += self._ref(ref, {**req, "keep": 0})["times_ms"]
                got = self._round(cand, budget, req, timing["reps"] * per, res, flags)
                if got is None:
                    return
                cand_ms += got[0]
                walls.append(got[1])
            if not self._check_kept(ref, cand, budget, sets, res, flags):
                return
            cand_s = Samples.of(cand_ms)
            base_s = cached if cached is not None else Samples.of(base_ms)
            if cached is None and key is not None:
                baselines.BASELINES.put(key, base_s)
            flops, nbytes = self.spec.flops_of(shape), self.spec.bytes_of(shape)
            st = ShapeTiming(shape=shape, candidate=cand_s, baseline=base_s, speedup=base_s.median_ms / cand_s.median_ms,
                             flops=flops, bytes=nbytes, arithmetic_intensity=flops / nbytes,
                             baseline_cached=cached is not None, baseline_check_ms=check.median_ms if check else None)
            if self.mode == "cuda":
                confirm = _Confirm(ref, base, timing, salt, si, per,
                                   lambda seeds, tag: self._kept_cases(si, shape, seeds, param_seed, timing, tag))
                st.wall_check_ms = self._wall_check(cand, budget, base, walls, cand_s, confirm, res, flags)
                if st.wall_check_ms is None or not res.correct:
                    return
                if gpu is not None:
                    st.peak_fraction, st.regime = peak_fraction(flops, nbytes, cand_s.median_ms, gpu,
                                                                self.spec.compute_dtype)
            timings.append(st)
        res.timings = timings
        res.runtime_ms = geomean([t.candidate.median_ms for t in timings])
        res.baseline_ms = geomean([t.baseline.median_ms for t in timings])
        if self.mode == "cuda":
            res.timing_meaningful = True
            res.speedup = geomean([t.speedup for t in timings])
            if all(t.peak_fraction is not None for t in timings):
                res.peak_fraction = geomean([t.peak_fraction for t in timings])

    def _baseline_check(self, ref: WorkerProcess, base: dict[str, Any], shape: dict[str, int], si: int,
                        timing: dict[str, int], salt: int, res: EvalResult
                        ) -> tuple[Samples | None, Samples | None, str | None]:
        """The cached baseline of this shape if one is kept and a short check batch confirms it
        (see `baseline`): (cached samples or None, the check's samples, the cache key). A cold
        evaluator keeps none, and neither does CPU mode (its times are not meaningful, and a check
        batch would cost as much as the measurement it replaces)."""
        if not self.warm or self.mode != "cuda":
            return None, None, None
        key = baselines.baseline_key(res.device, self.spec.name, [self.reference_source, self.baseline_source],
                                     self.spec.baseline.value, shape, timing)
        cached = baselines.BASELINES.get(key)
        if cached is None:
            return None, None, key
        n = min(timing["reps"], baselines.CHECK_CALLS)
        seeds = [derive_seed(salt, f"timing:{si}:baseline:{i}") for i in range(timing["warmup"] + n)]
        with self._part("baseline"):
            check = Samples.of(self._ref(ref, {**base, "keep": 0, "seeds": seeds, "warmup": timing["warmup"]})["times_ms"])
        if baselines.within_drift(check, cached):
            return cached, check, key
        baselines.BASELINES.drop(key)
        return None, check, key

    def _round(self, cand: WorkerProcess, budget: _Budget, req: dict[str, Any], reps: int, res: EvalResult,
               flags: set[str]) -> tuple[list[float], float] | None:
        """One timed batch on the candidate: its reported times and the harness's wall clock per
        call; None (and the result failed) when the batch itself failed."""
        t0 = time.perf_counter()
        reply = cand.request(req, budget.left())
        per = req["shape"]["steps"] if self.decode else 1
        wall = (time.perf_counter() - t0) * 1e3 / (len(req["seeds"]) * per)
        flags.update(_str_list(reply.get("integrity")))
        flags.update(_str_list(reply.get("flags")))
        if not reply.get("ok"):
            self._fail(res, reply, flags)
            res.correct = False
            return None
        times = _times(reply.get("times_ms"), reps)
        if times is None:
            flags.add("timer_implausible")
            times = [wall] * reps  # the harness's own clock is all that is left
        return times, wall

    def _check_kept(self, ref: WorkerProcess, cand: WorkerProcess, budget: _Budget, sets: list[dict[str, Any]],
                    res: EvalResult, flags: set[str]) -> bool:
        """Check the outputs the candidate kept from its last timed batch against `sets`."""
        reply = cand.request({"op": "outputs"}, budget.left())
        flags.update(_str_list(reply.get("integrity")))
        outputs = reply.get("outputs")
        if self.decode:
            return self._check_kept_steps(ref, sets, outputs, res)
        if not isinstance(outputs, list) or len(outputs) != len(sets):
            raise ProtocolViolation(f"sent {type(outputs).__name__} for the timed outputs")
        return all(self._check(ref, case, _outputs(outs), res) for case, outs in zip(sets, outputs))

    def _check_kept_steps(self, ref: WorkerProcess, sets: list[dict[str, Any]], outputs: Any, res: EvalResult) -> bool:
        """Decode: the last timed run's first step against the reference from the same fresh state,
        and its last step against a reference step from the state the candidate's own previous
        step returned (so every step of a run must compute the step, not only the first)."""
        if not isinstance(outputs, list) or len(outputs) != 3:
            raise ProtocolViolation(f"sent {type(outputs).__name__} for the kept decode steps")
        for kept in outputs:
            if kept is not None and not (isinstance(kept, dict) and isinstance(kept.get("names"), list)):
                raise ProtocolViolation("a kept decode step is not {names, values}")
        first, last_in, last_out = outputs
        first_case, last_case = sets
        if first is None or last_in is None or last_out is None:
            return self._invalid_step(res, first_case, "a timed step returned something other than (hidden, state)")
        if not self._check(ref, first_case, _outputs(first["values"]), res, first["names"]):
            return False
        reply = self._ref(ref, {"op": "reference_step", "case": last_case, "names": _str_list(last_in["names"]),
                                "values": _outputs(last_in["values"])})
        if not reply.get("usable"):
            return self._invalid_step(res, last_case, f"the state a timed step returned cannot be fed back: "
                                                      f"{reply.get('message', '')}")
        return self._check(ref, last_case, _outputs(last_out["values"]), res, last_out["names"])

    def _invalid_step(self, res: EvalResult, case: dict[str, Any], message: str) -> bool:
        res.correct, res.error, res.message = False, ErrorKind.mismatch, message
        res.checks.append(CaseCheck(kind=case["kind"], shape=case["shape"], seed_index=case["seed_index"], ok=False,
                                    mismatch=Mismatch(output=0, reason="invalid", message=message)))
        return False

    def _wall_check(self, cand: WorkerProcess, budget: _Budget, base: dict[str, Any], walls: list[float],
                    samples: Samples, confirm: _Confirm, res: EvalResult, flags: set[str]) -> float | None:
        """The harness's own clock per timed call: a reported median far under it means the
        candidate's timer reports are not real (`timer_implausible`).

        An estimate times a dedicated batch made like a timed round (fresh secret seeds, kept
        outputs checked, so the candidate can neither tell it apart nor skip its work) and long
        enough (WALL_BATCH_MS, sized from the rounds' own wall clock) that a request's fixed cost
        is a few percent of it, less a flush-only batch of as many calls (inputs drawn, the L2
        flushed, nothing called). An estimate that says "implausible" is confirmed: up to
        WALL_CHECK_CONFIRM more, and the median decides, so one stalled batch (the host busy
        elsewhere) cannot fail an honest candidate. None when a batch itself failed."""
        per_call = statistics.median(walls[1:] or walls)
        calls = min(WALL_BATCH_MAX_CALLS, max(confirm.reps * confirm.per, math.ceil(WALL_BATCH_MS / max(per_call, 1e-3))))
        estimates: list[float] = []
        for attempt in range(WALL_CHECK_CONFIRM + 1):
            if attempt:
                self.progress(f"confirming the wall clock ({attempt}/{WALL_CHECK_CONFIRM})")
            est = self._wall_estimate(cand, budget, confirm, attempt, calls, res, flags)
            if est is None:
                return None
            estimates.append(est)
            wall = statistics.median(estimates)
            if not (wall > WALL_CHECK_MIN_MS and samples.median_ms < WALL_CHECK_FRACTION * wall):
                return wall
        flags.add("timer_implausible")
        return statistics.median(estimates)

    def _wall_estimate(self, cand: WorkerProcess, budget: _Budget, confirm: _Confirm, attempt: int, calls: int,
                       res: EvalResult, flags: set[str]) -> float | None:
        """Wall ms per call of one dedicated batch, less a flush-only batch's of as many calls."""
        req, sets = confirm.batch(attempt, calls)
        if sets:
            self._ref(confirm.ref, {"op": "reference_outputs", "cases": [c for c in sets if not c.get("teacher_forced")]})
        n_calls = (len(req["seeds"]) - req["warmup"]) * confirm.per
        got = self._round(cand, budget, req, n_calls, res, flags)
        if got is None or not self._check_kept(confirm.ref, cand, budget, sets, res, flags):
            return None
        flush_req = {**req, "seeds": list(range(len(req["seeds"]))), "keep": 0, "flush_only": True}
        t0 = time.perf_counter()
        cand.request(flush_req, budget.left())
        flush = (time.perf_counter() - t0) * 1e3 / (len(req["seeds"]) * confirm.per)
        return got[1] - flush

    def _profile(self, cand: WorkerProcess, budget: _Budget, shapes: list[dict[str, int]], param_seed: int, salt: int,
                 res: EvalResult, flags: set[str]) -> None:
        """One call per shape under the profiler: whose kernels ran, and whether work escaped the timer."""
        gpu = lookup(res.device.name) if res.device else None
        for si, shape in enumerate(shapes):
            self.progress(f"profiling {si + 1}/{len(shapes)}")
            reply = cand.request({"op": "profile", "shape": shape, "param_seed": param_seed,
                                  "seed": derive_seed(salt, f"profile:{si}")}, budget.left())
            flags.update(_str_list(reply.get("integrity")))
            flags.update(_str_list(reply.get("flags")))
            records = reply.get("kernels") if reply.get("ok") else None
            if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
                flags.add("profile_failed")
                res.message = str(reply.get("message", "the profiled call failed"))[:MAX_MESSAGE_CHARS]
                return
            try:
                report, found = analyze(records, self.spec.forbidden, self.spec.flops_of(shape), self.spec.bytes_of(shape),
                                        gpu, self.spec.compute_dtype)
            except (KeyError, TypeError, ValueError) as exc:
                raise ProtocolViolation(f"malformed kernel records: {exc}") from None
            flags.update(found)
            if si < len(res.timings):
                res.timings[si].kernels = report

    # ----- outcomes ----------------------------------------------------------------------
    def _fail(self, res: EvalResult, reply: dict[str, Any], flags: set[str], ops: set[str] | None = None,
              case: dict[str, Any] | None = None) -> None:
        res.correct = False
        error = reply.get("error")
        res.error = ErrorKind(error) if error in {e.value for e in ErrorKind} else ErrorKind.runtime_error
        if res.error is ErrorKind.compile_error:  # e.g. a Triton kernel that fails to compile on first call
            res.compiled = False
        res.message = str(reply.get("message", ""))[:MAX_MESSAGE_CHARS]
        if res.error is ErrorKind.mismatch and case is not None:  # an output that cannot be graded at all
            res.checks.append(CaseCheck(kind=case["kind"], shape=case["shape"], seed_index=case["seed_index"], ok=False,
                                        mismatch=Mismatch(output=0, reason="invalid", message=res.message)))
        self._finish(res, flags, ops or set())

    def _finish(self, res: EvalResult, flags: set[str], ops: set[str]) -> None:
        res.torch_ops = sorted(ops)
        flags.update(op_flags(ops, self.spec.forbidden))
        res.flags = sorted(flags)
        if res.flags and res.error is None:
            res.error = ErrorKind.integrity
            # keep what went wrong where there is something to say (a failed profiled call's error)
            res.message = "integrity violation: " + ", ".join(res.flags) + (f"\n{res.message}" if res.message else "")


def evaluate(spec: ProblemSpec, source: str, mode: str = "cpu", salt: int | None = None,
             timeout_s: float | None = None) -> EvalResult:
    """Evaluate one candidate source for `spec` (see `Evaluator`)."""
    with Evaluator(spec, mode, timeout_s) as ev:
        return ev.evaluate(source, salt)


def _close_pools(refs: ReferencePool | None, spares: CandidateSpares | None) -> None:
    if spares is not None:
        spares.close()
    if refs is not None:
        refs.close()


def _timed_calls(plan: SeedPlan, n_shapes: int, timing: dict[str, int]) -> dict[tuple[int, int], list[int]]:
    """The seeds of each timed round: (shape index, round) -> one fresh seed per call, the warm-up
    calls first (the first round's full warm-up, later rounds' two)."""
    return {(si, r): [plan.fresh(f"timing:{si}:{r}:{i}")
                      for i in range(timing["reps"] + (timing["warmup"] if r == 0 else min(2, timing["warmup"])))]
            for si in range(n_shapes) for r in range(timing["rounds"])}


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _fmt_shape(shape: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in shape.items()) or "(as get_inputs() makes it)"  # {}: fixed sizes
