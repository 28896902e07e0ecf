"""GELU (the exact, erf form) of a large bfloat16 tensor (reference)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)  # 0.5 * x * (1 + erf(x / sqrt(2))), in float32, rounded to bfloat16


def get_inputs(rows: int = 16384, cols: int = 16384) -> list[torch.Tensor]:
    # Rows of very different scale (e^-2 to e^2): some stay near the origin, where GELU bends,
    # others reach far into both tails (GELU ~ x on the right, ~ 0 on the left). Drawn in
    # bfloat16 and scaled in place (the input is 0.5 GB).
    scale = torch.exp(torch.empty(rows, 1).uniform_(-2.0, 2.0))
    return [torch.randn(rows, cols, dtype=torch.bfloat16).mul_(scale)]


def get_init_inputs(rows: int = 16384, cols: int = 16384) -> list:
    return []
