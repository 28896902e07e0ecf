"""Honest control: a real softmax kernel written with allowed helper imports (math, functools,
typing) and a small launch-config helper class. Must be correct and unflagged."""
import functools
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl


class LaunchConfig(NamedTuple):
    block: int
    warps: int


@functools.lru_cache(maxsize=None)
def launch_config(n_cols: int) -> LaunchConfig:
    block = 1 << math.ceil(math.log2(n_cols))
    return LaunchConfig(block, 4 if block <= 2048 else 16)


@triton.jit
def _softmax_rows(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    num = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * n_cols + cols, num / tl.sum(num, axis=0), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        cfg = launch_config(x.shape[1])
        _softmax_rows[(x.shape[0],)](x, out, x.shape[1], BLOCK=cfg.block, num_warps=cfg.warps)
        return out
