"""Correct, but calls torch's softmax instead of writing a kernel (forbidden op)."""
import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
