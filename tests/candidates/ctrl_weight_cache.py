"""Honest control (rmsnorm): caches a float32 copy of its weight, refreshed when the weight's
pointer or version changes (caching parameters is legitimate; caching answers is not), and
normalises with a real Triton kernel. Must be correct and unflagged."""
import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(out_ptr + row * n_cols + cols, (x * rstd * w).to(tl.bfloat16, fp_downcast_rounding="rtne"), mask=mask)


class ModelNew(torch.nn.Module):
    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self._w32 = None

    def weight_f32(self):
        key = (self.weight.data_ptr(), self.weight._version)
        if self._w32 is None or self._w32[0] != key:
            self._w32 = (key, self.weight.detach().to(torch.float32))
        return self._w32[1]

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(x2)
        block = triton.next_power_of_2(x2.shape[1])
        _rmsnorm[(x2.shape[0],)](x2, self.weight_f32(), out, x2.shape[1], self.eps, BLOCK=block,
                                 num_warps=4 if block <= 1024 else (8 if block <= 4096 else 16))
        return out.reshape(x.shape)
