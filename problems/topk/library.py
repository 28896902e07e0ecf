"""The library bar for topk: torch.topk itself (benchmarks/deck_table.py times it beside the eager
reference, which sorts whole rows to fix the order of ties). Same values; among equal values
torch.topk's index order is its own, so it is a timing bar, not a second reference."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.topk(x, self.k, dim=-1, largest=True, sorted=True)
