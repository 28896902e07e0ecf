"""Paged-attention decode (reference): one new query token per sequence attends over that
sequence's keys and values, which live in a paged cache.

The caches hold fixed-size pages of PAGE tokens, `k_cache[page, slot, kv_head, :]`; a sequence's
i-th page is `block_table[seq, i]`, and only its first `seq_lens[seq]` tokens are real (the rest
of its last page, and the block table's entries past its last page, point at other data).
Grouped-query attention: query head h reads kv head h // (q_heads // kv_heads).

The naive way, as here: gather every sequence's pages into a padded [batch, pages * PAGE] run,
score all of it in float32, mask the positions past each length, softmax, weight the values.
"""

import torch
import torch.nn as nn

PAGE = 16


class Model(nn.Module):
    def __init__(self, q_heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        assert q_heads % kv_heads == 0, "query heads must be a multiple of kv heads"
        self.q_heads, self.kv_heads, self.scale = q_heads, kv_heads, head_dim ** -0.5

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                block_table: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32  # float64: the oracle
        batch, q_heads, head_dim = q.shape
        kv_heads, group = self.kv_heads, q_heads // self.kv_heads
        span = block_table.shape[1] * PAGE  # the longest a sequence can be
        k = k_cache[block_table].reshape(batch, span, kv_heads, head_dim).to(acc)
        v = v_cache[block_table].reshape(batch, span, kv_heads, head_dim).to(acc)
        qg = q.to(acc).reshape(batch, kv_heads, group, head_dim)
        scores = torch.einsum("bhgd,bthd->bhgt", qg, k) * self.scale
        valid = torch.arange(span, device=q.device) < seq_lens[:, None]  # [batch, span]
        scores = torch.where(valid[:, None, None, :], scores, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        out = torch.einsum("bhgt,bthd->bhgd", weights, v)
        return out.reshape(batch, q_heads, head_dim).to(q.dtype)


def sequence_pages_and_lengths(batch: int, pages: int, page_step: int) -> list[tuple[int, int]]:
    """The (pages, tokens) of each sequence, before the seed shuffles them over the batch:
    pages - page_step * i pages, its last page filled by 16 - (7 i mod 16) tokens, so the
    lengths spread over every remainder mod PAGE (a full last page included)."""
    out = []
    for i in range(batch):
        n = pages - page_step * i
        assert n >= 1, f"pages={pages}, page_step={page_step}: sequence {i} would have {n} pages"
        out.append((n, PAGE * n - (7 * i) % PAGE))
    return out


def get_inputs(batch: int = 64, q_heads: int = 32, kv_heads: int = 8, head_dim: int = 128,
               pages: int = 512, page_step: int = 8) -> list[torch.Tensor]:
    plan = sequence_pages_and_lengths(batch, pages, page_step)
    n_pages = sum(n for n, _ in plan)
    shuffle = torch.randperm(batch)  # which sequence of the plan sits in which batch row
    seq_pages = torch.tensor([n for n, _ in plan])[shuffle]
    seq_lens = torch.tensor([length for _, length in plan])[shuffle]
    # The pages of all sequences, dealt out in a random order: page ids are a permutation, so a
    # kernel that reads a sequence's pages as consecutive ids reads other sequences' data.
    order = torch.randperm(n_pages)
    first = torch.cumsum(seq_pages, 0) - seq_pages  # where each sequence's run of `order` starts
    slot = torch.arange(pages)
    owned = order[(first[:, None] + slot).clamp(max=n_pages - 1)]
    # Entries past a sequence's last page point at random pages (other sequences' data).
    block_table = torch.where(slot < seq_pages[:, None], owned, torch.randint(0, n_pages, (batch, pages)))
    # Queries of mixed sharpness: a temperature per (sequence, head) from 0.25 to 2.5.
    temperature = torch.empty(batch, q_heads, 1).uniform_(0.25, 2.5)
    q = (torch.randn(batch, q_heads, head_dim) * temperature).to(torch.bfloat16)
    k_cache = torch.randn(n_pages, PAGE, kv_heads, head_dim).to(torch.bfloat16)
    v_cache = torch.randn(n_pages, PAGE, kv_heads, head_dim).to(torch.bfloat16)
    return [q, k_cache, v_cache, block_table.to(torch.int32), seq_lens.to(torch.int32)]


def get_init_inputs(batch: int = 64, q_heads: int = 32, kv_heads: int = 8, head_dim: int = 128,
                    pages: int = 512, page_step: int = 8) -> list:
    return [q_heads, kv_heads, head_dim]
