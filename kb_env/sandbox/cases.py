"""Inside a worker: build a problem's model and inputs for one case, the same way in the
reference process and the candidate process, so both see bit-identical inputs and weights."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch


def make_inputs(reference: ModuleType, shape: dict[str, int], seed: int, device: str,
                scale: float = 1.0) -> list[Any]:
    """``reference.get_inputs(**shape)`` drawn under `seed` with `device` as the default device,
    so large inputs are drawn on the GPU (its generator is seeded too); anything a reference
    creates elsewhere is moved to `device`. A `scale` other than 1 multiplies every floating
    input (a stress case)."""
    torch.manual_seed(seed)
    with torch.device(device):
        inputs = reference.get_inputs(**shape)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    if scale != 1.0:
        inputs = [x * scale if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    return inputs


def rewrite_in_place(old: list[Any], new: list[Any]) -> list[Any]:
    """`new`'s values written into `old`'s tensors (same storage, version bumped), so a
    candidate that keys a cache on pointers or shapes sees stale keys with new content."""
    if len(old) != len(new):
        return new
    out = []
    for o, n in zip(old, new):
        if isinstance(o, torch.Tensor) and isinstance(n, torch.Tensor) and o.shape == n.shape and o.dtype == n.dtype:
            o.copy_(n)
            out.append(o)
        else:
            out.append(n)
    return out


def init_inputs(reference: ModuleType, shape: dict[str, int]) -> list[Any]:
    return list(reference.get_init_inputs(**shape))


def make_reference_model(reference: ModuleType, shape: dict[str, int], param_seed: int) -> torch.nn.Module:
    """The reference Model with weights drawn under `param_seed`, on the CPU."""
    torch.manual_seed(param_seed)
    return reference.Model(*init_inputs(reference, shape))


def as_output_list(out: Any) -> list[Any]:
    """A forward's result as a list of outputs (a single tensor becomes a one-element list)."""
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


def describe_output_problem(out: Any, device_type: str) -> str | None:
    """Why `out` cannot be graded (not a tensor, a subclass, wrong device), or None."""
    if not isinstance(out, torch.Tensor):
        return f"output is a {type(out).__name__}, not a torch.Tensor"
    if type(out) is not torch.Tensor:
        return f"output is a tensor subclass ({type(out).__name__}), not a plain torch.Tensor"
    if out.device.type != device_type:
        return f"output is on {out.device}, expected a {device_type} tensor"
    return None
