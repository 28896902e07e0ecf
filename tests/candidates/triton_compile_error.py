"""Parses and imports fine; its Triton kernel fails to compile on the first call."""
import torch
import triton
import triton.language as tl


@triton.jit
def _bad(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(out_ptr + offs, tl.no_such_function(x))


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        _bad[(1,)](x, out, BLOCK=16)
        return out
