"""Row-wise cumulative sum in Triton: one program per row walks it in blocks of 4096; each block is
scanned in registers (tl.cumsum, a tree) and offset by the running total of the blocks before it,
carried in float32. Few carried additions (cols / 4096), so the rounding error stays far below
the row-sequential order's. Memory-bound: x is read once and the output written once."""

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _row_cumsum_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    total = tl.zeros((), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=0.0)
        tl.store(out_row + start + cols, tl.cumsum(x, axis=0) + total, mask=mask)
        total += tl.sum(x, axis=0)


def row_cumsum(x: torch.Tensor) -> torch.Tensor:
    assert x.dim() == 2 and x.dtype == torch.float32
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, cols = x.shape
    out = torch.empty((rows, cols), dtype=torch.float32, device=x.device)
    block = min(BLOCK, triton.next_power_of_2(cols))
    _row_cumsum_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=block, num_warps=8 if block >= 2048 else 4)
    return out


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return row_cumsum(x)
