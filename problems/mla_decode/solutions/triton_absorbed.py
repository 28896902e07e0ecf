"""MLA decode in Triton with the up-projection absorbed: the latent cache is read once, for all
heads, and no per-head key or value is ever formed.

Kernel 1: q_latent[b, h] = q_nope[b, h] W_uk[h] (per head, a [batch, nope] x [nope, kv_lora]
product). Kernel 2: one program per (sequence, split of SPLIT tokens) walks its tokens BLOCK_N
at a time; scores for every head at once are q_latent . c_kv + q_pe . k_pe, with an online
softmax (float32) and the weighted sum of c_kv kept per head [heads, kv_lora]. Kernel 3: per
(head, block of sequences), the splits merged into out_latent and out = out_latent W_uv[h]^T.
"""

import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# Triton's CPU interpreter computes bfloat16 tl.dot wrongly; it gets float32 operands there.
DOT_FP32 = INTERPRETED
# Tokens per program of kernel 2 and per step of its loop; small under the interpreter (tiny CPU
# shapes), so that several splits and steps are exercised there.
SPLIT, BLOCK_N = (32, 16) if INTERPRETED else (256, 32)
BLOCK_B = 16  # sequences per program of kernels 1 and 3 (a product's smallest M)


@triton.jit
def _absorb_kernel(qn_ptr, w_ptr, ql_ptr, batch,
                   HEADS: tl.constexpr, NOPE: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
                   BB: tl.constexpr, BL: tl.constexpr, DOT_FP32: tl.constexpr):
    h = tl.program_id(0)
    bb = tl.program_id(1) * BB + tl.arange(0, BB)
    lat = tl.program_id(2) * BL + tl.arange(0, BL)
    d = tl.arange(0, NOPE)
    ok = bb < batch
    qn = tl.load(qn_ptr + (bb * HEADS + h)[:, None] * NOPE + d[None, :], mask=ok[:, None], other=0.0)
    w_uk = tl.load(w_ptr + (h * (NOPE + V) + d)[:, None] * L + lat[None, :])  # [NOPE, BL]
    if DOT_FP32:
        qn = qn.to(tl.float32)
        w_uk = w_uk.to(tl.float32)
    ql = tl.dot(qn, w_uk)
    tl.store(ql_ptr + (bb * HEADS + h)[:, None] * L + lat[None, :], ql.to(ql_ptr.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _split_kernel(ql_ptr, qpe_ptr, cache_ptr, cu_ptr, acc_ptr, ml_ptr, n_splits, qk_scale,
                  HEADS: tl.constexpr, L: tl.constexpr, R: tl.constexpr, BH: tl.constexpr,
                  BLOCK_N: tl.constexpr, SPLIT_TOKENS: tl.constexpr, DOT_FP32: tl.constexpr):
    b = tl.program_id(0)
    split = tl.program_id(1)
    first = tl.load(cu_ptr + b)
    seq_len = tl.load(cu_ptr + b + 1) - first
    lo = split * SPLIT_TOKENS
    hi = tl.minimum(lo + SPLIT_TOKENS, seq_len)  # lo >= hi: a split past this sequence's end
    h = tl.arange(0, BH)
    h_ok = h < HEADS
    lat = tl.arange(0, L)
    rope = tl.arange(0, R)
    ql = tl.load(ql_ptr + (b * HEADS + h)[:, None] * L + lat[None, :], mask=h_ok[:, None], other=0.0)
    qp = tl.load(qpe_ptr + (b * HEADS + h)[:, None] * R + rope[None, :], mask=h_ok[:, None], other=0.0)
    if DOT_FP32:
        ql = ql.to(tl.float32)
        qp = qp.to(tl.float32)
    m_i = tl.full([BH], float("-inf"), tl.float32)
    l_i = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, L], tl.float32)
    n = tl.arange(0, BLOCK_N)
    for t0 in range(lo, hi, BLOCK_N):
        tok = t0 + n
        ok = tok < hi
        row = cache_ptr + (first + tok).to(tl.int64)[:, None] * (L + R)
        c = tl.load(row + lat[None, :], mask=ok[:, None], other=0.0)  # [BLOCK_N, L]: the latents
        kp = tl.load(row + L + rope[None, :], mask=ok[:, None], other=0.0)  # [BLOCK_N, R]: rotary keys
        if DOT_FP32:
            c = c.to(tl.float32)
            kp = kp.to(tl.float32)
        s = (tl.dot(ql, tl.trans(c)) + tl.dot(qp, tl.trans(kp))) * qk_scale  # log2 units
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c)
        m_i = m_new
    part = (b * n_splits + split) * HEADS + h  # [batch, n_splits, heads] row
    keep = h_ok & (tl.full([BH], lo, tl.int32) < hi)  # splits past the end store nothing
    tl.store(acc_ptr + part[:, None] * L + lat[None, :], acc, mask=keep[:, None])
    tl.store(ml_ptr + part * 2, m_i, mask=keep)
    tl.store(ml_ptr + part * 2 + 1, l_i, mask=keep)


