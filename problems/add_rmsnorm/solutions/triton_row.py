"""Residual add + RMSNorm in one Triton kernel: one program per row, the row in registers. x and the
residual are read once; the new residual stream and the normalised row are written once."""

import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

# Triton's interpreter (CPU mode) truncates float32 -> bfloat16 casts; there we round by hand.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _round_bf16(x, INTERPRET: tl.constexpr):
    """float32 -> bfloat16, round to nearest even."""
    if INTERPRET:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(tl.bfloat16)


@triton.jit
def _add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, h_ptr, n_cols, stride_x, stride_r, stride_out, stride_h, eps,
                        BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    h = _round_bf16(x + r, INTERPRET)  # the residual stream is bfloat16; the norm reads it rounded
    tl.store(h_ptr + row * stride_h + cols, h, mask=mask)
    hf = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, _round_bf16(hf * rstd * w, INTERPRET), mask=mask)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    r2 = residual.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if r2.stride(-1) != 1:
        r2 = r2.contiguous()
    rows, cols = x2.shape
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    h = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(cols)
    warps = 4 if block <= 1024 else (8 if block <= 4096 else 16)
    _add_rmsnorm_kernel[(rows,)](x2, r2, weight, out, h, cols, x2.stride(0), r2.stride(0), out.stride(0), h.stride(0),
                                 eps, BLOCK=block, INTERPRET=INTERPRET, num_warps=warps)
    return out.reshape(shape), h.reshape(shape)


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return add_rmsnorm(x, residual, self.weight, self.eps)
