"""Grouped-query causal attention layer (Llama 3 style) in six Triton kernels: the q, k and v
projections (a tiled bfloat16 GEMM), rotary embedding of q and k in place, flash attention, and
the output projection (the same GEMM).

Rotary embedding: each program rotates all q and k heads of a few tokens (float32 math from the
float32 cos/sin tables, one rounding to bfloat16), exactly where the projections wrote them.

Flash attention: one program per (block of BM queries, batch * query head) keeps its queries in
registers and streams the keys and values of its KV head (query head h reads KV head
h // (H / KV)) in BN blocks with an online softmax (base 2, float32 running max and sum), so the
S x S scores never reach memory. Key blocks wholly before the program's first query run unmasked,
the diagonal blocks masked, and key blocks after its last query are never read (about half the
work of dense attention). The output is written as [B, S, H, D], which is the [B * S, E] input of
the output projection.
"""

import math
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

# Triton's interpreter (CPU mode) mis-computes bfloat16 dots and truncates float32 -> bfloat16
# casts: there we feed the dots float32 operands and round by hand.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

_LINEAR_CONFIGS = [
    triton.Config({"BM": 128, "BN": 256, "BK": 64, "GROUP": 8}, num_warps=8, num_stages=3),
    triton.Config({"BM": 256, "BN": 128, "BK": 64, "GROUP": 8}, num_warps=8, num_stages=3),
    triton.Config({"BM": 128, "BN": 128, "BK": 64, "GROUP": 8}, num_warps=8, num_stages=4),
    triton.Config({"BM": 64, "BN": 128, "BK": 64, "GROUP": 8}, num_warps=4, num_stages=4),
]
_ATTENTION_CONFIGS = [  # BM must be a multiple of BN
    triton.Config({"BM": 128, "BN": 64}, num_warps=8, num_stages=3),
    triton.Config({"BM": 128, "BN": 128}, num_warps=8, num_stages=2),
    triton.Config({"BM": 64, "BN": 64}, num_warps=4, num_stages=3),
]
_CPU_LINEAR_TILE = {"BM": 64, "BN": 64, "BK": 64, "GROUP": 4}
_CPU_ATTENTION_TILE = {"BM": 32, "BN": 32}
LOG2E = 1.4426950408889634


@triton.jit
def _bf16(x, INTERPRET: tl.constexpr):
    """x (float32) rounded to the nearest bfloat16 (ties to even), returned as float32."""
    if INTERPRET:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    return x.to(tl.bfloat16).to(tl.float32)


# ----- the projections: out = x @ W^T -------------------------------------------------------
@triton.jit
def _linear_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, stride_om,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
                   INTERPRET: tl.constexpr):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BM)
    grid_n = tl.cdiv(N, BN)
    # Grouped ordering: neighbouring programs share rows of x, for L2 reuse.
    per_group = GROUP * grid_n
    first_m = (pid // per_group) * GROUP
    group_rows = min(grid_m - first_m, GROUP)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    # Rows and columns past the edge read row / column (index mod size): no load masks on M, N.
    x_ptrs = x_ptr + (rm % M)[:, None] * stride_xm + rk[None, :] * stride_xk
    w_ptrs = w_ptr + (rn % N)[None, :] * stride_wn + rk[:, None] * stride_wk
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        k_ok = rk < K - k * BK
        a = tl.load(x_ptrs, mask=k_ok[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
        if INTERPRET:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)
        x_ptrs += BK * stride_xk
        w_ptrs += BK * stride_wk
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :], _bf16(acc, INTERPRET).to(tl.bfloat16),
             mask=mask)


