"""Inside a worker: build a problem's model and inputs for one case, the same way in the
reference process and the candidate process, so both see bit-identical inputs and weights.

Both are built on one CPU thread (`one_thread`): bit-identical means the same arithmetic in both
processes, and torch's CPU ops are not the same arithmetic on every thread of a process. With
torch 2.13's CPU build (MKL, OpenMP) on the 2-core development machine, the second thread's half
of a process's first parallel float32 ``torch.sqrt`` or ``torch.sin`` came out up to 3e-4 off
(relative) in a few fresh processes in a hundred; a heavy-tailed stress case's inputs then
differed between the reference and candidate workers (5 of 560 known-good softmax evaluations
after the battery's composed_pow attack), and a correct kernel failed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch's CPU ops on the calling thread only, then restore the thread count (a candidate
    may have set its own)."""
    before = torch.get_num_threads()
    if before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before != 1:
            torch.set_num_threads(before)


def make_inputs(reference: ModuleType, shape: dict[str, int], seed: int, device: str,
                stress: dict[str, Any] | None = None) -> list[Any]:
    """``reference.get_inputs(**shape)`` drawn under `seed` with `device` as the default device,
    so large inputs are drawn on the GPU (its generator is seeded too); anything a reference
    creates elsewhere is moved to `device`. A `stress` (`kb_env.problem.Stress` as a dict)
    transforms every floating input: times `scale`, and with `heavy_tail` times a Student-t
    factor per element, drawn right after the inputs from the same seeded generator (so the
    reference and candidate workers draw the same factors)."""
    torch.manual_seed(seed)
    with one_thread(), torch.device(device):
        inputs = reference.get_inputs(**shape)
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
        if stress:
            inputs = [_stressed(x, stress) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                      for x in inputs]
    return inputs


STRESS_SLICE = 1 << 24  # elements transformed at a time


def _stressed(x: torch.Tensor, stress: dict[str, Any]) -> torch.Tensor:
    """`x` scaled by `stress["scale"]` and, with `stress["heavy_tail"]` = dof, each element times
    sqrt(dof / chi2(dof)) (chi2 as a sum of dof squared normals), computed in float32. Done in
    slices of STRESS_SLICE elements, so the peak memory is one more copy of `x` in its own dtype
    whatever its size (a 1 GB bfloat16 input would otherwise need about 16 GB of float32
    temporaries for a heavy tail of 3 degrees of freedom)."""
    scale, dof = float(stress.get("scale", 1.0)), stress.get("heavy_tail")
    flat = x.contiguous().view(-1)
    out = torch.empty_like(flat)
    for start in range(0, flat.numel(), STRESS_SLICE):
        part = flat[start:start + STRESS_SLICE].float() * scale
        if dof:
            chi2 = torch.zeros_like(part)
            for _ in range(int(dof)):
                chi2 += torch.randn(part.shape, device=x.device).square_()
            part *= torch.sqrt(dof / chi2.clamp_min_(1e-12))
        out[start:start + STRESS_SLICE] = part.to(x.dtype)
    out = out.view(x.shape)
    return out if x.is_contiguous() else torch.empty_like(x).copy_(out)  # keep a strided input's layout


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


def make_reference_model(reference: ModuleType, shape: dict[str, int], param_seed: int,
                         device: str = "cpu") -> torch.nn.Module:
    """The reference Model with weights drawn under `param_seed`, on `device` (the CPU for forward
    problems; a decode problem's block of weights is drawn on the GPU in CUDA mode)."""
    torch.manual_seed(param_seed)
    with one_thread(), torch.device(device):
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
