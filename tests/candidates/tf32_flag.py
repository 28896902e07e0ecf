"""Tamper header (the known-good softmax kernel is appended by the tests): flips global
precision flags on import."""
import torch

torch.backends.cuda.matmul.allow_tf32 = not torch.backends.cuda.matmul.allow_tf32
torch.set_float32_matmul_precision("medium")
