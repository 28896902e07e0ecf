"""Tamper header (the known-good softmax kernel is appended by the tests): replaces the
timer and synchronize on import."""
import torch

torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.Event.elapsed_time = lambda self, end: 1e-6
