"""Matrix-vector product in bfloat16: y = a @ x (reference)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return a @ x


def get_inputs(M: int = 32768, K: int = 16384) -> list[torch.Tensor]:
    # Rows of a of different magnitude (e^-2 to e^2), and a vector with a few large entries
    # (one in 64 multiplied by 8), so no single scale fits every output. Drawn in bfloat16 and
    # scaled in place: a is 1 GB, and float32 temporaries would be 4 GB more.
    a = torch.randn(M, K, dtype=torch.bfloat16).mul_(torch.exp(torch.empty(M, 1).uniform_(-2.0, 2.0)))
    x = torch.randn(K) / K**0.5
    x = torch.where(torch.rand(K) < 1 / 64, 8 * x, x)
    return [a, x.to(torch.bfloat16)]


def get_init_inputs(M: int = 32768, K: int = 16384) -> list:
    return []
