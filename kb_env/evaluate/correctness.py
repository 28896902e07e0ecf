"""Trusted comparison of candidate outputs against reference outputs.

Runs in the reference process (trusted code only), on its device. A case passes when every
output has the reference's count, shape and dtype, is finite wherever the reference is, and
meets the problem's `Tolerance` for its dtype: elementwise ``|got - exp| <= atol + rtol*|exp|``
and a relative-L2 bound (plus cosine, if set), so an all-zeros answer never passes."""

from __future__ import annotations

import math

import torch

from ..problem import Tolerance
from .result import Mismatch

_EXACT_DTYPES = {torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def compare_outputs(got: list[torch.Tensor], expected: list[torch.Tensor],
                    tolerance: dict[str, Tolerance]) -> tuple[bool, Mismatch | None, dict[str, float]]:
    """(passed, first mismatch or None, worst {rel_l2_err, max_abs_err} over outputs)."""
    if len(got) != len(expected):
        return False, Mismatch(output=0, reason="count",
                               message=f"returned {len(got)} output(s), expected {len(expected)}"), {}
    worst = {"rel_l2_err": 0.0, "max_abs_err": 0.0}
    for i, (g, e) in enumerate(zip(got, expected)):
        if not isinstance(g, torch.Tensor):
            return False, Mismatch(output=i, reason="invalid", message=f"output {i} is not a tensor"), worst
        if tuple(g.shape) != tuple(e.shape):
            return False, Mismatch(output=i, reason="shape",
                                   message=f"output {i} has shape {tuple(g.shape)}, expected {tuple(e.shape)}"), worst
        if g.dtype != e.dtype:
            return False, Mismatch(output=i, reason="dtype",
                                   message=f"output {i} has dtype {_dtype_name(g.dtype)}, expected {_dtype_name(e.dtype)}"), worst
        g = g.to(e.device)
        if e.dtype in _EXACT_DTYPES:
            bad = g != e
            n_bad = int(bad.sum())
            if n_bad:
                idx = [int(v) for v in torch.nonzero(bad)[0].tolist()] if g.dim() else []
                return False, Mismatch(output=i, reason="values", message=f"output {i}: {n_bad} of {g.numel()} values differ",
                                       index=idx, got=float(g[tuple(idx)]), expected=float(e[tuple(idx)]),
                                       n_bad=n_bad, n_total=g.numel()), worst
            continue
        tol = tolerance.get(_dtype_name(e.dtype))
        if tol is None:
            raise ValueError(f"the problem sets no tolerance for dtype {_dtype_name(e.dtype)}")
        ok, mismatch, stats = _compare_float(i, g, e, tol)
        worst = {k: max(worst[k], stats[k]) for k in worst}
        if not ok:
            return False, mismatch, worst
    return True, None, worst


def _compare_float(i: int, g: torch.Tensor, e: torch.Tensor, tol: Tolerance) -> tuple[bool, Mismatch | None, dict[str, float]]:
    gw, ew = g.to(torch.float64), e.to(torch.float64)
    n = g.numel()
    finite_e = torch.isfinite(ew)
    # Non-finite where the reference is finite, or not the same infinity where it is infinite.
    nonfinite = (~torch.isfinite(gw) & finite_e) | (torch.isinf(ew) & (gw != ew))
    if bool(nonfinite.any()):
        idx = [int(v) for v in torch.nonzero(nonfinite)[0].tolist()]
        val = float(gw[tuple(idx)])
        return False, Mismatch(output=i, reason="nonfinite", index=idx, got=val, expected=float(ew[tuple(idx)]),
                               n_bad=int(nonfinite.sum()), n_total=n,
                               message=(f"output {i} has {int(nonfinite.sum())} value(s) that are non-finite or miss the reference's "
                                        f"infinities (got {val}, expected {float(ew[tuple(idx)])} at {idx})")), \
            {"rel_l2_err": math.inf, "max_abs_err": math.inf}
    diff = torch.where(finite_e, (gw - ew).abs(), torch.zeros_like(gw))
    bound = tol.atol + tol.rtol * ew.abs()
    bad = (diff > bound) & finite_e
    n_bad = int(bad.sum())
    ref_norm = float(torch.linalg.vector_norm(torch.where(finite_e, ew, 0)))
    diff_norm = float(torch.linalg.vector_norm(diff))
    rel_l2 = diff_norm / ref_norm if ref_norm > 0 else (0.0 if diff_norm == 0 else math.inf)
    max_abs = float(diff.max()) if n else 0.0
    stats = {"rel_l2_err": rel_l2, "max_abs_err": max_abs}
    cosine = None
    if tol.min_cosine is not None:
        gf, ef = torch.where(finite_e, gw, 0).flatten(), torch.where(finite_e, ew, 0).flatten()
        denom = float(torch.linalg.vector_norm(gf) * torch.linalg.vector_norm(ef))
        cosine = float(gf @ ef) / denom if denom > 0 else 0.0
    rel_err = diff / ew.abs().clamp_min(tol.atol if tol.atol > 0 else 1e-30)
    common = dict(output=i, max_abs_err=max_abs, max_rel_err=float(rel_err.max()) if n else 0.0,
                  rel_l2_err=rel_l2, cosine=cosine, n_bad=n_bad, n_total=n)
    if n_bad:
        idx = [int(v) for v in torch.nonzero(bad)[0].tolist()]
        got, exp = float(gw[tuple(idx)]), float(ew[tuple(idx)])
        return False, Mismatch(reason="values", index=idx, got=got, expected=exp,
                               message=(f"output {i}: {n_bad} of {n} values outside atol={tol.atol:g} rtol={tol.rtol:g}, "
                                        f"the first at {idx} (got {got:.7g}, expected {exp:.7g}); "
                                        f"max abs error {max_abs:.3g}, relative L2 error {rel_l2:.3g}"), **common), stats
    if rel_l2 > tol.max_rel_l2:
        return False, Mismatch(reason="values", message=(f"output {i}: relative L2 error {rel_l2:.3g} over the bar "
                                                        f"{tol.max_rel_l2:g} (every element is within atol/rtol)"),
                               **common), stats
    if cosine is not None and cosine < tol.min_cosine:
        return False, Mismatch(reason="values", message=f"output {i}: cosine similarity {cosine:.6f} under {tol.min_cosine}",
                               **common), stats
    return True, None, stats
