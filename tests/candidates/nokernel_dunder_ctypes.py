"""Not writing a kernel: reaches ctypes inside forward through __import__ with a computed
name (e.g. to call a prebuilt library), falling back to a real kernel. Refused and flagged
as forbidden_import:ctypes."""
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
        try:
            __import__("ct" + "ypes")
        except ImportError:
            pass
        x = x.contiguous()
        out = torch.empty_like(x)
        block = triton.next_power_of_2(x.shape[1])
        _softmax_rows[(x.shape[0],)](x, out, x.shape[1], BLOCK=block, num_warps=4 if block <= 2048 else 16)
        return out
