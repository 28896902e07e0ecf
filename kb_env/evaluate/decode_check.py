"""Trusted comparison of one decode step (the `decode` interface) against the reference's.

Runs in the reference process. A step returns named tensors (the next hidden, then every tensor
of the new state, as `kb_env.sandbox.decode` flattens them); each must have the reference's name,
shape, dtype and device type, be finite, and meet the problem's `DecodeCheck` bars by cosine
similarity:

- every tensor against the reference's (`min_cosine`);
- a tensor carried through at the same shape (the hidden, a recurrent state, a conv window):
  what the step changed, returned minus fed, against the reference's change (`min_delta_cosine`):
  an echo of the fed hidden or a stale state changes nothing, and where the change is small
  against the carried value (a residual stream) the full cosine alone would let it through;
- a cache grown along its first dimension: the fed rows kept (`min_prefix_cosine`: they are
  copies) and the new rows against the reference's (`min_cosine`).

A zero vector has no direction: its cosine is 0, so an all-zeros answer fails everywhere."""

from __future__ import annotations

import math

import torch

from ..problem import DecodeCheck
from .result import Mismatch


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two tensors flattened, in float64; 0 if either is all zeros."""
    a, b = a.double().flatten(), b.double().flatten()
    denom = float(torch.linalg.vector_norm(a) * torch.linalg.vector_norm(b))
    return float(a @ b) / denom if denom > 0 else 0.0


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def compare_step(names: list[str] | None, got: list[torch.Tensor], expected_names: list[str],
                 expected: list[torch.Tensor], fed: list[torch.Tensor], bars: DecodeCheck
                 ) -> tuple[bool, Mismatch | None, dict[str, float]]:
    """(passed, first mismatch or None, {rel_l2_err, max_abs_err, min_cosine}) for one step.
    `fed` holds the step's inputs flattened the same way (hidden first, then the fed state)."""
    stats = {"rel_l2_err": 0.0, "max_abs_err": 0.0, "min_cosine": 1.0}
    if names != expected_names or len(got) != len(expected):
        return False, Mismatch(output=0, reason="count",
                               message=f"step returned {names or '?'}; expected the hidden and the state's "
                                       f"tensors {expected_names}"), stats
    fed_by_name = dict(zip(expected_names, fed))
    for i, (name, g, e) in enumerate(zip(names, got, expected)):
        if not isinstance(g, torch.Tensor):
            return False, Mismatch(output=i, reason="invalid", message=f"{name} is not a tensor"), stats
        if tuple(g.shape) != tuple(e.shape):
            return False, Mismatch(output=i, reason="shape", message=f"{name} has shape {tuple(g.shape)}, "
                                                                     f"expected {tuple(e.shape)}"), stats
        if g.dtype != e.dtype:
            return False, Mismatch(output=i, reason="dtype", message=f"{name} has dtype {_dtype_name(g.dtype)}, "
                                                                     f"expected {_dtype_name(e.dtype)}"), stats
        g = g.to(e.device)
        if not bool(torch.isfinite(g).all()):
            n_bad = int((~torch.isfinite(g)).sum())
            return False, Mismatch(output=i, reason="nonfinite", n_bad=n_bad, n_total=g.numel(),
                                   message=f"{name} has {n_bad} non-finite value(s)"), stats
        diff = (g.double() - e.double())
        ref_norm = float(torch.linalg.vector_norm(e.double()))
        rel = float(torch.linalg.vector_norm(diff)) / ref_norm if ref_norm > 0 else math.inf
        stats["rel_l2_err"] = max(stats["rel_l2_err"], rel)
        stats["max_abs_err"] = max(stats["max_abs_err"], float(diff.abs().max()) if diff.numel() else 0.0)
        for what, c, bar in _cosines(name, g, e, fed_by_name.get(name), bars):
            stats["min_cosine"] = min(stats["min_cosine"], c)
            if c < bar:
                return False, Mismatch(output=i, reason="values", cosine=c, rel_l2_err=rel,
                                       message=f"{name}: cosine similarity of {what} {c:.5f} under {bar}"), stats
    return True, None, stats


def _cosines(name: str, g: torch.Tensor, e: torch.Tensor, fed: torch.Tensor | None, bars: DecodeCheck
             ) -> list[tuple[str, float, float]]:
    """(what, cosine, bar) for each comparison this tensor gets."""
    if fed is None or fed.dim() != e.dim():
        return [("the tensor", cosine(g, e), bars.min_cosine)]
    fed = fed.to(e.device)
    if tuple(fed.shape) == tuple(e.shape):
        out = [("the tensor", cosine(g, e), bars.min_cosine)]
        change = e.double() - fed.double()
        if float(change.abs().max()) > 0:  # a tensor the step left alone has no change to compare
            out.append(("what the step changed (returned minus fed)", cosine(g.double() - fed.double(), change),
                        bars.min_delta_cosine))
        return out
    n = fed.shape[0]
    if e.shape[0] > n and tuple(e.shape[1:]) == tuple(fed.shape[1:]):  # a cache grown by the step
        return [("the fed rows (a grown cache keeps them)", cosine(g[:n], fed), bars.min_prefix_cosine),
                ("the new rows", cosine(g[n:], e[n:]), bars.min_cosine)]
    return [("the tensor", cosine(g, e), bars.min_cosine)]
