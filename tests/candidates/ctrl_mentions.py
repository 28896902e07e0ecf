"""Honest control (header before the known-good softmax): a comment and a string that name
torch.compile, torch.softmax and torch._inductor without using them. Must not be flagged."""
# Not using torch.compile or torch.softmax(x, dim=-1) here: the kernel below is hand-written.
NOTES = "torch.softmax would be aten::_softmax; torch.compile would import torch._inductor; numba, cupy: unused"
