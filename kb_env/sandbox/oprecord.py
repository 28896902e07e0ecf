"""Inside a worker: which ATen operators ran during a call, as the dispatcher sees them.

A Triton or CUDA-extension kernel launch is not an ATen operator; `torch.softmax` is
(`aten::_softmax`). The harness compares what ran against the problem's forbidden list."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack


class OpRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()
        self.intact = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func._schema.name)
        return func(*args, **(kwargs or {}))

    def __exit__(self, *exc):
        # A candidate that popped or replaced this mode mid-call leaves a different stack.
        if not any(m is self for m in _get_current_dispatch_mode_stack()):
            self.intact = False
        return super().__exit__(*exc)
