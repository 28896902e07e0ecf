"""What one forward call of a KernelBench reference does, measured without doing it.

The model is built and called on fake tensors (``FakeTensorMode``: shapes and dtypes, no data),
so a problem with gigabytes of inputs costs nothing to measure. Counted:

- FLOPs by torch's FLOP counter (``torch.utils.flop_counter.FlopCounterMode``): matrix products,
  convolutions and attention, at 2 FLOPs per multiply-add; elementwise work and reductions count
  zero (they set no roofline that the bytes do not). The call is traced with oneDNN off so that
  recurrent layers decompose into the products the counter sees, and CPU attention is counted
  with the formula of its CUDA kernels.
- bytes as a lower bound: every input tensor, every parameter and buffer (each tensor once) and
  every output, each moved once.
- the ATen operators the call dispatches (as `kb_env.sandbox.oprecord` names them), which become
  the problem's forbidden ops.

A reference that fake tensors cannot run (it reads values, e.g. ``.item()``) is run for real;
the probe process's memory limit bounds what that may cost."""

from __future__ import annotations

import warnings
from types import ModuleType

import torch
from pydantic import BaseModel
from torch.utils._python_dispatch import TorchDispatchMode

from ..sandbox.cases import as_output_list


class TensorInfo(BaseModel):
    shape: list[int]
    dtype: str


class Traced(BaseModel):
    """The facts of one forward call (see the module docstring)."""

    on: str  # "fake tensors" or "real tensors"
    flops: int
    flops_by_op: dict[str, int]
    input_bytes: int
    state_bytes: int
    output_bytes: int
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    dtype_bytes: dict[str, int]  # floating bytes of inputs, parameters and buffers, by dtype
    ops: list[str]
    stray_tensors: list[str]  # tensor attributes outside the state_dict

    @property
    def bytes(self) -> int:
        return self.input_bytes + self.state_bytes + self.output_bytes


class TraceError(Exception):
    """The reference cannot be called as KernelBench's contract says; the message says why."""


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func._schema.name)
        return func(*args, **(kwargs or {}))


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _flop_mapping() -> dict:
    """CPU attention counted as the CUDA attention kernels are (the counter knows only those)."""
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten
    cpu, cuda = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None), aten._scaled_dot_product_flash_attention
    if cpu is None or cuda not in flop_registry:
        return {}
    formula = flop_registry[cuda]

    def cpu_attention(*args, **kwargs):
        return formula(*args, **kwargs)

    cpu_attention._get_raw = True  # the registry's formula already takes tensors
    return {cpu: cpu_attention}


def _module_ops(model: torch.nn.Module) -> set[str]:
    """The ATen ops of recurrent layers, which dispatch as plain products and pointwise ops on
    the CPU (``aten::_cudnn_rnn`` on a GPU): named so that their family is forbidden too."""
    names = {"LSTM": "aten::lstm", "GRU": "aten::gru", "RNN_TANH": "aten::rnn_tanh", "RNN_RELU": "aten::rnn_relu"}
    return {names[m.mode] for m in model.modules() if isinstance(m, torch.nn.RNNBase) and m.mode in names}


def stray_tensors(model: torch.nn.Module) -> list[str]:
    """Tensor attributes of `model`'s modules that are neither parameters nor buffers: a
    candidate that loads the state_dict does not get them."""
    out = []
    for prefix, mod in model.named_modules():
        for key, value in vars(mod).items():
            if isinstance(value, torch.Tensor):
                out.append(f"{prefix}.{key}" if prefix else key)
    return sorted(out)


def _call(module: ModuleType) -> Traced:
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs())
    if not isinstance(model, torch.nn.Module):
        raise TraceError(f"Model(*get_init_inputs()) is a {type(model).__name__}, not a torch.nn.Module")
    model.eval()
    inputs = module.get_inputs()
    if not isinstance(inputs, (list, tuple)):
        raise TraceError(f"get_inputs() returns a {type(inputs).__name__}, not a list")
    inputs = list(inputs)
    recorder = _Recorder()
    with torch.no_grad(), recorder:  # the dispatch a candidate's worker sees
        out = model(*inputs)
    from torch.utils.flop_counter import FlopCounterMode

    counted = _Recorder()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # oneDNN's flags warn about Intel GPUs
        with torch.backends.mkldnn.flags(enabled=False), \
                FlopCounterMode(display=False, custom_mapping=_flop_mapping()) as counter, counted:
            model(*inputs)
    outs = as_output_list(out)
    for k, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            raise TraceError(f"forward returns a {type(o).__name__} as output {k}, not a tensor")
    state = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    in_tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    dtype_bytes: dict[str, int] = {}
    for t in [*in_tensors, *state.values()]:
        if t.is_floating_point():
            dtype_bytes[_dtype(t)] = dtype_bytes.get(_dtype(t), 0) + _nbytes(t)
    by_op = {str(k).replace(".", "::", 1): int(v) for k, v in counter.get_flop_counts().get("Global", {}).items()}
    ops = recorder.ops | counted.ops | _module_ops(model)
    ops = sorted(op for op in ops if not op.startswith("prim::"))
    return Traced(on="", flops=int(counter.get_total_flops()), flops_by_op=by_op,
                  input_bytes=sum(_nbytes(x) for x in in_tensors), state_bytes=sum(_nbytes(t) for t in state.values()),
                  output_bytes=sum(_nbytes(o) for o in outs),
                  inputs=[TensorInfo(shape=list(x.shape), dtype=_dtype(x)) for x in in_tensors],
                  outputs=[TensorInfo(shape=list(o.shape), dtype=_dtype(o)) for o in outs],
                  dtype_bytes=dtype_bytes, ops=ops, stray_tensors=stray_tensors(model))


def trace(module: ModuleType) -> tuple[Traced, str | None]:
    """The facts of `module`'s forward call, and why fake tensors could not be used (or None)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.distributions.Distribution.set_default_validate_args(False)  # validation reads values
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            return _call(module).model_copy(update={"on": "fake tensors"}), None
    except TraceError:
        raise
    except Exception as exc:  # noqa: BLE001 (any failure: try real tensors)
        why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
    return _call(module).model_copy(update={"on": "real tensors"}), why
