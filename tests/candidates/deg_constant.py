"""Degenerate: a Triton kernel that writes 1/cols everywhere (the softmax of a constant row).
Every value is near the right magnitude; the relative-L2 bar rejects it."""
import torch
import triton
import triton.language as tl


@triton.jit
def _fill(out_ptr, n, value, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros([BLOCK], tl.float32) + value, mask=offs < n)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        _fill[(triton.cdiv(out.numel(), 1024),)](out, out.numel(), 1.0 / x.shape[-1], BLOCK=1024)
        return out
