"""A worker process: ``python -m kb_env.sandbox.worker READ_FD WRITE_FD``.

It answers requests on its private channel, one reply per request. Its first request, ``setup``,
fixes its role for life:

- ``reference`` (trusted: runs only the problem's own code) computes reference outputs and
  keeps them in its memory, checks candidate outputs against them, and times the baseline;
- ``candidate`` imports the candidate's file, runs it on the cases it is sent (recording
  which ATen operators ran), and times it.

A worker is spawned (``main``) or forked from the warm server (`zygote`, which calls `serve`)
before any CUDA context exists; a candidate worker may be started ahead of its candidate and get
its device ready (``warm``) while no candidate code exists in it. The reference worker may serve
many evaluations of one problem: ``begin`` starts each, it keeps its models (`ModelCache`) and the
reference outputs of the cases the harness marks cacheable (`OutputCache`).

The integrity snapshot is taken when this module loads, before any candidate code exists.
"""

from __future__ import annotations

import time

_IMPORT_T0 = time.monotonic()

import importlib  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from . import decode, kprofile, l2guard, timing  # noqa: E402  (bind what they call now, before any candidate code)
from .cases import (as_output_list, describe_output_problem, init_inputs, make_inputs,  # noqa: E402
                    make_reference_model, rewrite_in_place)
from .importguard import ImportGuard  # noqa: E402
from .integrity import Snapshot  # noqa: E402
from .oprecord import OpRecorder  # noqa: E402
from .protocol import Channel, ChannelClosed  # noqa: E402
from .reaper import become_subreaper, die_with_parent, kill_children  # noqa: E402
from .wcache import ModelCache, OutputCache, case_key, tensor_bytes  # noqa: E402

_SNAPSHOT = Snapshot()  # what the harness relies on, as it is before the candidate is imported
_GUARD: ImportGuard | None = None  # installed just before the candidate is imported


def _process_age_s() -> float | None:
    """Seconds since this process started (Linux, 10 ms resolution), or None."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


# What starting the interpreter and importing took, in a spawned worker (a worker forked from the
# server reports 0: the server imported everything once, before any worker existed).
_IMPORT_S = _process_age_s() or (time.monotonic() - _IMPORT_T0)
_device_ready: str | None = None  # the mode whose device this worker has set up

_MAX_TRACE_LINES = 40
_enumerate_threads = threading.enumerate


class CandidateLoadError(Exception):
    """The candidate file does not define a usable model class."""


def _is_compile_error(exc: BaseException) -> bool:
    """Errors a compiler would report: Triton compilation (on a GPU), what Triton's interpreter
    raises in place of it (an unknown `tl.` name, in CPU mode), extension builds, imports."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & {"CompilationError", "CompileTimeAssertionFailure", "SyntaxError", "ImportError",
                "ModuleNotFoundError", "CandidateLoadError"}:
        return True
    text = str(exc)
    if "InterpreterError" in names and (text.startswith("AttributeError(\"module 'triton.language")
                                        or text.startswith("NameError(")):
        return True
    return "Error building extension" in text or "ninja: build stopped" in text


def _format_exception(exc: BaseException) -> str:
    """The traceback without the harness's own frames: the candidate's frames and the error."""
    te = traceback.TracebackException.from_exception(exc)
    harness = str(Path(__file__).resolve().parents[1])  # the kb_env package
    for t in [te, *_chain(te)]:
        t.stack = traceback.StackSummary.from_list(
            [f for f in t.stack if not (f.filename.startswith("<frozen importlib")
                                        or str(Path(f.filename).resolve()).startswith(harness))])
    lines = "".join(te.format()).splitlines()
    if len(lines) > _MAX_TRACE_LINES:
        lines = lines[:5] + ["  ..."] + lines[-(_MAX_TRACE_LINES - 6):]
    return "\n".join(lines)


def _chain(te: traceback.TracebackException) -> list[traceback.TracebackException]:
    out = []
    while (te := te.__cause__ or te.__context__) is not None and len(out) < 10:
        out.append(te)
    return out


