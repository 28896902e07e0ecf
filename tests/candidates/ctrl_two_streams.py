"""Honest control (GPU): runs the real kernel on a second stream, joined both ways (the side
stream waits for the input, the caller's stream waits for the result, the tensors are
recorded on the side stream). Must not be flagged as unjoined work."""
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
    def __init__(self):
        super().__init__()
        self.side = None

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        if self.side is None:
            self.side = torch.cuda.Stream()
        caller = torch.cuda.current_stream()
        self.side.wait_stream(caller)
        with torch.cuda.stream(self.side):
            block = triton.next_power_of_2(x.shape[1])
            _softmax_rows[(x.shape[0],)](x, out, x.shape[1], BLOCK=block, num_warps=4 if block <= 2048 else 16)
        x.record_stream(self.side)
        out.record_stream(self.side)
        caller.wait_stream(self.side)
        return out
