"""Tamper header (the known-good softmax is appended): makes float64 torch's default dtype at
import, which changes what every later torch.randn/empty in the process produces (the inputs
this worker draws, a harness's own buffers). Flagged: torch_flag:default_dtype."""
import torch

torch.set_default_dtype(torch.float64)
