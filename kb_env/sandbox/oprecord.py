"""Inside a worker: which ATen operators ran during a call, as the dispatcher sees them.

A Triton or CUDA-extension kernel launch is not an ATen operator; `torch.softmax` is
(`aten::_softmax`). The harness compares what ran against the problem's rules.

A candidate can take a Python dispatch mode off the stack (``_pop_mode``,
``_disable_current_modes()``, ``_pop_mode_temporarily``) and run ops unseen. Every such path
pops through ``_pop_torch_dispatch_stack``, which this module replaces, when it loads (before
any candidate code), with a watcher: popping an active recorder's mode, even for a moment, marks
the recorder not intact (``dispatch_mode_removed``). Replacing the watcher is an integrity
flag (`integrity` lists it). On a GPU the profiler's kernel check is a second, independent
line: torch's kernels are not the candidate's own."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._python_dispatch as _pd
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

_pop_original = torch._C._pop_torch_dispatch_stack
_active: list["OpRecorder"] = []


def _watched_pop(*args: Any) -> Any:
    mode = _pop_original(*args)
    for rec in _active:
        if mode is rec and not rec._exiting:
            rec.intact = False
    return mode


torch._C._pop_torch_dispatch_stack = _watched_pop
_pd._pop_torch_dispatch_stack = _watched_pop


class OpRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()
        self.intact = True
        self._exiting = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func._schema.name)
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> "OpRecorder":
        _active.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        if self in _active:
            _active.remove(self)
        if not any(m is self for m in _get_current_dispatch_mode_stack()):
            self.intact = False  # gone for good: its own exit would fail to pop it
            return None
        self._exiting = True
        return super().__exit__(*exc)
