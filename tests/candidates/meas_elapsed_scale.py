"""Tamper header (the known-good softmax is appended): wraps Event.elapsed_time to report a
tenth of the real time (plausible-looking, unlike a constant). Flagged as a patched timer."""
import torch

_real_elapsed = torch.cuda.Event.elapsed_time
torch.cuda.Event.elapsed_time = lambda self, end: _real_elapsed(self, end) / 10.0
