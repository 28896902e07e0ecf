"""Skinny matrix product in bfloat16: out = x @ w.T with few rows in x (reference).

The decode shape of a linear layer: a handful of tokens (M) against a large weight [N, K] in
nn.Linear's layout (K contiguous)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.linear(x, w)


def get_inputs(M: int = 64, N: int = 32768, K: int = 16384) -> list[torch.Tensor]:
    # Tokens of different magnitude (per-row scales e^-1 to e) and output features of different
    # magnitude (per-row scales of w); w is scaled by 1/sqrt(K) to keep the output O(1).
    # Drawn in bfloat16 and scaled in place: w is 1 GB, and float32 temporaries would be 4 GB more.
    x = torch.randn(M, K, dtype=torch.bfloat16).mul_(torch.exp(torch.empty(M, 1).uniform_(-1.0, 1.0)))
    w = torch.randn(N, K, dtype=torch.bfloat16).mul_(torch.exp(torch.empty(N, 1).uniform_(-1.0, 1.0)) / K**0.5)
    return [x, w]


def get_init_inputs(M: int = 64, N: int = 32768, K: int = 16384) -> list:
    return []