_gpu_linear = triton.autotune(configs=_LINEAR_CONFIGS, key=["M", "N", "K"])(_linear_kernel)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T -> [M, N], bfloat16."""
    M, K = x.shape
    N = w.shape[0]
    out = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    args = (x, w, out, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1), out.stride(0))
    if x.is_cuda:
        _gpu_linear[lambda meta: (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]),)](*args, INTERPRET=False)
    else:  # Triton's interpreter (CPU mode): small tiles
        t = _CPU_LINEAR_TILE
        _linear_kernel[(triton.cdiv(M, t["BM"]) * triton.cdiv(N, t["BN"]),)](*args, **t, INTERPRET=INTERPRET)
    return out


# ----- causal flash attention -----------------------------------------------------------------
@triton.jit
def _attend(acc, l_i, m_i, q, k, v, qk_scale, rows, keys, S, MASKED: tl.constexpr, INTERPRET: tl.constexpr):
    """One key block folded into the running (acc, l_i, m_i); k is [D, BN], v [BN, D]."""
    if INTERPRET:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, k) * qk_scale
    if MASKED:
        s = tl.where((keys[None, :] <= rows[:, None]) & (keys[None, :] < S), s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, S, H, GROUP, qk_scale,
                      sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_h, so_s,
                      D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, INTERPRET: tl.constexpr):
    """Causal attention for BM queries of one (batch, head); query head h reads key/value head h // GROUP."""
    start = (tl.cdiv(S, BM) - 1 - tl.program_id(0)) * BM  # the longest rows first
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    rows = start + tl.arange(0, BM)
    cols = tl.arange(0, BN)
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + b.to(tl.int64) * sq_b + h * sq_h + rows[:, None] * sq_s + dims[None, :],
                mask=rows[:, None] < S, other=0.0)
    if INTERPRET:
        q = q.to(tl.float32)
    k_head = k_ptr + b.to(tl.int64) * sk_b + (h // GROUP) * sk_h
    v_head = v_ptr + b.to(tl.int64) * sv_b + (h // GROUP) * sv_h
    m_i = tl.full([BM], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, D], dtype=tl.float32)
    # Key blocks wholly before the first query: every score counts, no mask.
    for n0 in range(0, start, BN):
        keys = n0 + cols
        k = tl.load(k_head + keys[None, :] * sk_s + dims[:, None])
        v = tl.load(v_head + keys[:, None] * sv_s + dims[None, :])
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k, v, qk_scale, rows, keys, S, False, INTERPRET)
    # The diagonal blocks: key <= query, and key < S. The first holds each row's own key, so the
    # running max is finite from there on.
    for n0 in range(start, tl.minimum(start + BM, S), BN):
        keys = n0 + cols
        k = tl.load(k_head + keys[None, :] * sk_s + dims[:, None], mask=keys[None, :] < S, other=0.0)
        v = tl.load(v_head + keys[:, None] * sv_s + dims[None, :], mask=keys[:, None] < S, other=0.0)
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k, v, qk_scale, rows, keys, S, True, INTERPRET)
    o = _bf16(acc / l_i[:, None], INTERPRET)
    tl.store(o_ptr + b.to(tl.int64) * so_b + h * so_h + rows[:, None] * so_s + dims[None, :], o.to(tl.bfloat16),
             mask=rows[:, None] < S)


_gpu_attention = triton.autotune(configs=_ATTENTION_CONFIGS, key=["S", "H", "D"])(_attention_kernel)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    """out[b, s, h] = causal attention of q[b, h, s] over k, v[b, h // (H / KV)]: [B, heads, S, D]
    views with unit stride along D; out is a [B, S, H, D] view."""
    B, H, S, D = q.shape
    assert q.stride(3) == k.stride(3) == v.stride(3) == out.stride(3) == 1
    group = H // k.shape[1]
    args = (q, k, v, out, S, H, group, LOG2E / math.sqrt(D), q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            out.stride(0), out.stride(2), out.stride(1))
    if q.is_cuda:
        _gpu_attention[lambda meta: (triton.cdiv(S, meta["BM"]), B * H)](*args, D=D, INTERPRET=False)
    else:  # Triton's interpreter (CPU mode): small tiles
        t = _CPU_ATTENTION_TILE
        _attention_kernel[(triton.cdiv(S, t["BM"]), B * H)](*args, D=D, **t, INTERPRET=INTERPRET)


