"""Measurement (hiding ops): torch's own _disable_current_modes() context manager suspends
the harness's op recorder around torch.softmax and restores it on exit. Must still be caught:
dispatch_mode_removed, or aten::_softmax seen some other way."""
import torch
from torch.utils._python_dispatch import _disable_current_modes


class ModelNew(torch.nn.Module):
    def forward(self, x):
        with _disable_current_modes():
            return torch.softmax(x, dim=-1)
