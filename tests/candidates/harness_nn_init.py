"""Tamper header (the known-good softmax is appended): replaces torch.nn.init functions (which
build reference weights in this process) with ones that write zeros, so weights a harness
draws here would no longer match the reference's. nn.init functions are integrity targets:
patched:torch.nn.init.<fn>."""
import torch


def _zeros(tensor, *args, **kwargs):
    with torch.no_grad():
        return tensor.zero_()


torch.nn.init.kaiming_uniform_ = _zeros
torch.nn.init.normal_ = _zeros
torch.nn.init.uniform_ = _zeros
