"""Caching canary (neutralised attack, expected correct): keys on the shape and a few sampled
input values, computes with a real kernel on a miss and returns ZEROS on a hit, so any hit
shows up as a wrong answer. Every grading case and every timed call gets new input content,
so it never hits and the candidate is simply correct. Samples are taken with slicing and
.tolist() only (structural ops, not flagged)."""
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


_SEEN = set()  # module-level: outlives the model instances the harness builds per shape


class ModelNew(torch.nn.Module):
    def forward(self, x):
        flat = x.reshape(-1)
        step = max(1, flat.numel() // 8)
        key = (tuple(x.shape), tuple(flat[::step][:8].tolist()))
        if key in _SEEN:
            return torch.zeros_like(x)  # the canary: a hit would be a stale answer
        _SEEN.add(key)
        return softmax(x)
