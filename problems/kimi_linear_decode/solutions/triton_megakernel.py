"""kimi_linear_decode: the whole decode step as ONE Triton kernel launch (a persistent megakernel).

Grid = the number of SMs, launched cooperatively (the driver refuses a grid that cannot be
co-resident, so the spin barriers below can never wait on a program that is not running).
Each program loops over the current phase's work items (item = pid, pid + n_programs, ...), then
all programs meet at a grid-wide barrier before the next phase:

    prologue                      bf16 hidden -> fp32 residual x; a foreign MLA cache copied in
    per KDA layer   kda_proj      x_n = rmsnorm(x); q|k|v|g = x_n @ W4 (one GEMV over packed weights)
                    kda_recur     per (head, value block): beta, conv + SiLU, decay, delta rule, o
                    out_proj      h = x + o @ W_o; the conv windows shifted in place
    per MLA layer   mla_proj      q|kv = rmsnorm(x) @ W4
                    mla_absorb    per head: rope, q_lat = W_kb[h] q_nope; the new cache row
                    mla_attend    per (sequence chunk, head block): flash-decoding partials
                    mla_combine   per head: partials merged, v = o_lat @ W_vb[h]
                    out_proj      h = x + v @ W_o
    per layer       moe_router    router logits of rmsnorm(h); shared expert's gate|up
                    moe_gate_up   top-k (every program); routed experts' act = silu(gate) * up
                    moe_down      x = h + sum_slots weight * act @ W_down (last layer: bf16 hidden)

The math and the state layout are the reference's (fp32 activations, the exact (q - zero) * scale
dequant in registers). The model repacks every W4A16 weight once, column-major (each output
column's packed bytes contiguous along `in`, read as 32-bit words whose eight nibbles are eight
consecutive inputs of one quantization group): a thread's 16-byte load is 32 weights sharing one
scale, the nibble becomes a float by OR-ing it into the mantissa of 2**23, and a GEMV item of BN
columns streams KB bytes of each per iteration with the next KB already loading (~32 KB in flight
per SM), whatever BN is. The reference-named parameters stay views of the packed copies. A GEMV's
input vector is first copied into the program's private row of a scratch buffer (RMSNorm applied
there) and read back through L1. Intermediates live in scratch buffers the model owns. State: each
KDA layer's S and conv windows are updated in place in the fed tensors and returned; the MLA caches
live in a capacity buffer the model owns and come back as views of it (appended in place when the
fed cache is the model's own view, copied in by the prologue otherwise).

The grid barrier (`_grid_sync`): a global int64 counter that only grows. Barrier b of a step
waits until counter >= base + (b + 1) * n_programs, where `base` is the counter's value when the
step began (the kernel reads it from a second word, which program 0 advances at the end of the
step), so no reset is ever needed. What it relies on from Triton (checked in the PTX Triton 3.6
and 3.9 emit for sm_90):
- `tl.debug_barrier()` is `bar.sync 0`: every thread's stores of the phase are performed with
  respect to the CTA before any thread goes on;
- a scalar `tl.atomic_add(ptr, 1, sem="release", scope="gpu")` is ONE atomic, issued by thread 0
  only (`@p atom/red.global.gpu.release.add`); after the bar.sync it publishes the whole CTA's
  stores (release is cumulative, as in cooperative groups' grid.sync);
- a scalar `tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")` becomes `ld.global.gpu.acquire`
  by thread 0, its value broadcast to the CTA through shared memory behind a bar.sync, so the
  spin loop's condition is uniform and every thread's later loads are ordered after it;
- data other programs wrote in this launch is loaded with `cache_modifier=".cg"` (from L2, never
  a stale L1 line); so are the weights (streamed once, they would only evict useful L1 lines);
  a program's private rows, which only its own threads write (bar.sync between write and read),
  and the fed inputs use ordinary loads.
A barrier that spins past `SPIN_LIMIT` polls gives up and raises a flag in the counter buffer
(read by `Model.barrier_timeouts()`), so a scheduling bug shows as a wrong answer and a flag,
never as a hung GPU.

Under Triton's interpreter (TRITON_INTERPRET=1, CPU mode: programs run one after another, so a
spin barrier would deadlock) the same kernel is launched once per phase with the barrier
compiled out (GRID_SYNC=False): the phase code that runs in CI is the code that runs on the GPU;
only the sequencing differs. `Model.prepare_step(...).run(first, last, grid_sync=False)` exposes that
mode on a GPU too (benchmarks/kimi_solution_check.py checks every phase's scratch against the
reference's intermediates with it, and compares it bitwise with the single launch).
"""

import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
EPS = 1e-6
SPIN_LIMIT = 1 << 22  # polls (each ~0.3-1 us) before a barrier gives up and flags
_MAGIC = tl.constexpr(0x4B000000)  # float32 bits of 2**23: OR-ing a 4-bit q into the mantissa gives 2**23 + q
_TWO23 = tl.constexpr(8388608.0)

# phases of one layer (out_proj is shared by both attention kinds)
KDA_PHASES = ("kda_proj", "kda_recur", "out_proj")
MLA_PHASES = ("mla_proj", "mla_absorb", "mla_attend", "mla_combine", "out_proj")
MOE_PHASES = ("moe_router", "moe_gate_up", "moe_down")


