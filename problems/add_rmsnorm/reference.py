"""Residual add fused with RMSNorm, bfloat16 (reference).

    residual_out = x + residual                      (rounded to bfloat16: the new residual stream)
    normed = residual_out / sqrt(mean(residual_out^2) + 1e-6) * weight   (float32 math, bfloat16 out)

Returns (normed, residual_out): the input of the next sublayer and the stream it adds back to."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        # Not ones: a kernel that ignores the weight must fail.
        self.weight = nn.Parameter(torch.empty(hidden).normal_(1.0, 0.25).to(torch.bfloat16))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        acc = torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for the oracle
        h = x + residual
        hf = h.to(acc)
        rstd = torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (hf * rstd * self.weight.to(acc)).to(x.dtype), h


def get_inputs(T: int = 16384, H: int = 8192) -> list[torch.Tensor]:
    # Rows of very different magnitude in both terms (0.05x to 20x), so the sum's RMS is the
    # row's own and neither term can be dropped.
    sx = torch.exp(torch.empty(T, 1).uniform_(-3.0, 3.0))
    sr = torch.exp(torch.empty(T, 1).uniform_(-3.0, 3.0))
    return [(torch.randn(T, H) * sx).to(torch.bfloat16), (torch.randn(T, H) * sr).to(torch.bfloat16)]


def get_init_inputs(T: int = 16384, H: int = 8192) -> list:
    return [H]
