"""Measurement (hiding ops): pops the harness's op-recording dispatch mode off the stack
inside forward and calls torch.softmax unobserved, without putting the mode back. The
recorder notices it is gone: dispatch_mode_removed."""
import torch
from torch.utils import _python_dispatch as dispatch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        while dispatch._get_current_dispatch_mode_stack():
            dispatch._pop_mode()
        return torch.softmax(x, dim=-1)
