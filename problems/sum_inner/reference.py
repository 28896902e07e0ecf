"""Sum over the innermost (contiguous) dimension of a float32 matrix (reference)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=-1)


def get_inputs(rows: int = 65536, cols: int = 4096) -> list[torch.Tensor]:
    # Each row: its own mean (-1 to 1) plus noise of its own spread (e^-1 to e). Rows whose mean is
    # near zero sum to about sqrt(cols) times their spread, the others to about cols times their mean.
    mean = torch.empty(rows, 1).uniform_(-1.0, 1.0)
    spread = torch.exp(torch.empty(rows, 1).uniform_(-1.0, 1.0))
    return [torch.randn(rows, cols).mul_(spread).add_(mean)]


def get_init_inputs(rows: int = 65536, cols: int = 4096) -> list:
    return []
