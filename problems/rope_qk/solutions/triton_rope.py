"""Rotary embedding of q and k in one Triton kernel: one program per token reads the token's
position and its cos/sin rows once, then rotates every q head and every k head of that token
([heads, D/2] tiles of each half), in float32, rounded to bfloat16 once."""

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
def _rotate_heads(src_ptr, dst_ptr, n_heads, stride_sh, stride_dh, cos, sin,
                  HALF: tl.constexpr, BLOCK_H: tl.constexpr, INTERPRET: tl.constexpr):
    """dst = rotate(src) for one token's [n_heads, 2 * HALF] slice (channels contiguous)."""
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, HALF)[None, :]
    mask = heads < n_heads
    src = src_ptr + heads * stride_sh + cols
    a = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = dst_ptr + heads * stride_dh + cols
    tl.store(dst, _round_bf16(a * cos - b * sin, INTERPRET), mask=mask)
    tl.store(dst + HALF, _round_bf16(b * cos + a * sin, INTERPRET), mask=mask)


@triton.jit
def _rope_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cos_ptr, sin_ptr, S, Hq, Hk,
                 sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sqo_b, sqo_s, sqo_h, sko_b, sko_s, sko_h, sp_b, sp_s, s_tab,
                 HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, INTERPRET: tl.constexpr):
    token = tl.program_id(0)
    b = (token // S).to(tl.int64)
    s = (token % S).to(tl.int64)
    pos = tl.load(pos_ptr + b * sp_b + s * sp_s)
    cols = tl.arange(0, HALF)[None, :]
    cos = tl.load(cos_ptr + pos * s_tab + cols)
    sin = tl.load(sin_ptr + pos * s_tab + cols)
    _rotate_heads(q_ptr + b * sq_b + s * sq_s, qo_ptr + b * sqo_b + s * sqo_s, Hq, sq_h, sqo_h, cos, sin,
                  HALF, BLOCK_HQ, INTERPRET)
    _rotate_heads(k_ptr + b * sk_b + s * sk_s, ko_ptr + b * sko_b + s * sko_s, Hk, sk_h, sko_h, cos, sin,
                  HALF, BLOCK_HK, INTERPRET)


def rope_qk(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    B, S, Hq, D = q.shape
    Hk = k.shape[2]
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    qo, ko = torch.empty((B, S, Hq, D), dtype=q.dtype, device=q.device), torch.empty((B, S, Hk, D), dtype=k.dtype, device=k.device)
    _rope_kernel[(B * S,)](
        q, k, qo, ko, positions, cos, sin, S, Hq, Hk,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
        positions.stride(0), positions.stride(1), cos.stride(0),
        HALF=D // 2, BLOCK_HQ=triton.next_power_of_2(Hq), BLOCK_HK=triton.next_power_of_2(Hk), INTERPRET=INTERPRET,
        num_warps=4)
    return qo, ko


class ModelNew(nn.Module):
    def __init__(self, D: int, P: int, theta: float = 500000.0):
        super().__init__()
        self.register_buffer("cos", torch.empty(P, D // 2))
        self.register_buffer("sin", torch.empty(P, D // 2))

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        return rope_qk(q, k, positions, self.cos, self.sin)
