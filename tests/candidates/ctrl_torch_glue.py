"""Honest control: structural torch ops around a real kernel (reshape, contiguous, view,
empty_like, a 1-D view of the output). None computes anything: must not be flagged."""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_rows(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    num = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * n_cols + cols, num / tl.sum(num, axis=0), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        flat_out = torch.empty_like(x2).view(-1)
        block = triton.next_power_of_2(x2.shape[1])
        _softmax_rows[(x2.shape[0],)](x2, flat_out, x2.shape[1], BLOCK=block, num_warps=4 if block <= 2048 else 16)
        return flat_out.view(x2.shape).reshape(x.shape)
