"""Row sums in Triton: one program per row walks it in blocks, each lane keeping its own float32
partial sum (a blocked order: its error stays near one rounding however long the row), and one
tree reduction over the lanes at the end. Memory-bound: x is read once."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _row_sum_kernel(x_ptr, out_ptr, n_cols, stride_x, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    base = x_ptr + row * stride_x
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        acc += tl.load(base + start + cols, mask=start + cols < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def row_sum(x: torch.Tensor) -> torch.Tensor:
    assert x.dim() == 2 and x.dtype == torch.float32
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, cols = x.shape
    out = torch.empty(rows, dtype=torch.float32, device=x.device)
    block = min(4096, triton.next_power_of_2(cols))
    _row_sum_kernel[(rows,)](x, out, cols, x.stride(0), BLOCK=block, num_warps=8 if block >= 2048 else 4)
    return out


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return row_sum(x)
