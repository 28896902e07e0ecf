"""Top-k along the last dimension in Triton, ties to the lower index.

Floats are compared through a 32-bit key that orders like the floats (the sign bit flipped for
positives, every bit flipped for negatives; -0.0 is first made +0.0). Two paths:

- small rows and small k (a router): `_small_topk_kernel` holds a tile of rows in registers and
  takes the maximum k times, the lowest index among equal maxima each time;
- otherwise, a radix select: `_radix_select_kernel` finds the k-th largest key one byte at a time
  (four histogram passes over the row, each counting only the elements that match the bytes
  fixed so far), then writes the indices of the elements above it plus the first ones equal to
  it, in index order; `_sort_selected_kernel` orders those k by (key descending, index
  ascending), packed into one 64-bit key each: for k up to RANK_K each one's place is the count
  of keys above it (one comparison matrix), for larger k a bitonic sort (tl.sort).
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

SMALL_N, SMALL_K = 2048, 16  # the register-tile path
RANK_K = 128  # up to this many selected, order them by counting (above: a bitonic sort)


@triton.jit
def _small_topk_kernel(x_ptr, vals_ptr, idx_ptr, rows, n, k, stride_x,
                       ROWS: tl.constexpr, N_BLOCK: tl.constexpr, K_BLOCK: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, N_BLOCK)
    row_ok = r < rows
    alive = row_ok[:, None] & (c[None, :] < n)
    x = tl.load(x_ptr + r.to(tl.int64)[:, None] * stride_x + c[None, :], mask=alive, other=0.0)
    slots = tl.arange(0, K_BLOCK)
    picked = tl.zeros([ROWS, K_BLOCK], tl.int32)
    for j in range(0, k):
        best = tl.max(tl.where(alive, x, -float("inf")), axis=1)
        hit = alive & (x == best[:, None])
        first = tl.min(tl.where(hit, c[None, :], N_BLOCK), axis=1)
        picked = tl.where(slots[None, :] == j, first[:, None], picked)
        alive = alive & (c[None, :] != first[:, None])
    out_ok = row_ok[:, None] & (slots[None, :] < k)
    values = tl.load(x_ptr + r.to(tl.int64)[:, None] * stride_x + picked, mask=out_ok, other=0.0)
    tl.store(vals_ptr + r[:, None] * k + slots[None, :], values, mask=out_ok)
    tl.store(idx_ptr + r[:, None] * k + slots[None, :], picked.to(tl.int64), mask=out_ok)


@triton.jit
def _radix_select_kernel(x_ptr, idx_ptr, n, k, stride_x, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    offs = tl.arange(0, BLOCK)
    bins = tl.arange(0, 256)
    prefix = tl.zeros([], tl.uint32)  # the bytes of the k-th largest key fixed so far
    fixed = tl.zeros([], tl.uint32)  # which bits those are
    remaining = k  # how many of the elements matching `prefix` still belong to the top k
    for byte in tl.static_range(4):
        shift = 24 - 8 * byte
        hist = tl.zeros([256], tl.int32)
        for base in range(0, n, BLOCK):
            in_row = base + offs < n
            bits = tl.load(x_row + base + offs, mask=in_row, other=0.0)
            bits = tl.where(bits == 0.0, 0.0, bits).to(tl.uint32, bitcast=True)
            key = tl.where((bits >> 31) != 0, ~bits, bits | 0x80000000)
            match = in_row & ((key & fixed) == prefix)
            digit = tl.where(match, (key >> shift) & 0xFF, 0).to(tl.int32)
            # elements that do not match were counted in bin 0: take them out again
            hist += tl.histogram(digit, 256) - tl.where(bins == 0, tl.sum((~match).to(tl.int32), axis=0), 0)
        # matching elements whose byte here is this bin's or a larger one
        at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
        chosen = tl.max(tl.where(at_or_above >= remaining, bins, -1), axis=0)
        remaining -= tl.sum(tl.where(bins == chosen, at_or_above - hist, 0), axis=0)
        prefix |= chosen.to(tl.uint32) << shift
        fixed |= tl.full([], 0xFF, tl.uint32) << shift
    # prefix is now the k-th largest key; take every larger element and the first `remaining` equal ones
    taken_equal = 0
    written = 0
    for base in range(0, n, BLOCK):
        in_row = base + offs < n
        bits = tl.load(x_row + base + offs, mask=in_row, other=0.0)
        bits = tl.where(bits == 0.0, 0.0, bits).to(tl.uint32, bitcast=True)
        key = tl.where((bits >> 31) != 0, ~bits, bits | 0x80000000)
        equal = in_row & (key == prefix)
        equal_rank = tl.cumsum(equal.to(tl.int32), axis=0) - 1 + taken_equal
        take = (in_row & (key > prefix)) | (equal & (equal_rank < remaining))
        slot = tl.cumsum(take.to(tl.int32), axis=0) - 1 + written
        tl.store(idx_ptr + row.to(tl.int64) * k + slot, (base + offs).to(tl.int64), mask=take)
        taken_equal += tl.sum(equal.to(tl.int32), axis=0)
        written += tl.sum(take.to(tl.int32), axis=0)


@triton.jit
def _sort_selected_kernel(x_ptr, vals_ptr, idx_ptr, k, stride_x, K_BLOCK: tl.constexpr, BY_RANK: tl.constexpr):
    row = tl.program_id(0)
    slots = tl.arange(0, K_BLOCK)
    ok = slots < k
    idx = tl.load(idx_ptr + row.to(tl.int64) * k + slots, mask=ok, other=0)
    x = tl.load(x_ptr + row.to(tl.int64) * stride_x + idx, mask=ok, other=0.0)
    bits = tl.where(x == 0.0, 0.0, x).to(tl.uint32, bitcast=True)
    key = tl.where((bits >> 31) != 0, ~bits, bits | 0x80000000)
    # key in the high word, the complement of the index in the low word: descending order is
    # value descending, then index ascending; empty slots (0) sort last
    packed = tl.where(ok, (key.to(tl.uint64) << 32) | (0xFFFFFFFF - idx).to(tl.uint64), 0)
    if BY_RANK:  # small k: each element's place is the number of elements ahead of it
        place = tl.sum((packed[None, :] > packed[:, None]).to(tl.int32), axis=1)
        tl.store(idx_ptr + row.to(tl.int64) * k + place, idx, mask=ok)
        tl.store(vals_ptr + row.to(tl.int64) * k + place, x, mask=ok)
    else:
        packed = tl.sort(packed, descending=True)
        idx = (0xFFFFFFFF - (packed & 0xFFFFFFFF)).to(tl.int64)
        tl.store(idx_ptr + row.to(tl.int64) * k + slots, idx, mask=ok)
        tl.store(vals_ptr + row.to(tl.int64) * k + slots,
                 tl.load(x_ptr + row.to(tl.int64) * stride_x + idx, mask=ok), mask=ok)


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    assert x.dtype == torch.float32 and 0 < k <= x.shape[-1]
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows, n = x.shape
    values = torch.empty((rows, k), dtype=x.dtype, device=x.device)
    indices = torch.empty((rows, k), dtype=torch.int64, device=x.device)
    if n <= SMALL_N and k <= SMALL_K:
        n_block = triton.next_power_of_2(n)
        per_program = max(1, min(16, 4096 // n_block))
        _small_topk_kernel[(triton.cdiv(rows, per_program),)](
            x, values, indices, rows, n, k, x.stride(0), ROWS=per_program, N_BLOCK=n_block,
            K_BLOCK=triton.next_power_of_2(k), num_warps=4)
    else:
        block = 4096 if x.is_cuda else 2048  # the interpreter: several blocks per row on small shapes
        _radix_select_kernel[(rows,)](x, indices, n, k, x.stride(0), BLOCK=block, num_warps=8)
        k_block = triton.next_power_of_2(k)
        _sort_selected_kernel[(rows,)](x, values, indices, k, x.stride(0), K_BLOCK=k_block, BY_RANK=k_block <= RANK_K,
                                       num_warps=4 if k_block <= RANK_K else max(1, min(8, k_block // 256)))
    return values.reshape(*shape[:-1], k), indices.reshape(*shape[:-1], k)


class ModelNew(nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return topk(x, self.k)
