"""Fitting the tolerance: rounds the input and the result to bfloat16 inside the kernel (half
the bytes a real kernel would move); about 3 significant digits, far outside softmax's
float32 tolerance (rtol 1e-4): mismatch."""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_bf16(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    x = x.to(tl.bfloat16).to(tl.float32)
    num = tl.exp(x - tl.max(x, axis=0))
    out = (num / tl.sum(num, axis=0)).to(tl.bfloat16).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, out, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        block = triton.next_power_of_2(x.shape[1])
        _softmax_bf16[(x.shape[0],)](x, out, x.shape[1], BLOCK=block, num_warps=4 if block <= 2048 else 16)
        return out
