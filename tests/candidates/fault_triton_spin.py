"""Fault (GPU): a Triton kernel that spins forever, waiting for a flag in device memory that
nothing ever sets. The call never returns; the harness kills the worker (and with it its
CUDA context) at the timeout, and the GPU is usable for the next evaluation."""
import torch
import triton
import triton.language as tl


@triton.jit
def _spin(flag_ptr, out_ptr, n, BLOCK: tl.constexpr):
    flag = tl.load(flag_ptr, volatile=True)
    while flag == 0:
        flag = tl.load(flag_ptr, volatile=True)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros([BLOCK], tl.float32) + flag, mask=offs < n)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        flag = torch.zeros(1, dtype=torch.int32, device=x.device)
        out = torch.empty_like(x)
        _spin[(triton.cdiv(out.numel(), 1024),)](flag, out, out.numel(), BLOCK=1024)
        return out
