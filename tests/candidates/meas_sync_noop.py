"""Tamper header (the known-good softmax is appended): turns torch.cuda.synchronize into a
no-op, so a harness timing with synchronize + a wall clock would stop the clock before the
GPU finished. The harness times with functions bound before import; the swap is flagged."""
import torch

torch.cuda.synchronize = lambda device=None: None
