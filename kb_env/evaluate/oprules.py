"""Which torch operators a candidate may run: the problem's forbidden list, and (where the
problem gives one) an allowlist of compute operators on top of the structural ones every
kernel wrapper needs (allocating outputs, views, copies).

Ops are ATen overload packets as the dispatcher names them (``aten::_softmax``)."""

from __future__ import annotations

from collections.abc import Iterable

from ..problem import Forbidden

# Allocation, views, layout and copies: no arithmetic on the problem's data. Triton's CPU
# interpreter itself calls copy_/set_/new_empty to move blocks in and out.
STRUCTURAL_OPS = frozenset(f"aten::{name}" for name in """
    empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like new_zeros ones ones_like
    new_ones full full_like new_full fill_ zero_ arange scalar_tensor lift_fresh alias detach detach_
    view _unsafe_view view_as reshape _reshape_alias as_strided t transpose permute expand expand_as
    squeeze unsqueeze flatten unflatten select slice narrow split split_with_sizes chunk unbind
    contiguous clone copy_ _to_copy to _copy_from _copy_from_and_resize resize_ set_ size stride
    numel dim is_contiguous _local_scalar_dense item sym_size sym_stride sym_numel record_stream
    """.split())


def op_flags(ops: Iterable[str], rules: Forbidden) -> list[str]:
    """Flags for the ops a candidate ran: ``forbidden_op:<op>`` for a listed op, and
    ``unlisted_op:<op>`` for a compute op outside the problem's allowlist (when it has one)."""
    flags = set()
    forbidden = set(rules.torch_ops)
    allowed = None if rules.allowed_torch_ops is None else STRUCTURAL_OPS | set(rules.allowed_torch_ops)
    for op in ops:
        if op in forbidden:
            flags.add(f"forbidden_op:{op}")
        elif allowed is not None and op not in allowed:
            flags.add(f"unlisted_op:{op}")
    return sorted(flags)