# ----- rotary embedding, in place --------------------------------------------------------
@triton.jit
def _rotate_heads(ptrs, mask, cos, sin, HALF: tl.constexpr, INTERPRET: tl.constexpr):
    """Rotate in place: ptrs is a [tokens, heads, HALF] block pointing at each head's first half."""
    a = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(ptrs + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, _bf16(a * cos - b * sin, INTERPRET).to(tl.bfloat16), mask=mask)
    tl.store(ptrs + HALF, _bf16(b * cos + a * sin, INTERPRET).to(tl.bfloat16), mask=mask)


@triton.jit
def _rope_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, n_tokens, S, H, KV, stride_q, stride_k, stride_tab,
                 HALF: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_KV: tl.constexpr,
                 INTERPRET: tl.constexpr):
    """BLOCK_T tokens per program. Token t (row t of q [B * S, H * D] and k [B * S, KV * D]) sits at
    position t % S."""
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = (tokens < n_tokens)[:, None, None]
    rows = tokens.to(tl.int64)[:, None, None]
    cols = tl.arange(0, HALF)[None, None, :]
    pos = rows % S
    cos = tl.load(cos_ptr + pos * stride_tab + cols, mask=t_ok, other=0.0)
    sin = tl.load(sin_ptr + pos * stride_tab + cols, mask=t_ok, other=0.0)
    hq = tl.arange(0, BLOCK_H)[None, :, None]
    _rotate_heads(q_ptr + rows * stride_q + hq * (2 * HALF) + cols, t_ok & (hq < H), cos, sin, HALF, INTERPRET)
    hk = tl.arange(0, BLOCK_KV)[None, :, None]
    _rotate_heads(k_ptr + rows * stride_k + hk * (2 * HALF) + cols, t_ok & (hk < KV), cos, sin, HALF, INTERPRET)


def rope_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, S: int, H: int, KV: int) -> None:
    """Rotate q [B * S, H * D] and k [B * S, KV * D] (rows contiguous) in place."""
    n_tokens, half = q.shape[0], cos.shape[1]
    # A few tokens per program on a GPU; more under the interpreter, whose cost is per program.
    block_t = 2 if q.is_cuda else 16
    _rope_kernel[(triton.cdiv(n_tokens, block_t),)](
        q, k, cos, sin, n_tokens, S, H, KV, q.stride(0), k.stride(0), cos.stride(0), HALF=half, BLOCK_T=block_t,
        BLOCK_H=triton.next_power_of_2(H), BLOCK_KV=triton.next_power_of_2(KV), INTERPRET=INTERPRET, num_warps=4)


class ModelNew(nn.Module):
    def __init__(self, S: int, E: int, H: int, KV: int):
        super().__init__()
        self.heads, self.kv_heads, D = H, KV, E // H
        self.q = nn.Parameter(torch.empty(E, E, dtype=torch.bfloat16))
        self.k = nn.Parameter(torch.empty(KV * D, E, dtype=torch.bfloat16))
        self.v = nn.Parameter(torch.empty(KV * D, E, dtype=torch.bfloat16))
        self.o = nn.Parameter(torch.empty(E, E, dtype=torch.bfloat16))
        self.register_buffer("cos", torch.empty(S, D // 2))
        self.register_buffer("sin", torch.empty(S, D // 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, E = x.shape
        H, KV, D = self.heads, self.kv_heads, E // self.heads
        x2 = x.reshape(B * S, E)
        q, k, v = linear(x2, self.q), linear(x2, self.k), linear(x2, self.v)
        rope_(q, k, self.cos.contiguous(), self.sin.contiguous(), S, H, KV)
        o = torch.empty((B, S, H, D), dtype=torch.bfloat16, device=x.device)
        causal_attention(q.view(B, S, H, D).transpose(1, 2), k.view(B, S, KV, D).transpose(1, 2),
                         v.view(B, S, KV, D).transpose(1, 2), o)
        return linear(o.view(B * S, E), self.o).view(B, S, E)
