"""A correct candidate for the imported KernelBench fixture level2/3_Affine_LeakyReLU.py:
leaky_relu(x * weight + bias) with weight and bias per feature (the last dimension)."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _affine_leaky_relu_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n, features, slope, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    col = offs % features
    x = tl.load(x_ptr + offs, mask=mask)
    y = x * tl.load(w_ptr + col, mask=mask) + tl.load(b_ptr + col, mask=mask)
    tl.store(out_ptr + offs, tl.where(y >= 0, y, y * slope), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features: int, negative_slope: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(features))
        self.bias = nn.Parameter(torch.empty(features))
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        n, block = x.numel(), 1024
        _affine_leaky_relu_kernel[(triton.cdiv(n, block),)](x, self.weight, self.bias, out, n, x.shape[-1],
                                                           self.negative_slope, BLOCK=block)
        return out
