"""Degenerate: a Triton kernel that fills the output with NaN (a comparison written as
`not (|a-b| > tol)` would pass it; the checker rejects non-finite values)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _nan(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.full([BLOCK], float("nan"), tl.float32), mask=offs < n)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        _nan[(triton.cdiv(out.numel(), 1024),)](out, out.numel(), BLOCK=1024)
        return out
