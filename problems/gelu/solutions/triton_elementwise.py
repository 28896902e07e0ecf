"""Exact (erf) GELU in Triton: a flat elementwise kernel, each program one contiguous block,
computed in float32 with tl.erf and rounded once to bfloat16. Memory-bound: one read, one write."""

import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

# Triton's interpreter (CPU mode) truncates float32 -> bfloat16 whatever the rounding asked for:
# there the output is rounded by hand.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK = 4096


@triton.jit
def _to_bf16(x, INTERPRETED: tl.constexpr):
    """float32 -> bfloat16, rounded to nearest even."""
    if INTERPRETED:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)  # now exact in bfloat16: the truncating cast keeps it
    return x.to(tl.bfloat16, fp_downcast_rounding="rtne")


@triton.jit
def _gelu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, INTERPRETED: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    tl.store(out_ptr + offs, _to_bf16(y, INTERPRETED), mask=mask)


def gelu(x: torch.Tensor) -> torch.Tensor:
    assert x.dtype == torch.bfloat16
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    _gelu_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK, INTERPRETED=INTERPRETED, num_warps=8)
    return out


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu(x)
