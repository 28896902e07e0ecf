"""A wrong answer for any imported KernelBench problem with one output shaped like its first input."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(args[0])) if args else None
        self.bias = nn.Parameter(torch.empty(args[0])) if args else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)
