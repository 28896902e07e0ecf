"""Fault: raises KeyboardInterrupt inside forward (a BaseException that `except Exception`
misses), trying to take the worker's request loop down uncleanly. The worker dies: crash."""
import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        raise KeyboardInterrupt
