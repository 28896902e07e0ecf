"""Measurement (GPU): forward returns an empty output and a thread launches the real kernel
just after the call has returned, outside the harness's timed window. The thread is alive
when the call returns (background_thread; the profiler also sees work after return)."""
import threading
import time

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


def _launch_after(returned, x, out):
    returned.wait()
    time.sleep(0.0005)
    block = triton.next_power_of_2(x.shape[1])
    _softmax_rows[(x.shape[0],)](x, out, x.shape[1], BLOCK=block, num_warps=4 if block <= 2048 else 16)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        returned = threading.Event()
        threading.Thread(target=_launch_after, args=(returned, x, out), daemon=True).start()
        returned.set()
        return out
