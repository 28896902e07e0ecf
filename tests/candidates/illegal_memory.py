"""A Triton kernel that writes far outside its output: an illegal memory access on a GPU."""
import torch
import triton
import triton.language as tl


@triton.jit
def _oob(out_ptr, offset, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK).to(tl.int64) + offset
    tl.store(out_ptr + offs, tl.zeros([BLOCK], tl.float32))


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        _oob[(1,)](out, 1 << 40, BLOCK=128)
        return out
