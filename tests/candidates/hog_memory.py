"""Allocates host memory at import, 64 MiB at a time (every page touched), up to 3 GiB."""
import torch

HOARD = [b"\1" * (64 << 20) for _ in range(48)]


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x