# A decode shape's context and step count size the inputs, not the model: its weights are one
# model for every context (built once, not once per shape: a block of weights is a gigabyte).
_INPUT_ONLY = frozenset({"context", "steps"})


def _shape_key(shape: dict[str, int], param_seed: int, decode: bool = False) -> tuple:
    return tuple(sorted((k, v) for k, v in shape.items() if not (decode and k in _INPUT_ONLY))), param_seed


def init_device(mode: str) -> None:
    """Get this worker's device ready (once): in CUDA mode a context now, and no persisting-L2
    set-aside (the driver's default has one)."""
    global _device_ready
    if _device_ready == mode:
        return
    if mode == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA mode was asked for but this worker sees no CUDA device")
        torch.zeros(1, device="cuda")
        # load_inline's module: its import asks for the CUDA driver, so the warm server leaves it to here
        importlib.import_module("torch.utils.cpp_extension")
        l2guard.bind()
        l2guard.reset(torch.cuda.current_stream().cuda_stream)
    _device_ready = mode


class _Role:
    # Models kept at once: a candidate worker keeps one (one evaluation, one shape at a time);
    # the reference worker keeps a few (it serves many evaluations), bounded by their bytes.
    max_model_bytes = 0

    def __init__(self, msg: dict[str, Any]):
        from ..problem import import_source

        self.mode: str = msg["mode"]
        self.device = "cuda" if self.mode == "cuda" else "cpu"
        init_device(self.mode)
        self.problem_dir = Path(msg["problem_dir"])
        self.decode = msg.get("interface", "forward") == "decode"
        # a decode problem's weights (a whole model block) are drawn on the device, in both workers alike
        self.weights_device = self.device if self.decode else "cpu"
        self.reference = import_source(msg["reference_source"], "kb_reference", str(self.problem_dir / "reference.py"))
        self._models = ModelCache(self.max_model_bytes)
        self._kept: list[Any] = []  # outputs of the last timed calls, until fetched
        self._last_inputs: list[Any] = []  # the previous correctness call's inputs (in-place cases)

    def build(self, shape: dict[str, int], param_seed: int) -> torch.nn.Module:
        raise NotImplementedError

    def model(self, shape: dict[str, int], param_seed: int) -> torch.nn.Module:
        key = ("timed", _shape_key(shape, param_seed, self.decode))
        return self._models.get(key, lambda: self.build(shape, param_seed))

    def inputs(self, shape: dict[str, int], seed: int, stress: dict[str, Any] | None = None) -> list[Any]:
        return make_inputs(self.reference, shape, seed, self.device, stress)

    def after_call_flags(self, threads_before: set[int]) -> list[str]:
        """Flags for what a call left behind (the candidate role checks; the reference trusts)."""
        return []

    def time(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Time one batch: a call per seed (the first `warmup` untimed), fresh inputs each call."""
        shape, param_seed = msg["shape"], msg["param_seed"]
        model = self.model(shape, param_seed)

        def make(seed: int) -> list[Any]:
            return self.inputs(shape, seed)

        self._last_inputs = []  # correctness is over: free its inputs before timing
        threads = {t.ident for t in _enumerate_threads()}
        if self.decode:
            with torch.no_grad():
                if self.mode == "cuda":
                    l2guard.reset(torch.cuda.current_stream().cuda_stream)
                times, last = timing.time_decode(model.step, make, msg["seeds"], msg["warmup"], msg["shape"]["steps"],
                                                 self.device, bool(msg["keep"]), call=not msg.get("flush_only", False),
                                                 snapshot=decode.snapshot)
            self._kept = last
            return {"ok": True, "times_ms": times, "flags": self.after_call_flags(threads)}
        with torch.no_grad():
            if self.mode == "cuda":
                l2guard.reset(torch.cuda.current_stream().cuda_stream)
                times, last = timing.time_cuda(model, make, msg["seeds"], msg["warmup"], msg["keep"], self.device,
                                               call=not msg.get("flush_only", False))
            else:
                times, last = timing.time_cpu(model, make, msg["seeds"], msg["warmup"], msg["keep"])
        self._kept = last
        return {"ok": True, "times_ms": times, "flags": self.after_call_flags(threads)}

    def outputs(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The outputs kept from the last timed batch (sent apart, so the transfer is not in its wall time).
        Decode: the last run's copies after its first step, before its last and after it, each as
        {names, values} (None where a step returned no (hidden, state) pair)."""
        kept, self._kept = self._kept, []
        if self.decode:
            return {"ok": True, "outputs": [None if k is None else {"names": k[0], "values": k[1]} for k in kept]}
        return {"ok": True, "outputs": [as_output_list(o) for o in kept]}

    def step_inputs(self, shape: dict[str, int], seed: int) -> list[Any]:
        """A decode case's [hidden, state]."""
        return self.inputs(shape, seed)


class ReferenceRole(_Role):
    """Trusted: reference outputs, the checker, the baseline timing. It may serve many evaluations
    of its problem (``begin`` starts each): it keeps its models, and the reference outputs of cases
    marked ``cache`` (the harness's pooled grading seeds) up to `cache_bytes`."""

    max_model_bytes = 2 << 30

    def __init__(self, msg: dict[str, Any]):
        super().__init__(msg)
        from ..problem import ProblemSpec, import_source

        self.spec = ProblemSpec.model_validate(msg["spec"])
        self.baseline_kind = msg["baseline"]
        self.baseline_module = (import_source(msg["baseline_source"], "kb_baseline", str(self.problem_dir / "baseline.py"))
                                if self.baseline_kind == "baseline.py" else None)
        self.expected: dict[str, Any] = {}
        self.stress_of: dict[str, Any] = {}  # case id -> its stress (a scaled case's atol follows its scale)
        self.cache = OutputCache(int(msg.get("cache_bytes") or 0))
        self._smi: tuple[float, dict[str, Any]] | None = None

    def begin(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A new evaluation: forget the last one's cases and kept state; the device as it is now."""
        self.end(msg)
        return {"ok": True, "device": self.device_info()}

    def end(self, msg: dict[str, Any]) -> dict[str, Any]:
        """An evaluation is over: free its cases' outputs (the cache keeps the pooled ones)."""
        self.expected.clear()
        self.stress_of.clear()
        self._kept, self._last_inputs = [], []
        return {"ok": True}

    def build(self, shape: dict[str, int], param_seed: int) -> torch.nn.Module:
        ref = make_reference_model(self.reference, shape, param_seed, self.weights_device)
        if self.baseline_module is not None:
            with torch.device(self.weights_device):
                base = self.baseline_module.Model(*init_inputs(self.reference, shape))
            base.load_state_dict(ref.state_dict(), strict=True)
            ref = base
        ref = ref.to(self.device).eval()
        if self.baseline_kind == "compile":
            ref = torch.compile(ref)
        return ref

    def _oracle(self, shape: dict[str, int], param_seed: int) -> torch.nn.Module:
        """The eager reference model (never the baseline), kept (`ModelCache`) across cases and
        evaluations: weights drawn under `param_seed` on the CPU (forward problems) or the device
        (decode), as in the candidate's worker."""
        key = ("oracle", _shape_key(shape, param_seed, self.decode))
        return self._models.get(key, lambda: make_reference_model(self.reference, shape, param_seed,
                                                                  self.weights_device).to(self.device).eval())

    def reference_outputs(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Compute and keep the reference outputs of each case (eager reference, not the baseline).
        A decode case keeps its fed inputs by name too (the checker compares what a step changed).
        A case marked ``cache`` is looked up in, or added to, the output cache (by shape, seed,
        parameter seed and stress: what its outputs depend on). Cases are computed shape by shape."""
        hits = 0
        cases = sorted(msg["cases"], key=lambda c: repr(_shape_key(c["shape"], c["param_seed"], self.decode)))
        for case in cases:
            key = case_key(case) if case.get("cache") else None
            if key is not None and (hit := self.cache.get(key)) is not None:
                self.expected[case["id"]] = hit
                self.stress_of[case["id"]] = case.get("stress")
                hits += 1
                continue
            ref = self._oracle(case["shape"], case["param_seed"])
            inputs = self.inputs(case["shape"], case["seed"], case.get("stress"))
            with torch.no_grad():
                if self.decode:
                    _, fed = decode.flatten(inputs[0], inputs[1])
                    names, out = decode.flatten_step(ref.step(*inputs))
                    value: Any = {"names": names, "outputs": [o.detach() for o in out], "fed": fed}
                else:
                    value = [o.detach() for o in as_output_list(ref(*inputs))]
            self.expected[case["id"]] = value
            self.stress_of[case["id"]] = case.get("stress")
            if key is not None:
                self.cache.put(key, value, tensor_bytes(value))
            del inputs
        return {"ok": True, "cache_hits": hits, "computed": len(cases) - hits}

    def reference_step(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Decode, teacher-forced: keep the reference step from a fed state given by name (the state
        a candidate's own earlier step returned), to check the candidate's step from that state."""
        names, values = msg["names"], msg["values"]
        if not isinstance(names, list) or not isinstance(values, list) or len(names) != len(values) \
                or not all(isinstance(v, torch.Tensor) for v in values):
            return {"ok": True, "usable": False, "message": "the kept state is not a list of named tensors"}
        try:
            fed = decode.unflatten(names, [v.to(self.device) for v in values])
            expected_names, _ = decode.flatten(*self.inputs(msg["case"]["shape"], msg["case"]["seed"]))
        except decode.StepShapeError as exc:
            return {"ok": True, "usable": False, "message": str(exc)}
        if names != expected_names:
            return {"ok": True, "usable": False, "message": f"the state's tensors are {names}, expected {expected_names}"}
        ref = self._oracle(msg["case"]["shape"], msg["case"]["param_seed"])
        with torch.no_grad():
            out_names, out = decode.flatten_step(ref.step(*fed))
        self.expected[msg["case"]["id"]] = {"names": out_names, "outputs": [o.detach() for o in out],
                                            "fed": decode.flatten(*fed)[1]}
        return {"ok": True, "usable": True}

    def check(self, msg: dict[str, Any]) -> dict[str, Any]:
        from ..evaluate.correctness import compare_outputs
        from ..evaluate.decode_check import compare_step

        expected = self.expected[msg["case_id"]]
        if self.decode:
            ok, mismatch, stats = compare_step(msg.get("names"), msg["outputs"], expected["names"], expected["outputs"],
                                               expected["fed"], self.spec.decode)
        else:
            ok, mismatch, stats = compare_outputs(msg["outputs"], expected,
                                                  self.spec.tolerance_for(self.stress_of.get(msg["case_id"])))
        return {"ok": True, "passed": ok, "mismatch": mismatch.model_dump() if mismatch else None, **stats}

    def device_info(self) -> dict[str, Any]:
        import platform

        info: dict[str, Any] = {"mode": self.mode, "torch": torch.__version__, "python": platform.python_version()}
        try:
            import triton

            info["triton"] = triton.__version__
        except Exception:  # noqa: BLE001 (triton is optional in a reference worker)
            info["triton"] = None
        if self.mode == "cuda":
            props = torch.cuda.get_device_properties(0)
            uuid = str(props.uuid) if getattr(props, "uuid", None) else None
            info.update(name=props.name, capability=f"{props.major}.{props.minor}", uuid=uuid,
                        sm_count=props.multi_processor_count, l2_bytes=getattr(props, "L2_cache_size", None))
            if self._smi is None or time.monotonic() - self._smi[0] > _SMI_FRESH_S:  # clocks, read at most so often
                self._smi = (time.monotonic(), _nvidia_smi(f"GPU-{uuid}" if uuid else "0"))
            info.update(self._smi[1])
        else:
            info["name"] = platform.processor() or platform.machine() or "cpu"
        return info


class CandidateRole(_Role):
    """Untrusted: the candidate's module is imported here."""

    def __init__(self, msg: dict[str, Any]):
        super().__init__(msg)
        from ..problem import import_file

        path = Path(msg["candidate_path"])
        global _GUARD
        _GUARD = ImportGuard(msg.get("forbidden_imports", []), str(path))
        _GUARD.install()
        _SNAPSHOT.watch_import_hooks()  # replacing the guard is then a flag too
        module = import_file(path, "candidate")
        sys.modules["candidate"] = module
        cls = getattr(module, "ModelNew", None) or getattr(module, "Model", None)
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise CandidateLoadError("the candidate defines no ModelNew (or Model) class deriving from torch.nn.Module")
        self.cls = cls

    def after_call_flags(self, threads_before: set[int]) -> list[str]:
        flags = []
        if any(t.is_alive() and t.ident not in threads_before for t in _enumerate_threads()):
            flags.append("background_thread")
        if self.mode == "cuda" and l2guard.violated(torch.cuda.current_stream().cuda_stream):
            flags.append("l2_persistence")
        return flags

    def build(self, shape: dict[str, int], param_seed: int) -> torch.nn.Module:
        state = make_reference_model(self.reference, shape, param_seed, self.weights_device).state_dict()
        args = init_inputs(self.reference, shape)
        try:
            model = self.cls(*args)
        except TypeError as exc:
            raise TypeError(f"{self.cls.__name__}(*init_inputs) failed with init inputs {args}: {exc}") from None
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise RuntimeError(f"ModelNew must load the reference's state_dict strictly: {exc}") from None
        del state
        if self.decode and not callable(getattr(model, "step", None)):
            raise TypeError(f"{self.cls.__name__} has no step(hidden, state) method (this is a decode problem)")
        return model.to(self.device).eval()

    def compile(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The first call of each shape, on fresh inputs whose outputs are not graded (only that they
        can be: a tensor of the right device): where Triton kernels compile and extensions load, so
        that correctness and timing run warm. Its operators and flags count like any call's."""
        ops: set[str] = set()
        flags: list[str] = []
        for case in msg["cases"]:
            reply = self.run({"case": case})
            ops.update(reply.get("ops", []))
            flags += reply.get("output_flags", [])
            if not reply["ok"]:
                return {**reply, "ops": sorted(ops), "output_flags": flags}
        self._last_inputs = []
        return {"ok": True, "ops": sorted(ops), "output_flags": flags}

    def run(self, msg: dict[str, Any]) -> dict[str, Any]:
        """One correctness call. A case marked `in_place` gets its inputs written into the previous
        call's tensors (same storage), so a cache keyed on pointers or shapes returns stale data."""
        case = msg["case"]
        model = self.model(case["shape"], case["param_seed"])
        inputs = self.inputs(case["shape"], case["seed"], case.get("stress"))
        if case.get("in_place"):
            inputs = rewrite_in_place(self._last_inputs, inputs)
        self._last_inputs = inputs
        recorder = OpRecorder()
        threads = {t.ident for t in _enumerate_threads()}
        with torch.no_grad(), recorder:
            out = model.step(*inputs) if self.decode else model(*inputs)
        if self.mode == "cuda":
            timing._sync()
        flags = self.after_call_flags(threads) + ([] if recorder.intact else ["dispatch_mode_removed"])
        names = None
        if self.decode:
            try:
                names, outs = decode.flatten_step(out)
            except decode.StepShapeError as exc:
                return {"ok": False, "error": "mismatch", "message": str(exc), "ops": sorted(recorder.ops),
                        "output_flags": flags}
        else:
            outs = as_output_list(out)
        for o in outs:
            problem = describe_output_problem(o, self.device)
            if problem:
                flags += ["tensor_subclass"] if "subclass" in problem else []
                return {"ok": False, "error": "mismatch", "message": problem, "ops": sorted(recorder.ops),
                        "output_flags": flags}
        return {"ok": True, "outputs": [o.detach() for o in outs], "names": names, "ops": sorted(recorder.ops),
                "output_flags": flags}

    def profile(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Kernel records of one call under the profiler (CUDA mode; see `kprofile`)."""
        shape = msg["shape"]
        model = self.model(shape, msg["param_seed"])
        threads = {t.ident for t in _enumerate_threads()}
        with torch.no_grad():
            if self.decode:  # a step in the steady state: two chained steps first, then the profiled one
                hidden, state = self.inputs(shape, msg["seed"])
                for _ in range(2):
                    hidden, state = model.step(hidden, state)
                records = kprofile.profile_call(model.step, [hidden, state], self.device)
            else:
                records = kprofile.profile_call(model, self.inputs(shape, msg["seed"]), self.device)
        return {"ok": True, "kernels": records, "flags": self.after_call_flags(threads)}


def _nvidia_smi(device: str) -> dict[str, Any]:
    """Driver version and current clocks of this worker's GPU (by UUID), where nvidia-smi answers."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem",
                              "--format=csv,noheader,nounits", "-i", device],
                             capture_output=True, text=True, timeout=10).stdout.strip().splitlines()
        driver, sm, mem = [x.strip() for x in out[0].split(",")]
        return {"driver": driver, "sm_clock_mhz": int(sm), "mem_clock_mhz": int(mem)}
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}


_SMI_FRESH_S = 10.0
_REFERENCE_OPS = {"begin", "end", "time", "reference_outputs", "reference_step", "check"}
_CANDIDATE_OPS = {"compile", "run", "time", "outputs", "profile"}


def _serve(channel: Channel, forked: bool) -> int:
    role: _Role | None = None
    while True:
        try:
            msg = channel.recv()
        except ChannelClosed:
            return 0
        op = msg.get("op") if isinstance(msg, dict) else None
        try:
            if op == "exit":
                channel.send({"ok": True})
                return 0
            if op == "warm" and role is None:  # a spare candidate worker: the device, no candidate yet
                t0 = time.monotonic()
                init_device(msg["mode"])
                reply = {"ok": True, "device_s": time.monotonic() - t0}
            elif op == "setup" and role is None:
                t0 = time.monotonic()
                role = ReferenceRole(msg) if msg["role"] == "reference" else CandidateRole(msg)
                reply = {"ok": True, "import_s": 0.0 if forked else _IMPORT_S, "setup_s": time.monotonic() - t0}
                if isinstance(role, ReferenceRole):
                    reply["device"] = role.device_info()
            elif role is None:
                reply = {"ok": False, "error": "runtime_error", "message": f"{op!r} before setup"}
            else:
                allowed = _REFERENCE_OPS if isinstance(role, ReferenceRole) else _CANDIDATE_OPS
                handler = getattr(role, op, None) if op in allowed else None
                if handler is None:
                    reply = {"ok": False, "error": "runtime_error", "message": f"unknown request {op!r}"}
                else:
                    reply = handler(msg)
        except BaseException as exc:  # noqa: BLE001 (everything a candidate raises is reported)
            if isinstance(exc, KeyboardInterrupt):
                raise
            kind = "compile_error" if _is_compile_error(exc) else "runtime_error"
            reply = {"ok": False, "error": kind, "message": _format_exception(exc)}
        reply["integrity"] = _SNAPSHOT.violations() + (_GUARD.violations if _GUARD else [])
        if _GUARD is not None and kill_children():  # a candidate worker: no process may outlive a request
            reply["integrity"].append("leftover_process")
        channel.send(reply)


def serve(read_fd: int, write_fd: int, max_file: int = 0, parent_pid: int = 0, forked: bool = False) -> int:
    """The worker loop on its channel; `max_file` bounds each file it writes (0: no limit), and it
    dies with `parent_pid` (the harness)."""
    die_with_parent(parent_pid)  # the harness gone, this worker goes too
    # torch's CPU ops on one thread: the reference's outputs and every input are the same arithmetic
    # whatever the machine's core count, and never a parallel region's first-use error (see `cases`)
    torch.set_num_threads(1)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a segfaulting candidate leaves no core file
    become_subreaper()  # a candidate's double-forked daemon stays below this worker, to be found
    if max_file > 0:  # bounds the captured stdout too; Python turns the signal into OSError EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file, max_file))
    return _serve(Channel(read_fd, write_fd), forked)


def main(argv: list[str]) -> int:
    """argv: READ_FD WRITE_FD [MAX_FILE_BYTES (0: no limit) [PARENT_PID]]."""
    return serve(int(argv[1]), int(argv[2]), int(argv[3]) if len(argv) > 3 else 0,
                 int(argv[4]) if len(argv) > 4 else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
