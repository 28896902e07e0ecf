"""Measurement (GPU): does the real work on a side CUDA stream and returns without making the
caller's stream wait for it, so events recorded on the caller's stream time almost nothing.
The output is right once the device is synchronised; the harness flags unjoined_stream."""
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


def softmax(x):
    x = x.contiguous()
    out = torch.empty_like(x)
    block = triton.next_power_of_2(x.shape[1])
    _softmax_rows[(x.shape[0],)](x, out, x.shape[1], BLOCK=block, num_warps=4 if block <= 2048 else 16)
    return out

_side = {}


class ModelNew(torch.nn.Module):
    def forward(self, x):
        stream = _side.setdefault("stream", torch.cuda.Stream())
        stream.wait_stream(torch.cuda.current_stream())  # the input is ready; nothing joins back
        with torch.cuda.stream(stream):
            out = softmax(x)
        x.record_stream(stream)
        out.record_stream(stream)
        return out
