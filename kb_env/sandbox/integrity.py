"""Inside a worker: what the harness relies on, captured before the candidate is imported,
and a check that reports (as short flag names) anything the candidate replaced or changed."""

from __future__ import annotations

import threading
import time
import types

import torch
import torch.nn.init
import torch.profiler


def _harness_targets() -> dict[str, tuple[object, str]]:
    """The harness's own functions inside the worker: a candidate can import these modules too."""
    from . import cases, kprofile, l2guard, oprecord, protocol, reaper, timing

    out: dict[str, tuple[object, str]] = {}
    for module, names in ((timing, ["_perf_counter", "_zero", "_Event", "_record", "_elapsed", "_sync",
                                    "time_cuda", "time_cpu", "l2_flush_buffer"]),
                          (cases, ["make_inputs", "make_reference_model", "as_output_list", "describe_output_problem",
                                   "rewrite_in_place"]),
                          (kprofile, ["profile_call", "kernel_records", "profile", "record_function", "_sync", "_zero"]),
                          (l2guard, ["persisting_state", "reset", "violated"]),
                          (reaper, ["kill_children", "children", "stat_of", "kill_tree", "reap"]),
                          (protocol, ["_encode", "Channel"])):
        for name in names:
            out[f"{module.__name__}.{name}"] = (module, name)
    out["kb_env.sandbox.protocol.Channel.send"] = (protocol.Channel, "send")
    out["kb_env.sandbox.oprecord.OpRecorder.__torch_dispatch__"] = (oprecord.OpRecorder, "__torch_dispatch__")
    out["kb_env.sandbox.oprecord.OpRecorder.__exit__"] = (oprecord.OpRecorder, "__exit__")
    out["torch._C._pop_torch_dispatch_stack"] = (torch._C, "_pop_torch_dispatch_stack")
    import torch.utils._python_dispatch as pd
    out["torch.utils._python_dispatch._pop_torch_dispatch_stack"] = (pd, "_pop_torch_dispatch_stack")
    return out


def _targets() -> dict[str, tuple[object, str]]:
    targets: dict[str, tuple[object, str]] = {
        "time.perf_counter": (time, "perf_counter"),
        "time.monotonic": (time, "monotonic"),
        "torch.Tensor.zero_": (torch.Tensor, "zero_"),
        "torch.Tensor.cpu": (torch.Tensor, "cpu"),
        "torch.nn.Module.__call__": (torch.nn.Module, "__call__"),
        "torch.nn.Module.load_state_dict": (torch.nn.Module, "load_state_dict"),
        "torch.cuda.synchronize": (torch.cuda, "synchronize"),
        "torch.cuda.Event": (torch.cuda, "Event"),
        "torch.cuda.Event.record": (torch.cuda.Event, "record"),
        "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
        "torch.cuda.Event.synchronize": (torch.cuda.Event, "synchronize"),
        "threading.enumerate": (threading, "enumerate"),
        "torch.profiler.profile.export_chrome_trace": (torch.profiler.profile, "export_chrome_trace"),
        "torch.profiler.profile.__exit__": (torch.profiler.profile, "__exit__"),
    }
    # The candidate's weights are drawn in its own process: a replaced init would change them.
    for name in dir(torch.nn.init):
        fn = getattr(torch.nn.init, name)
        if callable(fn) and not name.startswith("_") and getattr(fn, "__module__", "") == "torch.nn.init":
            targets[f"torch.nn.init.{name}"] = (torch.nn.init, name)
    return targets | _harness_targets()


def _flags_state() -> dict[str, object]:
    b = torch.backends
    return {
        "matmul.allow_tf32": b.cuda.matmul.allow_tf32,
        "matmul.allow_fp16_reduced_precision_reduction": b.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "matmul.allow_bf16_reduced_precision_reduction": b.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "cudnn.allow_tf32": b.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
    }


_EMPTY = object()


def _fingerprint(fn: object) -> tuple:
    """What a function does, beyond which object it is: a Python function keeps its identity when
    its code, defaults or closure cells are swapped (`f.__code__ = g.__code__`). The objects
    themselves are kept (compared by identity), so none can be freed and its id reused."""
    if not isinstance(fn, types.FunctionType):
        return (fn,)
    cells = []
    for cell in fn.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # an empty cell
            cells.append(_EMPTY)
    return (fn, fn.__code__, *(fn.__defaults__ or ()), *sorted((fn.__kwdefaults__ or {}).items()), *cells)


class Snapshot:
    """Identity (and, for Python functions, code, defaults and closure) of every harness function
    and the value of every global torch flag, at capture.

    This runs inside the candidate's process, so it is a tripwire, not a wall: a candidate that
    rewrites this checker too is caught by what the trusted side measures (the wall-clock check)."""

    def __init__(self) -> None:
        self.targets = _targets()
        self.functions = {name: _fingerprint(getattr(owner, attr)) for name, (owner, attr) in self.targets.items()}
        self.flags = _flags_state()

    def watch_import_hooks(self) -> None:
        """Also watch the import functions (once the import guard has replaced them)."""
        import builtins
        import importlib

        for name, owner, attr in (("builtins.__import__", builtins, "__import__"),
                                  ("importlib.import_module", importlib, "import_module")):
            self.targets[name] = (owner, attr)
            self.functions[name] = _fingerprint(getattr(owner, attr))

    def violations(self) -> list[str]:
        out = []
        for name, (owner, attr) in self.targets.items():
            if not _same(_fingerprint(getattr(owner, attr, None)), self.functions[name]):
                out.append(f"patched:{name}")
        now = _flags_state()
        out += [f"torch_flag:{k}" for k, v in self.flags.items() if now[k] != v]
        return out


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x is y or (isinstance(x, tuple) and isinstance(y, tuple) and _same(x, y))
                                    for x, y in zip(a, b))