# ===== device helpers ================================================================================
@triton.jit
def _rstd(x_ptr, eps, N: tl.constexpr, BLOCK: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) of an fp32 vector of N."""
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, N, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < N, other=0.0, cache_modifier=".cg")
        acc += v * v
    return tl.rsqrt(tl.sum(acc, axis=0) / N + eps)


@triton.jit
def _w4_words(w32, n, nmask, wi, seg_e_ptr, KW: tl.constexpr, NS: tl.constexpr, NSEG: tl.constexpr):
    """The packed words at (global) word indices wi of columns n (see `_w4_tile`)."""
    m = nmask & (wi < NSEG * KW)
    if NSEG == 1:
        off = n * KW + wi
    else:
        seg = wi // KW
        e = tl.load(seg_e_ptr + seg, mask=wi < NSEG * KW, other=0, cache_modifier=".cg")
        off = e.to(tl.int64) * (NS * KW) + n * KW + (wi - seg * KW)
    return tl.load(w32 + off, mask=m, other=0, cache_modifier=".cg")


@triton.jit
def _w4_tile(x_ptr, w_ptr, s_ptr, z_ptr, cols, cmask, seg_e_ptr, seg_w_ptr,
             K: tl.constexpr, NS: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, KB: tl.constexpr,
             NSEG: tl.constexpr):
    """y[i] = sum_k x[k] * w[k, cols[i]] (fp32) for a W4A16 weight the model stores column-major:
    column n's K/2 packed bytes at w_ptr + n * K/2, read as 32-bit words (nibble p of word v is
    k = 8v + p, so a word's eight weights share one quantization group), its scales and zeros at
    s_ptr / z_ptr + n * K/GROUP. x is read with ordinary (L1) loads: it is the program's private
    copy. Each iteration covers KB bytes of BN columns and loads the next KB before using these.
    With NSEG > 1, x holds NSEG segments of K (the MoE down: one per slot) and segment j uses the
    matrix seg_e[j] (of NS columns) with its scales times seg_w[j] (the slot's routing weight)."""
    KW: tl.constexpr = K // 8  # words per column
    NG: tl.constexpr = K // GROUP
    WG: tl.constexpr = GROUP // 8  # words per quantization group
    C: tl.constexpr = KB // 16  # 16-byte chunks (4 words) per column per iteration
    w32 = w_ptr.to(tl.pointer_type(tl.uint32))
    n = cols[:, None, None, None]
    nmask = cmask[:, None, None, None]
    c = tl.arange(0, C)[None, :, None, None]
    j = tl.arange(0, 4)[None, None, :, None]
    p = tl.arange(0, 8)[None, None, None, :]
    acc = tl.zeros([BN, C, 1], dtype=tl.float32)
    words = _w4_words(w32, n, nmask, 4 * c + j, seg_e_ptr, KW, NS, NSEG)
    for w0 in range(0, NSEG * KW, 4 * C):
        words_next = _w4_words(w32, n, nmask, w0 + 4 * C + 4 * c + j, seg_e_ptr, KW, NS, NSEG)
        wc = w0 + 4 * c  # the chunk's first word [1, C, 1, 1]
        live = wc < NSEG * KW
        xv = tl.load(x_ptr + 8 * (wc + j) + p, mask=live, other=0.0)
        if NSEG == 1:
            sz = n * NG + wc // WG
            scale = 1.0
        else:
            seg = wc // KW
            e = tl.load(seg_e_ptr + seg, mask=live, other=0, cache_modifier=".cg").to(tl.int64)
            sz = e * (NS * NG) + n * NG + (wc - seg * KW) // WG
            scale = tl.load(seg_w_ptr + seg, mask=live, other=0.0, cache_modifier=".cg")
        sc = tl.load(s_ptr + sz, mask=nmask & live, other=0.0).to(tl.float32) * scale
        zm = tl.load(z_ptr + sz, mask=nmask & live, other=0.0).to(tl.float32) + _TWO23
        q = (((words >> (4 * p)) & 0xF) | _MAGIC).to(tl.float32, bitcast=True)  # 2**23 + q, exactly
        part = tl.sum(tl.sum((q - zm) * xv, axis=3), axis=2)  # the chunk's 32 weights, in-thread
        acc += part[:, :, None] * tl.sum(tl.sum(sc, axis=3), axis=2)[:, :, None]
        words = words_next
    return tl.sum(tl.sum(acc, axis=2), axis=1)


@triton.jit
def _stage(src_ptr, dst_ptr, nw_ptr, rstd, N: tl.constexpr, BD: tl.constexpr, NORM: tl.constexpr):
    """dst[:N] = src (times rstd * nw with NORM): a GEMV's input copied into the program's private
    row (read back through L1 by `_w4_tile`; src, written by other programs, is read from L2)."""
    for d0 in range(0, N, BD):
        d = d0 + tl.arange(0, BD)
        v = tl.load(src_ptr + d, mask=d < N, other=0.0, cache_modifier=".cg")
        if NORM:
            v = v * rstd * tl.load(nw_ptr + d, mask=d < N, other=0.0).to(tl.float32)
        tl.store(dst_ptr + d, v, mask=d < N)
    tl.debug_barrier()  # every thread's part of the row is written before any thread reads it


@triton.jit
def _conv_silu(cur_ptr, win_ptr, cw_ptr, ch, HK: tl.constexpr):
    """(SiLU of the causal depthwise conv over [3 stored values, current], current) at channels ch."""
    cur = tl.load(cur_ptr + ch, cache_modifier=".cg")
    out = cur * tl.load(cw_ptr + ch * 4 + 3).to(tl.float32)
    for t in tl.static_range(3):
        out += tl.load(win_ptr + t * HK + ch).to(tl.float32) * tl.load(cw_ptr + ch * 4 + t).to(tl.float32)
    return out * tl.sigmoid(out), cur


@triton.jit
def _rope_cs(inv_ptr, pos, HALF_D: tl.constexpr):
    """cos and sin (fp32, computed in fp64 like the reference) of pos * inv_freq."""
    ang = pos.to(tl.float64) * tl.load(inv_ptr + tl.arange(0, HALF_D))
    return tl.cos(ang).to(tl.float32), tl.sin(ang).to(tl.float32)


@triton.jit
def _topk(logits_ptr, scaling, E: tl.constexpr, A: tl.constexpr, EP: tl.constexpr, SP: tl.constexpr):
    """(expert ids, weights) per slot: slots < A the router's top-A (softmax renormalized over them,
    times `scaling`: the softmax's denominator cancels), slots A.. the shared experts E, E+1, ..."""
    idx = tl.arange(0, EP)
    lg = tl.load(logits_ptr + idx, mask=idx < E, other=-float("inf"), cache_modifier=".cg")
    top = tl.max(lg, axis=0)
    sl = tl.arange(0, SP)
    ids = E + sl - A
    wts = tl.full([SP], 1.0, tl.float32)
    total = 0.0
    for s in tl.static_range(A):
        best = tl.max(lg, axis=0)
        i = tl.argmax(lg, axis=0)
        p = tl.exp(best - top)
        ids = tl.where(sl == s, i, ids)
        wts = tl.where(sl == s, p, wts)
        total += p
        lg = tl.where(idx == i, -float("inf"), lg)
    wts = tl.where(sl < A, wts / total * scaling, wts)
    return ids, wts


@triton.jit
def _pick3(i, a, b, c):
    """a, b or c by a runtime index (the KDA layers' separate state tensors)."""
    if i == 0:
        r = a
    elif i == 1:
        r = b
    else:
        r = c
    return r


@triton.jit
def _grid_sync(sync_ptr, target, SPIN: tl.constexpr):
    """Arrive at a grid-wide barrier and wait until `target` arrivals were counted (see the module
    docstring). sync_ptr[0]: arrivals; sync_ptr[2]: barriers that gave up waiting."""
    tl.debug_barrier()  # every thread's stores of this phase are performed (CTA) before the release
    tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    polls = 0
    while (seen < target) & (polls < SPIN):
        seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
        polls += 1
    if seen < target:
        tl.atomic_add(sync_ptr + 2, 1, sem="relaxed", scope="gpu")
    tl.debug_barrier()  # no thread reads another program's data before the acquire


@triton.jit
def _phase_end(ph, first, last, sync_ptr, base, nprog, SPIN: tl.constexpr):
    """After phase `ph`: the grid barrier (unless it was the launch's last phase); the next phase's number.
    (Called only with GRID_SYNC: the interpreter's per-phase launches just count, `ph + 1`.)"""
    if (ph >= first) & (ph < last):
        _grid_sync(sync_ptr, base + (ph - first + 1) * nprog, SPIN)
    return ph + 1


# ===== phases: each program takes items pid, pid + nprog, ... ========================================
@triton.jit
def _prologue(pid, nprog, hidden_ptr, x_ptr, n_copy, src_c, src_r, src_c_stride, src_r_stride, cache_c, cache_r,
              D: tl.constexpr, KVL: tl.constexpr, ROPE: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr):
    """x = float(hidden); rows [0, n_copy) of a foreign MLA cache copied into the capacity buffer."""
    n_x = tl.cdiv(D, BD)
    n_items = n_x + tl.cdiv(n_copy, BR)
    for it in range(pid, n_items, nprog):
        if it < n_x:
            d = it * BD + tl.arange(0, BD)
            tl.store(x_ptr + d, tl.load(hidden_ptr + d, mask=d < D, other=0.0).to(tl.float32), mask=d < D)
        else:
            rows = (it - n_x) * BR + tl.arange(0, BR)[:, None]
            rmask = rows < n_copy
            rows = rows.to(tl.int64)
            c = tl.arange(0, KVL)[None, :]
            tl.store(cache_c + rows * KVL + c, tl.load(src_c + rows * src_c_stride + c, mask=rmask), mask=rmask)
            rr = tl.arange(0, ROPE)[None, :]
            tl.store(cache_r + rows * ROPE + rr, tl.load(src_r + rows * src_r_stride + rr, mask=rmask), mask=rmask)


@triton.jit
def _in_proj(pid, nprog, x_ptr, nw_ptr, w_ptr, s_ptr, z_ptr, y_ptr, xn_ptr, xp_ptr, eps,
             D: tl.constexpr, N: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, KB: tl.constexpr,
             BD: tl.constexpr):
    """y = rmsnorm(x) @ W (a layer's input projections packed side by side); program 0 keeps rmsnorm(x)."""
    n_items = tl.cdiv(N, BN)
    if pid < n_items:
        rstd = _rstd(x_ptr, eps, D, BD)
        _stage(x_ptr, xp_ptr, nw_ptr, rstd, D, BD, True)
        for it in range(pid, n_items, nprog):
            cols = it * BN + tl.arange(0, BN)
            y = _w4_tile(xp_ptr, w_ptr, s_ptr, z_ptr, cols, cols < N, xp_ptr, xp_ptr, D, N, GROUP, BN, KB, 1)
            tl.store(y_ptr + cols, y, mask=cols < N)
        if pid == 0:
            for d0 in range(0, D, BD):
                d = d0 + tl.arange(0, BD)
                tl.store(xn_ptr + d, tl.load(xp_ptr + d, mask=d < D, other=0.0), mask=d < D)


@triton.jit
def _kda_recur(pid, nprog, proj_ptr, xn_ptr, beta_w_ptr, conv_w_ptr, cq_ptr, ck_ptr, cv_ptr, s_ptr, o_ptr,
               H: tl.constexpr, D: tl.constexpr, DK: tl.constexpr, BV: tl.constexpr, BD: tl.constexpr):
    """Per (head, value block): beta, conv + SiLU of q, k, v, decay, the delta-rule update of
    S[h][:, block] (in place: only this item touches it) and o. The windows are shifted later."""
    HK: tl.constexpr = H * DK
    NVB: tl.constexpr = DK // BV
    kk = tl.arange(0, DK)
    for it in range(pid, H * NVB, nprog):
        h = it // NVB
        vv = (it % NVB) * BV + tl.arange(0, BV)
        acc = tl.zeros([BD], dtype=tl.float32)
        for d0 in range(0, D, BD):
            d = d0 + tl.arange(0, BD)
            acc += tl.load(xn_ptr + d, mask=d < D, other=0.0, cache_modifier=".cg") * \
                tl.load(beta_w_ptr + h * D + d, mask=d < D, other=0.0).to(tl.float32)
        beta = tl.sigmoid(tl.sum(acc, axis=0))
        q, q_cur = _conv_silu(proj_ptr, cq_ptr, conv_w_ptr, h * DK + kk, HK)
        k, k_cur = _conv_silu(proj_ptr + HK, ck_ptr, conv_w_ptr + HK * 4, h * DK + kk, HK)
        v, v_cur = _conv_silu(proj_ptr + 2 * HK, cv_ptr, conv_w_ptr + 2 * HK * 4, h * DK + vv, HK)
        q = q * (DK ** -0.5)
        decay = tl.sigmoid(-tl.load(proj_ptr + 3 * HK + h * DK + kk, cache_modifier=".cg"))  # exp(-softplus(g))
        offs = h * DK * DK + kk[:, None] * DK + vv[None, :]
        S = tl.load(s_ptr + offs) * decay[:, None]
        pred = tl.sum(S * k[:, None], axis=0)
        S = S + beta * k[:, None] * (v - pred)[None, :]
        tl.store(s_ptr + offs, S)
        tl.store(o_ptr + h * DK + vv, tl.sum(S * q[:, None], axis=0))


@triton.jit
def _out_proj(pid, nprog, a_ptr, w_ptr, s_ptr, z_ptr, x_ptr, h_ptr, xp_ptr, shift, proj_ptr, cq_ptr, ck_ptr, cv_ptr,
              K: tl.constexpr, D: tl.constexpr, HK: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr,
              KB: tl.constexpr, BD: tl.constexpr, SB: tl.constexpr):
    """h = x + a @ W_o; with `shift` (a KDA layer) also the conv windows, in place: [w1, w2, current]."""
    n_tiles = tl.cdiv(D, BN)
    n_shift = tl.where(shift, 3 * tl.cdiv(HK, SB), 0)
    if pid < n_tiles:
        _stage(a_ptr, xp_ptr, a_ptr, 1.0, K, BD, False)
    for it in range(pid, n_tiles + n_shift, nprog):
        if it < n_tiles:
            cols = it * BN + tl.arange(0, BN)
            y = _w4_tile(xp_ptr, w_ptr, s_ptr, z_ptr, cols, cols < D, xp_ptr, xp_ptr, K, D, GROUP, BN, KB, 1)
            tl.store(h_ptr + cols, tl.load(x_ptr + cols, mask=cols < D, other=0.0, cache_modifier=".cg") + y,
                     mask=cols < D)
        else:
            j = it - n_tiles
            which = j // tl.cdiv(HK, SB)
            ch = (j % tl.cdiv(HK, SB)) * SB + tl.arange(0, SB)
            m = ch < HK
            win = _pick3(which, cq_ptr, ck_ptr, cv_ptr)
            w1 = tl.load(win + HK + ch, mask=m)
            w2 = tl.load(win + 2 * HK + ch, mask=m)
            cur = tl.load(proj_ptr + which * HK + ch, mask=m, cache_modifier=".cg")
            tl.store(win + ch, w1, mask=m)
            tl.store(win + HK + ch, w2, mask=m)
            tl.store(win + 2 * HK + ch, cur.to(tl.bfloat16), mask=m)


@triton.jit
def _mla_absorb(pid, nprog, qa_ptr, inv_ptr, w_ptr, s_ptr, z_ptr, qlat_ptr, qrope_ptr, cache_c, cache_r, pos,
                HM: tl.constexpr, NOPE: tl.constexpr, ROPE: tl.constexpr, VH: tl.constexpr, KVL: tl.constexpr,
                GROUP: tl.constexpr, WB: tl.constexpr):
    """Items < HM: head h's rotated q_rope and absorbed query q_lat = W_kb[h] q_nope (both times the
    score scale; kv_b column-major, so the sum runs over the head's NOPE columns). Item HM: the new
    cache row (latent c and rotated k_rope, in bf16) at `pos`."""
    QK: tl.constexpr = NOPE + ROPE
    KW: tl.constexpr = KVL // 8  # words per kv_b column
    NG: tl.constexpr = KVL // GROUP
    scale = QK ** -0.5
    i = tl.arange(0, ROPE // 2)
    cos, sin = _rope_cs(inv_ptr, pos, ROPE // 2)
    w32 = w_ptr.to(tl.pointer_type(tl.uint32))
    for h in range(pid, HM + 1, nprog):
        if h < HM:
            x0 = tl.load(qa_ptr + h * QK + NOPE + 2 * i, cache_modifier=".cg")
            x1 = tl.load(qa_ptr + h * QK + NOPE + 2 * i + 1, cache_modifier=".cg")
            tl.store(qrope_ptr + h * ROPE + 2 * i, (x0 * cos - x1 * sin) * scale)
            tl.store(qrope_ptr + h * ROPE + 2 * i + 1, (x0 * sin + x1 * cos) * scale)
            j = tl.arange(0, NOPE)
            q_nope = tl.load(qa_ptr + h * QK + j, cache_modifier=".cg")[:, None, None]
            col = (h * (NOPE + VH) + j)[:, None, None]
            p = tl.arange(0, 8)[None, None, :]
            for v0 in range(0, KW, WB):
                wv = v0 + tl.arange(0, WB)[None, :, None]
                words = tl.load(w32 + col * KW + wv)
                sz = col * NG + wv // (GROUP // 8)
                sc = tl.load(s_ptr + sz).to(tl.float32)
                zm = tl.load(z_ptr + sz).to(tl.float32) + _TWO23
                q = (((words >> (4 * p)) & 0xF) | _MAGIC).to(tl.float32, bitcast=True)
                lat = tl.sum((q - zm) * sc * q_nope, axis=0)  # [WB, 8]: latent index 8 * word + p
                k = 8 * (v0 + tl.arange(0, WB))[:, None] + tl.arange(0, 8)[None, :]
                tl.store(qlat_ptr + h * KVL + k, lat * scale)
        else:
            c = tl.arange(0, KVL)
            kv = qa_ptr + HM * QK
            row = pos.to(tl.int64)
            tl.store(cache_c + row * KVL + c, tl.load(kv + c, cache_modifier=".cg").to(tl.bfloat16))
            x0 = tl.load(kv + KVL + 2 * i, cache_modifier=".cg")
            x1 = tl.load(kv + KVL + 2 * i + 1, cache_modifier=".cg")
            tl.store(cache_r + row * ROPE + 2 * i, (x0 * cos - x1 * sin).to(tl.bfloat16))
            tl.store(cache_r + row * ROPE + 2 * i + 1, (x0 * sin + x1 * cos).to(tl.bfloat16))


@triton.jit
def _mla_attend(pid, nprog, qlat_ptr, qrope_ptr, cache_c, cache_r, pm_ptr, pl_ptr, pacc_ptr, n_pos, n_chunks, chunk,
                HM: tl.constexpr, KVL: tl.constexpr, ROPE: tl.constexpr, HB: tl.constexpr, BT: tl.constexpr,
                DOT_BF16: tl.constexpr):
    """Flash-decoding partials per (sequence chunk, head block) over the latent cache (rows 0..pos,
    the new one included): running max, sum and unnormalized latent output per head."""
    NHB: tl.constexpr = (HM + HB - 1) // HB
    c = tl.arange(0, KVL)
    rr = tl.arange(0, ROPE)
    for it in range(pid, n_chunks * NHB, nprog):
        ci = it // NHB
        heads = (it % NHB) * HB + tl.arange(0, HB)
        hmask = heads < HM
        q = tl.load(qlat_ptr + heads[:, None] * KVL + c[None, :], mask=hmask[:, None], other=0.0,
                    cache_modifier=".cg")
        qr = tl.load(qrope_ptr + heads[:, None] * ROPE + rr[None, :], mask=hmask[:, None], other=0.0,
                     cache_modifier=".cg")
        if DOT_BF16:
            q = q.to(tl.bfloat16)
            qr = qr.to(tl.bfloat16)
        m = tl.full([HB], -1e30, tl.float32)
        den = tl.zeros([HB], dtype=tl.float32)
        acc = tl.zeros([HB, KVL], dtype=tl.float32)
        t_lo = ci * chunk
        t_hi = tl.minimum(t_lo + chunk, n_pos)
        for t0 in range(t_lo, t_hi, BT):
            t = t0 + tl.arange(0, BT)
            tmask = t < t_hi
            rows = t[:, None].to(tl.int64)
            cc = tl.load(cache_c + rows * KVL + c[None, :], mask=tmask[:, None], other=0.0, cache_modifier=".cg")
            kr = tl.load(cache_r + rows * ROPE + rr[None, :], mask=tmask[:, None], other=0.0, cache_modifier=".cg")
            if not DOT_BF16:
                cc = cc.to(tl.float32)
                kr = kr.to(tl.float32)
            s = tl.dot(q, tl.trans(cc)) + tl.dot(qr, tl.trans(kr))
            s = tl.where(tmask[None, :], s, -float("inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            den = den * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(cc.dtype), cc)
            m = m_new
        tl.store(pm_ptr + ci * HM + heads, m, mask=hmask)
        tl.store(pl_ptr + ci * HM + heads, den, mask=hmask)
        tl.store(pacc_ptr + (ci * HM + heads[:, None]) * KVL + c[None, :], acc, mask=hmask[:, None])


@triton.jit
def _mla_combine(pid, nprog, pm_ptr, pl_ptr, pacc_ptr, olat_ptr, w_ptr, s_ptr, z_ptr, v_ptr, xp_ptr, n_chunks,
                 HM: tl.constexpr, KVL: tl.constexpr, NOPE: tl.constexpr, VH: tl.constexpr, GROUP: tl.constexpr,
                 CP: tl.constexpr, CB: tl.constexpr, KB: tl.constexpr):
    """Per head: the partials merged into the normalized latent output, then v = o_lat @ W_vb[h]."""
    cs = tl.arange(0, CP)
    c = tl.arange(0, KVL)
    for h in range(pid, HM, nprog):
        pm = tl.load(pm_ptr + cs * HM + h, mask=cs < n_chunks, other=-float("inf"), cache_modifier=".cg")
        top = tl.max(pm, axis=0)
        den = tl.sum(tl.exp(pm - top) * tl.load(pl_ptr + cs * HM + h, mask=cs < n_chunks, other=0.0,
                                                  cache_modifier=".cg"), axis=0)
        o = tl.zeros([KVL], dtype=tl.float32)
        for c0 in range(0, n_chunks, CB):
            cb = c0 + tl.arange(0, CB)
            w = tl.exp(tl.load(pm_ptr + cb * HM + h, mask=cb < n_chunks, other=-float("inf"),
                               cache_modifier=".cg") - top)
            part = tl.load(pacc_ptr + (cb[:, None] * HM + h) * KVL + c[None, :], mask=cb[:, None] < n_chunks,
                           other=0.0, cache_modifier=".cg")
            o += tl.sum(part * w[:, None], axis=0)
        o = o / den
        tl.store(olat_ptr + h * KVL + c, o)
        tl.debug_barrier()  # the previous head's GEMV has read the private row
        tl.store(xp_ptr + c, o)
        tl.debug_barrier()  # every thread's o_lat in the private row before the GEMV reads it
        cols = h * (NOPE + VH) + NOPE + tl.arange(0, VH)
        v = _w4_tile(xp_ptr, w_ptr, s_ptr, z_ptr, cols, cols < HM * (NOPE + VH), xp_ptr, xp_ptr,
                     KVL, HM * (NOPE + VH), GROUP, VH, KB, 1)
        tl.store(v_ptr + h * VH + tl.arange(0, VH), v)


@triton.jit
def _moe_router(pid, nprog, h_ptr, nw_ptr, r_ptr, logits_ptr, w_ptr, s_ptr, z_ptr, act_ptr, xp_ptr, eps,
                D: tl.constexpr, E: tl.constexpr, I: tl.constexpr, A: tl.constexpr, NSH: tl.constexpr,
                GROUP: tl.constexpr, EB: tl.constexpr, BN: tl.constexpr, KB: tl.constexpr, BD: tl.constexpr):
    """Router logits of rmsnorm(h) (EB experts per item), and the shared experts' act = silu(gate) * up
    (BN // 2 columns per item; they need no routing)."""
    n_r = tl.cdiv(E, EB)
    NT: tl.constexpr = (2 * I + BN - 1) // BN
    if pid < n_r + NSH * NT:
        rstd = _rstd(h_ptr, eps, D, BD)
        _stage(h_ptr, xp_ptr, nw_ptr, rstd, D, BD, True)
    for it in range(pid, n_r + NSH * NT, nprog):
        if it < n_r:
            e = it * EB + tl.arange(0, EB)
            acc = tl.zeros([EB, BD], dtype=tl.float32)
            for d0 in range(0, D, BD):
                d = d0 + tl.arange(0, BD)
                xn = tl.load(xp_ptr + d, mask=d < D, other=0.0)
                w = tl.load(r_ptr + e[:, None] * D + d[None, :], mask=(e[:, None] < E) & (d[None, :] < D), other=0.0)
                acc += w.to(tl.float32) * xn[None, :]
            tl.store(logits_ptr + e, tl.sum(acc, axis=1), mask=e < E)
        else:
            j = it - n_r
            base = (E + j // NT).to(tl.int64)
            _gate_up_item(xp_ptr, w_ptr + base * (D // 2) * (2 * I), s_ptr + base * (D // GROUP) * (2 * I),
                          z_ptr + base * (D // GROUP) * (2 * I), act_ptr + (A + j // NT) * I, (j % NT) * (BN // 2),
                          D, I, GROUP, BN, KB)


@triton.jit
def _gate_up_item(xp_ptr, wq, sq, zq, act_ptr, n0, D: tl.constexpr, I: tl.constexpr, GROUP: tl.constexpr,
                  BN: tl.constexpr, KB: tl.constexpr):
    """act[n0 : n0 + BN/2] = silu(xn @ gate) * (xn @ up) for one expert: one tile over the gate and up
    columns interleaved (gate|up are packed side by side: up's column n is I + n)."""
    i = tl.arange(0, BN)
    n = n0 + i // 2
    y = _w4_tile(xp_ptr, wq, sq, zq, n + (i % 2) * I, n < I, xp_ptr, xp_ptr, D, 2 * I, GROUP, BN, KB, 1)
    g, u = tl.split(tl.reshape(y, [BN // 2, 2]))
    na = n0 + tl.arange(0, BN // 2)
    tl.store(act_ptr + na, g * tl.sigmoid(g) * u, mask=na < I)


@triton.jit
def _moe_gate_up(pid, nprog, h_ptr, nw_ptr, logits_ptr, w_ptr, s_ptr, z_ptr, act_ptr, rid_ptr, rw_ptr, xp_ptr,
                 scaling, eps, D: tl.constexpr, I: tl.constexpr, E: tl.constexpr, A: tl.constexpr,
                 SLOTS: tl.constexpr, EP: tl.constexpr, SP: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr,
                 KB: tl.constexpr, BD: tl.constexpr):
    """Every program takes the top-k from the logits itself (program 0 keeps it for moe_down); items
    are (routed slot, BN // 2 columns of gate and of up)."""
    NT: tl.constexpr = (2 * I + BN - 1) // BN
    ids, wts = _topk(logits_ptr, scaling, E, A, EP, SP)
    sl = tl.arange(0, SP)
    if pid == 0:
        tl.store(rid_ptr + sl, ids, mask=sl < SLOTS)
        tl.store(rw_ptr + sl, wts, mask=sl < SLOTS)
    if pid < A * NT:
        rstd = _rstd(h_ptr, eps, D, BD)
        _stage(h_ptr, xp_ptr, nw_ptr, rstd, D, BD, True)
    for it in range(pid, A * NT, nprog):
        slot = it // NT
        base = tl.sum(tl.where(sl == slot, ids, 0), axis=0).to(tl.int64)
        _gate_up_item(xp_ptr, w_ptr + base * (D // 2) * (2 * I), s_ptr + base * (D // GROUP) * (2 * I),
                      z_ptr + base * (D // GROUP) * (2 * I), act_ptr + slot * I, (it % NT) * (BN // 2),
                      D, I, GROUP, BN, KB)


@triton.jit
def _moe_down(pid, nprog, act_ptr, rid_ptr, rw_ptr, w_ptr, s_ptr, z_ptr, h_ptr, x_ptr, out_ptr, xp_ptr, last,
              D: tl.constexpr, I: tl.constexpr, SLOTS: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr,
              KB: tl.constexpr, BD: tl.constexpr):
    """x = h + sum_slots weight * (act[slot] @ down[expert]): one GEMV over the slots' activations
    concatenated (each slot's segment with its expert's matrix, its weight folded into the scales);
    the last layer also writes the bf16 hidden."""
    n_items = tl.cdiv(D, BN)
    if pid < n_items:
        _stage(act_ptr, xp_ptr, act_ptr, 1.0, SLOTS * I, BD, False)
    for it in range(pid, n_items, nprog):
        cols = it * BN + tl.arange(0, BN)
        y = _w4_tile(xp_ptr, w_ptr, s_ptr, z_ptr, cols, cols < D, rid_ptr, rw_ptr, I, D, GROUP, BN, KB, SLOTS)
        y = tl.load(h_ptr + cols, mask=cols < D, other=0.0, cache_modifier=".cg") + y
        tl.store(x_ptr + cols, y, mask=cols < D)
        if last:
            tl.store(out_ptr + cols, y.to(tl.bfloat16), mask=cols < D)


# ===== the kernel: every phase of the step, in order =================================================
@triton.jit(do_not_specialize=["pos", "n_copy", "src_c_stride", "src_r_stride", "n_chunks", "chunk", "first", "last"])
def _decode_step_kernel(
        # the step's input and output, the KDA state tensors (updated in place), the MLA capacity
        # buffers and (when foreign) the fed caches to copy in
        hidden_ptr, out_ptr, S0, S1, S2, cq0, ck0, cv0, cq1, ck1, cv1, cq2, ck2, cv2,
        cache_c, cache_r, src_c, src_r, pos, n_copy, src_c_stride, src_r_stride,
        # packed weights
        attn_norm, moe_norm, qkvg_w, qkvg_s, qkvg_z, beta_w, conv_w, qa_w, qa_s, qa_z, kvb_w, kvb_s, kvb_z,
        o_w, o_s, o_z, router_w, gu_w, gu_s, gu_z, dn_w, dn_s, dn_z, rope_inv,
        # scratch
        x_ptr, h_ptr, xn_ptr, proj_ptr, attn_ptr, qlat_ptr, qrope_ptr, pm_ptr, pl_ptr, pacc_ptr, olat_ptr,
        logits_ptr, rid_ptr, rw_ptr, act_ptr, xpriv_ptr, sync_ptr,
        # the attention split, the phases this launch runs, scalars
        n_chunks, chunk, first, last, scaling, eps,
        D: tl.constexpr, H: tl.constexpr, DK: tl.constexpr, HM: tl.constexpr, NOPE: tl.constexpr,
        ROPE: tl.constexpr, VH: tl.constexpr, KVL: tl.constexpr, E: tl.constexpr, A: tl.constexpr,
        NSH: tl.constexpr, I: tl.constexpr, GROUP: tl.constexpr, N_LAYERS: tl.constexpr, MLA_LAYER: tl.constexpr,
        BN_IN: tl.constexpr, KB_IN: tl.constexpr, BN_QA: tl.constexpr, KB_QA: tl.constexpr, BN_GU: tl.constexpr,
        KB_GU: tl.constexpr, BN_OUT: tl.constexpr, KB_OUT: tl.constexpr, BN_DN: tl.constexpr, KB_DN: tl.constexpr,
        KB_V: tl.constexpr, XP: tl.constexpr, BV: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr,
        SB: tl.constexpr, WB: tl.constexpr, HB: tl.constexpr, BT: tl.constexpr, CP: tl.constexpr, CB: tl.constexpr,
        EB: tl.constexpr, EP: tl.constexpr, SP: tl.constexpr, DOT_BF16: tl.constexpr, GRID_SYNC: tl.constexpr,
        SPIN: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    xp_ptr = xpriv_ptr + pid * XP  # this program's private copy of the current GEMV's input
    HK: tl.constexpr = H * DK
    QA_N: tl.constexpr = HM * (NOPE + ROPE) + KVL + ROPE
    SLOTS: tl.constexpr = A + NSH
    # elements per layer of the packed expert weights (int32 offsets: < 2**31 for the real unit's four layers)
    GU_LAYER: tl.constexpr = (E + NSH) * (D // 2) * (2 * I)
    GU_LAYER_S: tl.constexpr = (E + NSH) * (D // GROUP) * (2 * I)
    DN_LAYER: tl.constexpr = (E + NSH) * (I // 2) * D
    DN_LAYER_S: tl.constexpr = (E + NSH) * (I // GROUP) * D
    base = 0
    if GRID_SYNC:
        base = tl.atomic_add(sync_ptr + 1, 0, sem="acquire", scope="gpu")  # the arrivals before this step
    ph = 0
    if (ph >= first) & (ph <= last):
        _prologue(pid, nprog, hidden_ptr, x_ptr, n_copy, src_c, src_r, src_c_stride, src_r_stride, cache_c, cache_r,
                  D, KVL, ROPE, BD, BR)
    ph = _phase_end(ph, first, last, sync_ptr, base, nprog, SPIN) if GRID_SYNC else ph + 1
    for layer in range(N_LAYERS):
        kda = tl.minimum(tl.where(layer > MLA_LAYER, layer - 1, layer), 2)  # its index among the KDA layers
        if layer == MLA_LAYER:
            if (ph >= first) & (ph <= last):
                _in_proj(pid, nprog, x_ptr, attn_norm + layer * D, qa_w, qa_s, qa_z, proj_ptr, xn_ptr, xp_ptr, eps,
                         D, QA_N, GROUP, BN_QA, KB_QA, BD)
            ph = _phase_end(ph, first, last, sync_ptr, base, nprog, SPIN) if GRID_SYNC else ph + 1
            if (ph >= first) & (ph <= last):
                _mla_absorb(pid, nprog, proj_ptr, rope_inv, kvb_w, kvb_s, kvb_z, qlat_ptr, qrope_ptr, cache_c,
                            cache_r, pos, HM, NOPE, ROPE, VH, KVL, GROUP, WB)
            ph = _phase_end(ph, first, last, sync_ptr, base, nprog, SPIN) if GRID_SYNC else ph + 1
            if (ph >= first) & (ph <= last):
                _mla_attend(pid, nprog, qlat_ptr, qrope_ptr, cache_c, cache_r, pm_ptr, pl_ptr, pacc_ptr, pos + 1,
                            n_chunks, chunk, HM, KVL, ROPE, HB, BT, DOT_BF16)
            ph = _phase_end(ph, first, last, sync_ptr, base, nprog, SPIN) if GRID_SYNC else ph + 1
            if (ph >= first) & (ph <= last):
                _mla_combine(pid, nprog, pm_ptr, pl_ptr, pacc_ptr, olat_ptr, kvb_w, kvb_s, kvb_z, attn_ptr, xp_ptr,
                             n_chunks, HM, KVL, NOPE, VH, GROUP, CP, CB, KB_V)
            ph = _phase_end(ph, first, last, sync_ptr, base, nprog, SPIN) if GRID_SYNC else ph + 1
        else:
            if (ph >= first) & (ph <= last):
                _in_proj(pid, nprog, x_ptr, attn_norm + layer * D, qkvg_w + kda * ((D // 2) * (4 * HK)),
                         qkvg_s + kda * ((D // GROUP) * (4 * HK)), qkvg_z + kda * ((D // GROUP) * (4 * HK)), proj_ptr,
                         xn_ptr, xp_ptr, eps, D, 4 * HK, GROUP, BN_IN, KB_IN, BD)
            ph = _phase_end(ph, first, last, sync_ptr, base, nprog, SPIN) if GRID_SYNC else ph + 1
            if (ph >= first) & (ph <= last):
                _kda_recur(pid, nprog, proj_ptr, xn_ptr, beta_w + kda * (H * D), conv_w + kda * (3 * HK * 4),
                           _pick3(kda, cq0, cq1, cq2), _pick3(kda, ck0, ck1, ck2), _pick3(kda, cv0, cv1, cv2),
                           _pick3(kda, S0, S1, S2), attn_ptr, H, D, DK, BV, BD)
            ph = _phase_end(ph, first, last, sync_ptr, base, nprog, SPIN) if GRID_SYNC else ph + 1
        if (ph >= first) & (ph <= last):
            _out_proj(pid, nprog, attn_ptr, o_w + layer * ((HK // 2) * D), o_s + layer * ((HK // GROUP) * D),
                      o_z + layer * ((HK // GROUP) * D), x_ptr, h_ptr, xp_ptr, layer != MLA_LAYER, proj_ptr,
                      _pick3(kda, cq0, cq1, cq2), _pick3(kda, ck0, ck1, ck2), _pick3(kda, cv0, cv1, cv2),
                      HK, D, HK, GROUP, BN_OUT, KB_OUT, BD, SB)
        ph = _phase_end(ph, first, last, sync_ptr, base, nprog, SPIN) if GRID_SYNC else ph + 1
        if (ph >= first) & (ph <= last):
            _moe_router(pid, nprog, h_ptr, moe_norm + layer * D, router_w + layer * E * D, logits_ptr,
                        gu_w + layer * GU_LAYER, gu_s + layer * GU_LAYER_S, gu_z + layer * GU_LAYER_S, act_ptr, xp_ptr,
                        eps, D, E, I, A, NSH, GROUP, EB, BN_GU, KB_GU, BD)
        ph = _phase_end(ph, first, last, sync_ptr, base, nprog, SPIN) if GRID_SYNC else ph + 1
        if (ph >= first) & (ph <= last):
            _moe_gate_up(pid, nprog, h_ptr, moe_norm + layer * D, logits_ptr, gu_w + layer * GU_LAYER,
                         gu_s + layer * GU_LAYER_S, gu_z + layer * GU_LAYER_S, act_ptr, rid_ptr, rw_ptr, xp_ptr,
                         scaling, eps, D, I, E, A, SLOTS, EP, SP, GROUP, BN_GU, KB_GU, BD)
        ph = _phase_end(ph, first, last, sync_ptr, base, nprog, SPIN) if GRID_SYNC else ph + 1
        if (ph >= first) & (ph <= last):
            _moe_down(pid, nprog, act_ptr, rid_ptr, rw_ptr, dn_w + layer * DN_LAYER, dn_s + layer * DN_LAYER_S,
                      dn_z + layer * DN_LAYER_S, h_ptr, x_ptr, out_ptr, xp_ptr, layer == N_LAYERS - 1, D, I, SLOTS, GROUP,
                      BN_DN, KB_DN, BD)
        ph = _phase_end(ph, first, last, sync_ptr, base, nprog, SPIN) if GRID_SYNC else ph + 1
    if GRID_SYNC:
        if pid == 0:  # every program read the base before the first barrier, which all have passed
            tl.atomic_add(sync_ptr + 1, (last - first) * nprog, sem="relaxed", scope="gpu")


# ===== the model: the reference's parameter names, packed views, the launch =========================
class W4(nn.Module):
    """The W4A16 buffers of one (in, out) weight, or `experts` of them (names as the reference's)."""

    def __init__(self, n_in: int, n_out: int, group: int, experts: int | None = None):
        super().__init__()
        lead = (experts,) if experts else ()
        self.register_buffer("w_q", torch.empty(*lead, n_in // 2, n_out, dtype=torch.uint8))
        self.register_buffer("scales", torch.empty(*lead, n_in // group, n_out, dtype=torch.bfloat16))
        self.register_buffer("zeros", torch.empty(*lead, n_in // group, n_out, dtype=torch.bfloat16))


class _Linear(nn.Module):
    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in, dtype=torch.bfloat16), requires_grad=False)


class KDA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, hk = cfg.hidden, cfg.kda_heads * cfg.kda_head_dim
        self.q_proj, self.k_proj, self.v_proj, self.g_proj = (W4(d, hk, cfg.group) for _ in range(4))
        self.o_proj = W4(hk, d, cfg.group)
        self.beta_proj = _Linear(d, cfg.kda_heads)
        self.conv_w = nn.Parameter(torch.empty(3, hk, cfg.short_conv, dtype=torch.bfloat16), requires_grad=False)


class MLA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, h = cfg.hidden, cfg.mla_heads
        self.q_proj = W4(d, h * (cfg.qk_nope + cfg.qk_rope), cfg.group)
        self.kv_a = W4(d, cfg.kv_lora + cfg.qk_rope, cfg.group)
        self.kv_b = W4(cfg.kv_lora, h * (cfg.qk_nope + cfg.v_head), cfg.group)
        self.o_proj = W4(h * cfg.v_head, d, cfg.group)


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, i, e, s = cfg.hidden, cfg.moe_inter, cfg.n_experts, cfg.n_shared
        self.router = _Linear(d, e)
        self.gate, self.up, self.down = W4(d, i, cfg.group, e), W4(d, i, cfg.group, e), W4(i, d, cfg.group, e)
        self.s_gate, self.s_up, self.s_down = W4(d, i, cfg.group, s), W4(d, i, cfg.group, s), W4(i, d, cfg.group, s)


class Block(nn.Module):
    def __init__(self, cfg, kind: str):
        super().__init__()
        self.attn_norm = nn.Parameter(torch.empty(cfg.hidden, dtype=torch.bfloat16), requires_grad=False)
        self.moe_norm = nn.Parameter(torch.empty(cfg.hidden, dtype=torch.bfloat16), requires_grad=False)
        self.attn = KDA(cfg) if kind == "K" else MLA(cfg)
        self.moe = MoE(cfg)


def _share(module: nn.Module, name: str, view: torch.Tensor) -> None:
    """Point a parameter or buffer at `view`, a slice of a packed tensor that holds its values: the
    packed copy becomes the only copy, and load_state_dict writes through to it."""
    if name in module._parameters:
        module._parameters[name] = nn.Parameter(view, requires_grad=False)
    else:
        module._buffers[name] = view


class Tiles:
    """Tile sizes and the grid: the GPU's, and for Triton's interpreter fewer, bigger programs. A GEMV
    item covers BN columns; each of its iterations KB packed bytes of every column (BN * KB ~ 16 KB on
    the GPU: with the next iteration's bytes loaded before these are used, ~32 KB in flight per SM)."""

    def __init__(self, interpret: bool, n_sms: int):
        self.PROGRAMS = 2 if interpret else n_sms  # the interpreter still runs more than one program
        self.NUM_WARPS = 8
        self.BN_IN, self.KB_IN = (1024, 128) if interpret else (128, 128)  # KDA q|k|v|g: 128 items
        self.BN_QA, self.KB_QA = (1024, 128) if interpret else (64, 256)  # MLA q|kv_a: 105 items
        self.BN_GU, self.KB_GU = (256, 128) if interpret else (128, 128)  # gate|up interleaved: 8 x 16 items
        self.BN_OUT, self.KB_OUT = (256, 128) if interpret else (32, 512)  # o_proj: 72 items
        self.BN_DN, self.KB_DN = (256, 64) if interpret else (32, 512)  # down over all slots: 72 items
        self.KB_V = 64 if interpret else 128  # kv_b's value half, per head
        self.BV = 128 if interpret else 32  # KDA value columns per item
        self.BD = 256  # vector chunk (norms, staging, beta, router)
        self.BR = 64 if interpret else 16  # cache rows per copy item
        self.SB = 256 if interpret else 1024  # conv-window channels per shift item
        self.WB = 8  # absorb: kv_b words per column per iteration
        self.HB = 16  # MLA heads per attention item (tl.dot wants >= 16 rows)
        self.BT = 64 if interpret else 32  # cached positions per attention iteration
        self.CB = 4 if interpret else 8  # chunks merged per combine iteration
        self.EB = 8  # router: experts per item
        self.DOT_BF16 = not interpret  # the interpreter's bf16 tl.dot is wrong (Triton 3.9): fp32 there


class _Step:
    """One prepared step: its launch arguments, and `run(first, last, grid_sync)` to launch phases."""

    def __init__(self, kernel_args: list, constexprs: dict, grid: int, num_warps: int, out: torch.Tensor,
                 state: list[dict[str, torch.Tensor]]):
        self.args, self.constexprs, self.grid, self.num_warps = kernel_args, constexprs, grid, num_warps
        self.out, self.state = out, state
        self.first_index = len(kernel_args) - 4  # [..., first, last, scaling, eps]

    def run(self, first: int, last: int, grid_sync: bool) -> None:
        args = list(self.args)
        args[self.first_index:self.first_index + 2] = [first, last]
        extra = {"launch_cooperative_grid": True} if grid_sync else {}
        _decode_step_kernel[(self.grid,)](*args, **self.constexprs, GRID_SYNC=grid_sync, SPIN=SPIN_LIMIT,
                                          num_warps=self.num_warps, **extra)


class Model(nn.Module):
    """One repeating unit; `step` decodes one token in one kernel launch."""

    def __init__(self, cfg):
        super().__init__()
        if tuple(cfg.pattern) != ("K", "K", "K", "M"):
            raise ValueError(f"this solution runs the pattern ('K', 'K', 'K', 'M'), not {cfg.pattern}")
        if cfg.short_conv != 4 or cfg.kda_heads * cfg.kda_head_dim != cfg.mla_heads * cfg.v_head:
            raise ValueError("this solution wants short_conv 4 and equal KDA and MLA attention widths")
        gemv_in = (cfg.hidden, cfg.kda_heads * cfg.kda_head_dim, cfg.kv_lora, cfg.moe_inter)
        if cfg.group % 8 or any(k % 32 or k % cfg.group for k in gemv_in):
            raise ValueError(f"this solution wants every GEMV's input width {gemv_in} a multiple of 32 and of "
                             f"the quantization group {cfg.group} (a multiple of 8)")
        self.cfg = cfg
        self.blocks = nn.ModuleList(Block(cfg, kind) for kind in cfg.pattern)
        self._device: torch.device | None = None  # where the packed weights and scratch live
        self._cache: tuple[torch.Tensor, torch.Tensor] | None = None  # MLA latent / rope-key capacity buffers
        self.tile_overrides: dict[str, int] = {}  # Tiles attributes to change before the first step (tuning)

    @property
    def phase_names(self) -> list[str]:
        """The kernel's phases in order (a grid barrier between consecutive ones)."""
        names = ["prologue"]
        for li, kind in enumerate(self.cfg.pattern):
            names += [f"{li}.{n}" for n in (KDA_PHASES if kind == "K" else MLA_PHASES) + MOE_PHASES]
        return names

    def barrier_timeouts(self) -> int:
        """Barriers that gave up waiting since the model was prepared (0 unless the grid was not co-resident)."""
        return 0 if self._device is None else int(self._sync[2])

    # -- one-time preparation on the step's device --------------------------------------------------
    def _prepare(self, device: torch.device) -> None:
        """Pack the weights per kind (q|k|v|g side by side, q_proj|kv_a side by side, gate|up side by
        side with the shared experts after the routed ones, every per-layer tensor stacked over its
        layers), point the reference-named tensors at the packed slices, allocate the scratch."""
        cfg = self.cfg
        kda = [b.attn for b in self.blocks[:3]]
        mla = self.blocks[3].attn
        moes = [b.moe for b in self.blocks]
        if self.blocks[0].attn_norm.device != device:
            raise RuntimeError(f"the model's weights are on {self.blocks[0].attn_norm.device}, the hidden on {device}")
        p: dict[str, torch.Tensor] = {}
        for key in ("w_q", "scales", "zeros"):
            def t(m: nn.Module) -> torch.Tensor:
                return getattr(m, key)

            def colmajor(x: torch.Tensor) -> torch.Tensor:  # (..., rows, cols) -> (..., cols, rows)
                return x.transpose(-1, -2).contiguous()

            p[f"qkvg_{key}"] = colmajor(torch.stack([torch.cat([t(a.q_proj), t(a.k_proj), t(a.v_proj), t(a.g_proj)], -1)
                                                     for a in kda]))
            p[f"qa_{key}"] = colmajor(torch.cat([t(mla.q_proj), t(mla.kv_a)], -1))
            p[f"kvb_{key}"] = colmajor(t(mla.kv_b))
            p[f"o_{key}"] = colmajor(torch.stack([t(b.attn.o_proj) for b in self.blocks]))
            p[f"gu_{key}"] = colmajor(torch.stack([torch.cat([torch.cat([t(m.gate), t(m.up)], -1),
                                                              torch.cat([t(m.s_gate), t(m.s_up)], -1)]) for m in moes]))
            p[f"dn_{key}"] = colmajor(torch.stack([torch.cat([t(m.down), t(m.s_down)]) for m in moes]))
        p["beta"] = torch.stack([a.beta_proj.weight for a in kda])
        p["conv"] = torch.stack([a.conv_w for a in kda])
        p["router"] = torch.stack([m.router.weight for m in moes])
        p["attn_norm"] = torch.stack([b.attn_norm for b in self.blocks])
        p["moe_norm"] = torch.stack([b.moe_norm for b in self.blocks])
        self._repoint(p)
        half = cfg.qk_rope // 2
        p["rope_inv"] = cfg.rope_theta ** (-torch.arange(0, half, dtype=torch.float64, device=device) * 2 / cfg.qk_rope)
        self._p = p
        self._init_launch(device)
        self._s = self._scratch(device)
        self._sync = torch.zeros(4, dtype=torch.int64, device=device)  # arrivals, arrivals before this step, timeouts
        sc = self._s
        self._static_args = [  # the kernel's arguments that never change: packed weights, scratch
            p["attn_norm"], p["moe_norm"], p["qkvg_w_q"], p["qkvg_scales"], p["qkvg_zeros"], p["beta"], p["conv"],
            p["qa_w_q"], p["qa_scales"], p["qa_zeros"], p["kvb_w_q"], p["kvb_scales"], p["kvb_zeros"],
            p["o_w_q"], p["o_scales"], p["o_zeros"], p["router"], p["gu_w_q"], p["gu_scales"], p["gu_zeros"],
            p["dn_w_q"], p["dn_scales"], p["dn_zeros"], p["rope_inv"],
            *(sc[k] for k in ("x", "h", "xn", "proj", "attn", "qlat", "qrope", "pm", "pl", "pacc", "olat", "logits",
                              "rid", "rw", "act", "xpriv")), self._sync]
        self._scaling = float(cfg.routed_scaling)
        self._device = device

    def _init_launch(self, device: torch.device) -> None:
        cfg = self.cfg
        n_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
        self.tiles = t = Tiles(INTERPRET, n_sms)
        for key, value in self.tile_overrides.items():
            if not hasattr(t, key):
                raise ValueError(f"no tile setting {key!r}; they are {sorted(vars(t))}")
            setattr(t, key, value)
        self.n_phases = len(self.phase_names)
        hk, slots_i = cfg.kda_heads * cfg.kda_head_dim, (cfg.n_active + cfg.n_shared) * cfg.moe_inter
        self.xp = max(cfg.hidden, hk, cfg.kv_lora, slots_i)  # a program's private GEMV input row
        self.nc_max = max(1, t.PROGRAMS // triton.cdiv(cfg.mla_heads, t.HB)) if not INTERPRET else 4
        slots = cfg.n_active + cfg.n_shared
        self._constexprs = dict(
            D=cfg.hidden, H=cfg.kda_heads, DK=cfg.kda_head_dim, HM=cfg.mla_heads, NOPE=cfg.qk_nope, ROPE=cfg.qk_rope,
            VH=cfg.v_head, KVL=cfg.kv_lora, E=cfg.n_experts, A=cfg.n_active, NSH=cfg.n_shared, I=cfg.moe_inter,
            GROUP=cfg.group, N_LAYERS=len(cfg.pattern), MLA_LAYER=list(cfg.pattern).index("M"),
            BN_IN=t.BN_IN, KB_IN=t.KB_IN, BN_QA=t.BN_QA, KB_QA=t.KB_QA, BN_GU=t.BN_GU, KB_GU=t.KB_GU,
            BN_OUT=t.BN_OUT, KB_OUT=t.KB_OUT, BN_DN=t.BN_DN, KB_DN=t.KB_DN, KB_V=t.KB_V, XP=self.xp, BV=t.BV, BD=t.BD,
            BR=t.BR, SB=t.SB, WB=t.WB, HB=t.HB, BT=t.BT,
            CP=triton.next_power_of_2(self.nc_max), CB=t.CB, EB=t.EB, EP=triton.next_power_of_2(cfg.n_experts),
            SP=triton.next_power_of_2(slots), DOT_BF16=t.DOT_BF16)

    def _repoint(self, p: dict[str, torch.Tensor]) -> None:
        """Every reference-named tensor becomes a view of its slice of the packed tensors (one copy of
        the weights; W4 slices are column-major, so the views are transposed back to (rows, cols))."""
        cfg = self.cfg
        hk, i, e = cfg.kda_heads * cfg.kda_head_dim, cfg.moe_inter, cfg.n_experts
        mla = self.blocks[3].attn
        qn = mla.q_proj.w_q.shape[-1]

        def rows_cols(x: torch.Tensor) -> torch.Tensor:
            return x.transpose(-1, -2)

        for key in ("w_q", "scales", "zeros"):
            for li, b in enumerate(self.blocks[:3]):
                for c, n in enumerate(("q_proj", "k_proj", "v_proj", "g_proj")):
                    _share(getattr(b.attn, n), key, rows_cols(p[f"qkvg_{key}"][li].narrow(-2, c * hk, hk)))
            qa = p[f"qa_{key}"]
            _share(mla.q_proj, key, rows_cols(qa.narrow(-2, 0, qn)))
            _share(mla.kv_a, key, rows_cols(qa.narrow(-2, qn, qa.shape[-2] - qn)))
            _share(mla.kv_b, key, rows_cols(p[f"kvb_{key}"]))
            for li, b in enumerate(self.blocks):
                _share(b.attn.o_proj, key, rows_cols(p[f"o_{key}"][li]))
                m, gu, dn = b.moe, p[f"gu_{key}"][li], p[f"dn_{key}"][li]
                _share(m.gate, key, rows_cols(gu[:e].narrow(-2, 0, i)))
                _share(m.up, key, rows_cols(gu[:e].narrow(-2, i, i)))
                _share(m.s_gate, key, rows_cols(gu[e:].narrow(-2, 0, i)))
                _share(m.s_up, key, rows_cols(gu[e:].narrow(-2, i, i)))
                _share(m.down, key, rows_cols(dn[:e]))
                _share(m.s_down, key, rows_cols(dn[e:]))
        for li, b in enumerate(self.blocks):
            _share(b, "attn_norm", p["attn_norm"][li])
            _share(b, "moe_norm", p["moe_norm"][li])
            _share(b.moe.router, "weight", p["router"][li])
            if li < 3:
                _share(b.attn.beta_proj, "weight", p["beta"][li])
                _share(b.attn, "conv_w", p["conv"][li])

    def _scratch(self, device: torch.device) -> dict[str, torch.Tensor]:
        cfg, t = self.cfg, self.tiles
        d, hk, hm, kvl = cfg.hidden, cfg.kda_heads * cfg.kda_head_dim, cfg.mla_heads, cfg.kv_lora
        slots = cfg.n_active + cfg.n_shared
        qa_n = hm * (cfg.qk_nope + cfg.qk_rope) + kvl + cfg.qk_rope

        def f32(*shape: int) -> torch.Tensor:
            return torch.empty(*shape, dtype=torch.float32, device=device)

        return {"x": f32(d), "h": f32(d), "xn": f32(d), "proj": f32(max(4 * hk, qa_n)), "attn": f32(hk),
                "qlat": f32(hm * kvl), "qrope": f32(hm * cfg.qk_rope), "pm": f32(self.nc_max * hm),
                "pl": f32(self.nc_max * hm), "pacc": f32(self.nc_max * hm * kvl), "olat": f32(hm * kvl),
                "logits": f32(cfg.n_experts), "rid": torch.empty(slots, dtype=torch.int32, device=device),
                "rw": f32(slots), "act": f32(slots * cfg.moe_inter), "xpriv": f32(t.PROGRAMS, self.xp)}

    def _mla_cache(self, c_kv: torch.Tensor, k_rope: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor]:
        """(latent buffer, rope-key buffer, rows to copy in, copy sources). The model's own views are
        used where they are (rows to copy: 0; the new row is appended in place); anything else is
        copied in by the kernel's prologue, into a fresh buffer when the fed tensors live in the
        current one or it is too small."""
        n = c_kv.shape[0]
        buf = self._cache
        if buf is not None and c_kv.data_ptr() == buf[0].data_ptr() and k_rope.data_ptr() == buf[1].data_ptr() \
                and c_kv.stride() == buf[0].stride() and k_rope.stride() == buf[1].stride() and n < buf[0].shape[0]:
            return buf[0], buf[1], 0, buf[0], buf[1]
        aliased = buf is not None and (c_kv.untyped_storage().data_ptr() == buf[0].untyped_storage().data_ptr()
                                       or k_rope.untyped_storage().data_ptr() == buf[1].untyped_storage().data_ptr())
        if buf is None or aliased or buf[0].shape[0] <= n or buf[0].device != c_kv.device:
            cap = n + 1 + max(256, n // 4)
            buf = (torch.empty(cap, c_kv.shape[1], dtype=c_kv.dtype, device=c_kv.device),
                   torch.empty(cap, k_rope.shape[1], dtype=k_rope.dtype, device=k_rope.device))
        self._cache = buf
        src_c = c_kv if c_kv.stride(-1) == 1 else c_kv.contiguous()
        src_r = k_rope if k_rope.stride(-1) == 1 else k_rope.contiguous()
        return buf[0], buf[1], n, src_c, src_r

    # -- the step ----------------------------------------------------------------------------------
    def prepare_step(self, hidden: torch.Tensor, state: list[dict[str, torch.Tensor]]) -> _Step:
        """Everything a step launches with (nothing launched): the output and new state it will write.
        (Kept lean: the harness's clock runs while the host prepares the launch.)"""
        if self._device != hidden.device:
            self._prepare(hidden.device)
        t = self.tiles
        kda = [[st[k] if st[k].is_contiguous() else st[k].contiguous() for k in ("S", "cq", "ck", "cv")]
               for st in state[:3]]
        c_kv = state[3]["c_kv"]
        pos = c_kv.shape[0]
        cache_c, cache_r, n_copy, src_c, src_r = self._mla_cache(c_kv, state[3]["k_rope"])
        n_pos = pos + 1
        n_chunks = min(-(-n_pos // t.BT), self.nc_max)
        chunk = -(-(-(-n_pos // n_chunks)) // t.BT) * t.BT
        n_chunks = -(-n_pos // chunk)
        out = torch.empty(self.cfg.hidden, dtype=hidden.dtype, device=hidden.device)
        args = [hidden, out, kda[0][0], kda[1][0], kda[2][0], *kda[0][1:], *kda[1][1:], *kda[2][1:],
                cache_c, cache_r, src_c, src_r, pos, n_copy, src_c.stride(0), src_r.stride(0),
                *self._static_args, n_chunks, chunk, 0, 0, self._scaling, EPS]  # first, last: set per launch
        new_state = [{"S": k[0], "cq": k[1], "ck": k[2], "cv": k[3]} for k in kda]
        new_state.append({"c_kv": cache_c[:n_pos], "k_rope": cache_r[:n_pos]})
        return _Step(args, self._constexprs, t.PROGRAMS, t.NUM_WARPS, out, new_state)

    @torch.no_grad()
    def step(self, hidden: torch.Tensor, state: list[dict[str, torch.Tensor]]
             ) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        run = self.prepare_step(hidden, state)
        if INTERPRET:  # programs run one after another: one launch per phase, no barrier
            for ph in range(self.n_phases):
                run.run(ph, ph, grid_sync=False)
        else:
            run.run(0, self.n_phases - 1, grid_sync=True)
        return run.out, run.state
