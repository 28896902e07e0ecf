"""Rotary embedding of q and k in one Triton kernel: each program takes a few tokens, reads their
positions and cos/sin rows once, then rotates every q head and every k head of those tokens
([tokens, heads, D/2] tiles of each half), in float32, rounded to bfloat16 once."""

import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

# Triton's interpreter (CPU mode) truncates float32 -> bfloat16 casts; there we round by hand.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _round_bf16(x, INTERPRET: tl.constexpr):
    """float32 -> bfloat16, round to nearest even."""
    if INTERPRET:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(tl.bfloat16)


@triton.jit
def _rotate_heads(src, dst, mask, cos, sin, HALF: tl.constexpr, INTERPRET: tl.constexpr):
    """dst = rotate(src): [tokens, heads, HALF] pointer blocks to the first half of each head."""
    a = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst, _round_bf16(a * cos - b * sin, INTERPRET), mask=mask)
    tl.store(dst + HALF, _round_bf16(b * cos + a * sin, INTERPRET), mask=mask)


@triton.jit
def _rope_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cos_ptr, sin_ptr, n_tokens, S, Hq, Hk,
                 sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sqo_b, sqo_s, sqo_h, sko_b, sko_s, sko_h, sp_b, sp_s, s_tab,
                 HALF: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
                 INTERPRET: tl.constexpr):
    """BLOCK_T tokens per program: [BLOCK_T, heads, HALF] tiles of q and k."""
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = tokens < n_tokens
    b = (tokens // S).to(tl.int64)[:, None, None]
    s = (tokens % S).to(tl.int64)[:, None, None]
    cols = tl.arange(0, HALF)[None, None, :]
    pos = tl.load(pos_ptr + b * sp_b + s * sp_s, mask=t_ok[:, None, None], other=0)
    cos = tl.load(cos_ptr + pos * s_tab + cols)
    sin = tl.load(sin_ptr + pos * s_tab + cols)
    hq = tl.arange(0, BLOCK_HQ)[None, :, None]
    q_mask = t_ok[:, None, None] & (hq < Hq)
    _rotate_heads(q_ptr + b * sq_b + s * sq_s + hq * sq_h + cols, qo_ptr + b * sqo_b + s * sqo_s + hq * sqo_h + cols,
                  q_mask, cos, sin, HALF, INTERPRET)
    hk = tl.arange(0, BLOCK_HK)[None, :, None]
    k_mask = t_ok[:, None, None] & (hk < Hk)
    _rotate_heads(k_ptr + b * sk_b + s * sk_s + hk * sk_h + cols, ko_ptr + b * sko_b + s * sko_s + hk * sko_h + cols,
                  k_mask, cos, sin, HALF, INTERPRET)


def rope_qk(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    B, S, Hq, D = q.shape
    Hk = k.shape[2]
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    qo = torch.empty((B, S, Hq, D), dtype=q.dtype, device=q.device)
    ko = torch.empty((B, S, Hk, D), dtype=k.dtype, device=k.device)
    # A few tokens per program on a GPU; more under the interpreter, whose cost is per program.
    block_t = 2 if q.is_cuda else 16
    _rope_kernel[(triton.cdiv(B * S, block_t),)](
        q, k, qo, ko, positions, cos, sin, B * S, S, Hq, Hk,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
        positions.stride(0), positions.stride(1), cos.stride(0),
        HALF=D // 2, BLOCK_T=block_t, BLOCK_HQ=triton.next_power_of_2(Hq), BLOCK_HK=triton.next_power_of_2(Hk),
        INTERPRET=INTERPRET, num_warps=4)
    return qo, ko


class ModelNew(nn.Module):
    def __init__(self, D: int, P: int, theta: float = 500000.0):
        super().__init__()
        self.register_buffer("cos", torch.empty(P, D // 2))
        self.register_buffer("sin", torch.empty(P, D // 2))

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        return rope_qk(q, k, positions, self.cos, self.sin)
