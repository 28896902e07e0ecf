"""Measurement (hiding ops): pops every dispatch mode (the harness's op recorder among them),
runs torch.softmax unobserved, then pushes the modes back so the stack looks untouched on
exit. Must still be caught: dispatch_mode_removed, or aten::_softmax seen some other way."""
import torch
from torch.utils import _python_dispatch as dispatch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        popped = []
        while dispatch._get_current_dispatch_mode_stack():
            popped.append(dispatch._pop_mode())
        try:
            return torch.softmax(x, dim=-1)
        finally:
            for mode in reversed(popped):
                dispatch._push_mode(mode)
