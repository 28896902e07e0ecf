"""Row softmax of a float32 matrix (reference)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs(rows: int = 4096, cols: int = 16384) -> list[torch.Tensor]:
    # Logits of mixed scale: a per-row temperature between 0.5 and 8 keeps some rows
    # sharply peaked and others nearly flat.
    scale = torch.empty(rows, 1).uniform_(0.5, 8.0)
    return [torch.randn(rows, cols) * scale]


def get_init_inputs(rows: int = 4096, cols: int = 16384) -> list:
    return []
