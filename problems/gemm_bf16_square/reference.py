"""Square matrix product in bfloat16: c = a @ b (reference)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


def get_inputs(N: int = 8192) -> list[torch.Tensor]:
    # Rows of a and columns of b each get their own scale (e^-1 to e), so the output's
    # magnitude varies across the matrix; b is scaled by 1/sqrt(N) to keep the output O(1).
    row_scale = torch.exp(torch.empty(N, 1).uniform_(-1.0, 1.0))
    col_scale = torch.exp(torch.empty(1, N).uniform_(-1.0, 1.0)) / N**0.5
    a = torch.randn(N, N, dtype=torch.bfloat16).mul_(row_scale)
    b = torch.randn(N, N, dtype=torch.bfloat16).mul_(col_scale)
    return [a, b]


def get_init_inputs(N: int = 8192) -> list:
    return []
