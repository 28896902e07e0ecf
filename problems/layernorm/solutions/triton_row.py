"""LayerNorm in Triton: one program per row, the whole row in registers; mean, then the variance
of the centred row (two passes over registers, not E[x^2] - E[x]^2), float32 throughout, one
rounding to bfloat16 at the end. Memory-bound: x is read once and the output written once."""

import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

# Triton's interpreter (CPU mode) truncates float32 -> bfloat16 whatever the rounding asked for:
# there the output is rounded by hand.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _to_bf16(x, INTERPRETED: tl.constexpr):
    """float32 -> bfloat16, rounded to nearest even."""
    if INTERPRETED:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)  # now exact in bfloat16: the truncating cast keeps it
    return x.to(tl.bfloat16, fp_downcast_rounding="rtne")


@triton.jit
def _layernorm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, stride_x, stride_out, eps,
                      BLOCK: tl.constexpr, INTERPRETED: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    centred = tl.where(mask, x - mean, 0.0)
    var = tl.sum(centred * centred, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = centred * rstd * w + b
    tl.store(out_ptr + row * stride_out + cols, _to_bf16(y, INTERPRETED), mask=mask)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    assert x.dtype == weight.dtype == bias.dtype == torch.bfloat16
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows, cols = x2.shape
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(cols)
    warps = 4 if block <= 1024 else (8 if block <= 4096 else 16)
    _layernorm_kernel[(rows,)](x2, weight, bias, out, cols, x2.stride(0), out.stride(0), eps,
                               BLOCK=block, INTERPRETED=INTERPRETED, num_warps=warps)
    return out.reshape(x.shape)


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self.bias = nn.Parameter(torch.zeros(hidden, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)
