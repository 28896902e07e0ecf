"""A Triton kernel that writes zeros: every output of a 16384-wide softmax is ~6e-5, so this
passes a plain atol=1e-4 check; the harness must reject it."""
import torch
import triton
import triton.language as tl


@triton.jit
def _zeros(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros([BLOCK], tl.float32), mask=offs < n)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        n = out.numel()
        _zeros[(triton.cdiv(n, 1024),)](out, n, BLOCK=1024)
        return out
