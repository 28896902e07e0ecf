"""Paged-attention decode in Triton, split over the sequence (flash-decoding).

Kernel 1: one program per (sequence, kv head, split of SPLIT tokens). It loads the group of
query heads that share the kv head, walks its split BLOCK_N tokens at a time (the page of each
token through the block table, so the tokens' rows are a gather), and keeps an online softmax:
running max, running sum and the weighted value sum, all in float32. Every key and value is
read once for the whole query group. Kernel 2: one program per (sequence, kv head) merges the
splits' partial results of its query heads.
"""

import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

PAGE = 16
LOG2E = 1.4426950408889634
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# Triton's CPU interpreter computes bfloat16 tl.dot wrongly; it gets float32 operands there.
DOT_FP32 = INTERPRETED
# Tokens per program of kernel 1, and per step of its loop. Under the interpreter (tiny CPU
# shapes) they are small, so that several splits and several steps per split are exercised.
SPLIT, BLOCK_N = (64, 32) if INTERPRETED else (512, 64)


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, acc_ptr, ml_ptr,
                  stride_qb, stride_qh, stride_page, stride_slot, stride_head, stride_tb, n_splits, qk_scale,
                  KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_TOKENS: tl.constexpr,
                  PAGE_SIZE: tl.constexpr, DOT_FP32: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // KV_HEADS
    kvh = pid % KV_HEADS
    seq_len = tl.load(lens_ptr + b)
    start = split * SPLIT_TOKENS
    end = tl.minimum(start + SPLIT_TOKENS, seq_len)  # start >= end: a split past this sequence's end

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HEAD_DIM)
    heads = kvh * GROUP + g
    g_ok = g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=g_ok[:, None], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    n = tl.arange(0, BLOCK_N)
    table = table_ptr + b * stride_tb
    k_head = k_ptr + kvh * stride_head
    v_head = v_ptr + kvh * stride_head
    for tok0 in range(start, end, BLOCK_N):
        tok = tok0 + n
        tok_ok = tok < end
        page = tl.load(table + tok // PAGE_SIZE, mask=tok_ok, other=0).to(tl.int64)
        row = page * stride_page + (tok % PAGE_SIZE) * stride_slot  # each token's row: a gather
        k = tl.load(k_head + row[:, None] + d[None, :], mask=tok_ok[:, None], other=0.0)
        v = tl.load(v_head + row[:, None] + d[None, :], mask=tok_ok[:, None], other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_G, BLOCK_N]; the scale holds log2(e): exp2 is exp
        s = tl.where(tok_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    # Splits past the sequence's end store nothing: the merge reads only the ones in use.
    part = (b * KV_HEADS * GROUP + heads) * n_splits + split  # [batch, q_heads, n_splits] row
    keep = g_ok & (tl.full([BLOCK_G], start, tl.int32) < end)  # (a vector: the interpreter wants one)
    tl.store(acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=keep[:, None])
    tl.store(ml_ptr + part * 2, m_i, mask=keep)
    tl.store(ml_ptr + part * 2 + 1, l_i, mask=keep)


@triton.jit
def _merge_kernel(acc_ptr, ml_ptr, lens_ptr, out_ptr, stride_ob, stride_oh, n_splits,
                  KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, SPLIT_TOKENS: tl.constexpr):
    pid = tl.program_id(0)  # one (sequence, kv head): its group of query heads
    b = pid // KV_HEADS
    heads = (pid % KV_HEADS) * GROUP + tl.arange(0, BLOCK_G)
    g_ok = tl.arange(0, BLOCK_G) < GROUP
    used = tl.cdiv(tl.load(lens_ptr + b), SPLIT_TOKENS)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, HEAD_DIM)
    ok = g_ok[:, None] & (s[None, :] < used)  # [BLOCK_G, BLOCK_S]
    row = (b * KV_HEADS * GROUP + heads[:, None]) * n_splits + s[None, :]
    m = tl.load(ml_ptr + row * 2, mask=ok, other=float("-inf"))
    l = tl.load(ml_ptr + row * 2 + 1, mask=ok, other=0.0)
    m_all = tl.max(m, 1)
    m_all = tl.where(g_ok, m_all, 0.0)  # padding rows: keep them finite
    w = tl.where(ok, tl.exp2(m - m_all[:, None]), 0.0)
    acc = tl.load(acc_ptr + row[:, :, None] * HEAD_DIM + d[None, None, :], mask=ok[:, :, None], other=0.0)
    out = tl.sum(acc * w[:, :, None], 1) / tl.maximum(tl.sum(l * w, 1), 1e-30)[:, None]
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None])


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                 seq_lens: torch.Tensor, kv_heads: int) -> torch.Tensor:
    batch, q_heads, head_dim = q.shape
    assert k_cache.shape[1] == PAGE and k_cache.shape[2] == kv_heads and k_cache.shape[3] == head_dim
    assert k_cache.stride() == v_cache.stride(), "the two caches must share one layout"
    assert q.stride(2) == 1 and k_cache.stride(3) == 1 and block_table.stride(1) == 1
    assert head_dim == triton.next_power_of_2(head_dim) and head_dim >= 16, "head_dim must be a power of two >= 16"
    group = q_heads // kv_heads
    n_splits = triton.cdiv(block_table.shape[1] * PAGE, SPLIT)
    acc = torch.empty(batch, q_heads, n_splits, head_dim, dtype=torch.float32, device=q.device)
    ml = torch.empty(batch, q_heads, n_splits, 2, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    _split_kernel[(batch * kv_heads, n_splits)](
        q, k_cache, v_cache, block_table, seq_lens, acc, ml,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table.stride(0),
        n_splits, head_dim ** -0.5 * LOG2E,
        KV_HEADS=kv_heads, GROUP=group, HEAD_DIM=head_dim, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=BLOCK_N, SPLIT_TOKENS=SPLIT, PAGE_SIZE=PAGE, DOT_FP32=DOT_FP32, num_warps=4, num_stages=2)
    _merge_kernel[(batch * kv_heads,)](
        acc, ml, seq_lens, out, out.stride(0), out.stride(1), n_splits,
        KV_HEADS=kv_heads, GROUP=group, HEAD_DIM=head_dim, BLOCK_G=triton.next_power_of_2(group),
        BLOCK_S=max(2, triton.next_power_of_2(n_splits)), SPLIT_TOKENS=SPLIT, num_warps=4)
    return out


class ModelNew(nn.Module):
    def __init__(self, q_heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.kv_heads = kv_heads

    def forward(self, q, k_cache, v_cache, block_table, seq_lens):
        return paged_decode(q, k_cache, v_cache, block_table, seq_lens, self.kv_heads)