@triton.jit
def _merge_kernel(acc_ptr, ml_ptr, cu_ptr, w_ptr, out_ptr, batch, n_splits,
                  HEADS: tl.constexpr, NOPE: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
                  BB: tl.constexpr, BS: tl.constexpr, BL: tl.constexpr, SPLIT_TOKENS: tl.constexpr,
                  DOT_FP32: tl.constexpr):
    h = tl.program_id(0)
    bb = tl.program_id(1) * BB + tl.arange(0, BB)
    ok = bb < batch
    used = tl.cdiv(tl.load(cu_ptr + bb + 1, mask=ok, other=0) - tl.load(cu_ptr + bb, mask=ok, other=0), SPLIT_TOKENS)
    s = tl.arange(0, BS)
    live = ok[:, None] & (s[None, :] < used[:, None])  # [BB, BS]
    part = (bb[:, None] * n_splits + s[None, :]) * HEADS + h
    m = tl.load(ml_ptr + part * 2, mask=live, other=float("-inf"))
    lsum = tl.load(ml_ptr + part * 2 + 1, mask=live, other=0.0)
    m_all = tl.where(ok, tl.max(m, 1), 0.0)
    w = tl.where(live, tl.exp2(m - m_all[:, None]), 0.0)
    denom = tl.where(ok, tl.sum(lsum * w, 1), 1.0)
    v = tl.arange(0, V)
    out = tl.zeros([BB, V], tl.float32)
    for l0 in tl.static_range(0, L, BL):
        lat = l0 + tl.arange(0, BL)
        o = tl.zeros([BB, BL], tl.float32)
        for k in range(n_splits):
            w_k = tl.sum(tl.where(s[None, :] == k, w, 0.0), 1)
            row = (bb * n_splits + k) * HEADS + h
            a = tl.load(acc_ptr + row[:, None] * L + lat[None, :], mask=(ok & (k < used))[:, None], other=0.0)
            o += a * w_k[:, None]
        o = o / denom[:, None]  # this slice of out_latent
        w_uv = tl.load(w_ptr + (h * (NOPE + V) + NOPE + v)[None, :] * L + lat[:, None])  # [BL, V]
        if DOT_FP32:
            out += tl.dot(o, w_uv.to(tl.float32))
        else:
            out += tl.dot(o.to(tl.bfloat16), w_uv)
    tl.store(out_ptr + (bb * HEADS + h)[:, None] * V + v[None, :], out.to(out_ptr.dtype.element_ty), mask=ok[:, None])


def mla_decode(q_nope, q_pe, kv_cache, cu_seqlens, weight, kv_lora, max_len):
    batch, heads, nope = q_nope.shape
    rope = q_pe.shape[-1]
    v_dim = weight.shape[0] // heads - nope
    for dim in (nope, rope, v_dim, kv_lora):
        assert dim == triton.next_power_of_2(dim) and dim >= 16, "dimensions must be powers of two >= 16"
    q_nope, q_pe, kv_cache, weight = (x.contiguous() for x in (q_nope, q_pe, kv_cache, weight))
    dev = q_nope.device
    bl = min(kv_lora, 128)
    q_lat = torch.empty(batch, heads, kv_lora, dtype=torch.bfloat16, device=dev)
    _absorb_kernel[(heads, triton.cdiv(batch, BLOCK_B), kv_lora // bl)](
        q_nope, weight, q_lat, batch, HEADS=heads, NOPE=nope, V=v_dim, L=kv_lora, BB=BLOCK_B, BL=bl,
        DOT_FP32=DOT_FP32, num_warps=4)
    n_splits = triton.cdiv(max_len, SPLIT)
    acc = torch.empty(batch, n_splits, heads, kv_lora, dtype=torch.float32, device=dev)
    ml = torch.empty(batch, n_splits, heads, 2, dtype=torch.float32, device=dev)
    _split_kernel[(batch, n_splits)](
        q_lat, q_pe, kv_cache, cu_seqlens, acc, ml, n_splits, (nope + rope) ** -0.5 * LOG2E,
        HEADS=heads, L=kv_lora, R=rope, BH=max(16, triton.next_power_of_2(heads)), BLOCK_N=BLOCK_N,
        SPLIT_TOKENS=SPLIT, DOT_FP32=DOT_FP32, num_warps=8 if heads > 16 else 4, num_stages=2)
    out = torch.empty(batch, heads, v_dim, dtype=q_nope.dtype, device=dev)
    _merge_kernel[(heads, triton.cdiv(batch, BLOCK_B))](
        acc, ml, cu_seqlens, weight, out, batch, n_splits, HEADS=heads, NOPE=nope, V=v_dim, L=kv_lora,
        BB=BLOCK_B, BS=max(2, triton.next_power_of_2(n_splits)), BL=bl, SPLIT_TOKENS=SPLIT,
        DOT_FP32=DOT_FP32, num_warps=4)
    return out


class ModelNew(nn.Module):
    def __init__(self, heads: int, kv_lora: int, rope_dim: int, nope_dim: int, v_dim: int, max_len: int):
        super().__init__()
        self.kv_lora, self.max_len = kv_lora, max_len
        self.kv_b_proj = nn.Linear(kv_lora, heads * (nope_dim + v_dim), bias=False, dtype=torch.bfloat16)

    def forward(self, q_nope, q_pe, kv_cache, cu_seqlens):
        return mla_decode(q_nope, q_pe, kv_cache, cu_seqlens, self.kv_b_proj.weight, self.kv_lora, self.max_len)
