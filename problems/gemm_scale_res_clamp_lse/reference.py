"""logsumexp(clamp((x @ W^T + b) * scale + residual, lo, hi)) over each row (reference).

bfloat16 GEMM, scale, residual add and clamp, as an eager model runs them (each result rounded
to bfloat16); the logsumexp is taken in float32 and returned in float32, one value per row."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, K: int, N: int, scale: float = 0.5, lo: float = -4.0, hi: float = 4.0):
        super().__init__()
        self.scale, self.lo, self.hi = scale, lo, hi
        self.weight = nn.Parameter((torch.randn(N, K) / K**0.5).to(torch.bfloat16))
        self.bias = nn.Parameter((torch.randn(N) * 0.5).to(torch.bfloat16))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        acc = torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for the oracle
        y = F.linear(x, self.weight, self.bias)
        y = y * self.scale + residual
        y = y.clamp(self.lo, self.hi)
        return torch.logsumexp(y.to(acc), dim=-1)


def get_inputs(M: int = 8192, K: int = 4096, N: int = 8192) -> list[torch.Tensor]:
    # Rows of very different magnitude (x from 0.1x to 10x): some rows stay inside the clamp,
    # others saturate it, so each row's logsumexp is its own.
    scale = torch.exp(torch.empty(M, 1).uniform_(-2.3, 2.3))
    x = (torch.randn(M, K) * scale).to(torch.bfloat16)
    residual = torch.randn(M, N).to(torch.bfloat16)
    return [x, residual]


def get_init_inputs(M: int = 8192, K: int = 4096, N: int = 8192) -> list:
    return [K, N]
