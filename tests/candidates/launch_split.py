"""Launch cap (GPU, run with max_launches: 1): splits the rows between two kernel launches
(e.g. to time only one, or to sneak a second pass past a one-kernel rule). The profiler counts
two kernels per call: too_many_launches."""
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
        x = x.contiguous()
        out = torch.empty_like(x)
        rows, cols = x.shape
        block = triton.next_power_of_2(cols)
        half = rows // 2
        for lo, hi in ((0, half), (half, rows)):
            _softmax_rows[(hi - lo,)](x[lo:], out[lo:], cols, BLOCK=block, num_warps=4 if block <= 2048 else 16)
        return out
