"""Multi-head latent attention (MLA) decode (reference): one new query token per sequence
attends over that sequence's latent cache, DeepSeek-V2/V3 style.

Each cached token stores one latent vector shared by all heads, `kv_cache[t] = [c_kv (kv_lora) |
k_pe (rope_dim)]`; the sequences' caches are packed back to back and sequence b owns rows
`cu_seqlens[b]:cu_seqlens[b + 1]`. Head h's key is [W_uk[h] c_kv | k_pe] and its value
W_uv[h] c_kv, where W_kv_b = [W_uk; W_uv] per head is the up-projection (`kv_b_proj`). The
query is [q_nope | q_pe] per head; the softmax scale is (nope_dim + rope_dim)^-0.5.

The naive way, as here: up-project every cached token to per-head keys and values (a
[tokens, heads * (nope_dim + v_dim)] product, in float32), then attend per sequence. Since
q_nope . (W_uk c) = (W_uk^T q_nope) . c and sum_t p_t W_uv c_t = W_uv sum_t p_t c_t, the
up-projection can be absorbed into the query and the output instead: the latent cache is then
read once, for all heads at once, and nothing per head per token is materialised.
`counted_forward` is that absorbed computation, what the FLOPs formula counts.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, heads: int, kv_lora: int, rope_dim: int, nope_dim: int, v_dim: int, max_len: int):
        super().__init__()
        self.heads, self.kv_lora, self.rope_dim, self.nope_dim, self.v_dim = heads, kv_lora, rope_dim, nope_dim, v_dim
        self.max_len = max_len  # the longest cache a sequence may have
        self.scale = (nope_dim + rope_dim) ** -0.5
        self.kv_b_proj = nn.Linear(kv_lora, heads * (nope_dim + v_dim), bias=False, dtype=torch.bfloat16)
        with torch.no_grad():
            self.kv_b_proj.weight.copy_(torch.randn(heads * (nope_dim + v_dim), kv_lora) * kv_lora ** -0.5)

    def forward(self, q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor,
                cu_seqlens: torch.Tensor) -> torch.Tensor:
        acc = torch.float64 if q_nope.dtype == torch.float64 else torch.float32
        batch = q_nope.shape[0]
        c_kv, k_pe = kv_cache[:, :self.kv_lora], kv_cache[:, self.kv_lora:]
        # Every cached token up-projected to every head's key and value.
        kv = F.linear(c_kv.to(acc), self.kv_b_proj.weight.to(acc)).view(-1, self.heads, self.nope_dim + self.v_dim)
        k_nope, v = kv[..., :self.nope_dim], kv[..., self.nope_dim:]
        pos = torch.arange(self.max_len, device=kv_cache.device)
        out = []
        for b in range(batch):
            valid = pos < cu_seqlens[b + 1] - cu_seqlens[b]
            rows = torch.where(valid, cu_seqlens[b] + pos, 0)  # this sequence's tokens, padded to max_len
            scores = (torch.einsum("hd,thd->ht", q_nope[b].to(acc), k_nope[rows])
                      + torch.einsum("hr,tr->ht", q_pe[b].to(acc), k_pe[rows].to(acc))) * self.scale
            weights = torch.softmax(torch.where(valid, scores, float("-inf")), dim=-1)
            out.append(torch.einsum("ht,thd->hd", weights, v[rows]))
        return torch.stack(out).to(q_nope.dtype)


def counted_forward(model: Model, q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor,
                    cu_seqlens: torch.Tensor) -> torch.Tensor:
    """The same attention with the up-projection absorbed (what the FLOPs formula counts): per
    head, q_nope through W_uk into the latent space, scores and the weighted sum over the latent
    cache itself (padded to max_len per sequence, masked), and the result through W_uv."""
    m = model
    w = m.kv_b_proj.weight.float().view(m.heads, m.nope_dim + m.v_dim, m.kv_lora)
    w_uk, w_uv = w[:, :m.nope_dim], w[:, m.nope_dim:]
    pos = torch.arange(m.max_len, device=kv_cache.device)
    valid = pos < (cu_seqlens[1:] - cu_seqlens[:-1])[:, None]  # [batch, max_len]
    rows = torch.where(valid, cu_seqlens[:-1, None] + pos, 0)
    latent = kv_cache.float()[rows]  # [batch, max_len, kv_lora + rope_dim]
    q_latent = torch.einsum("bhd,hdl->bhl", q_nope.float(), w_uk)
    scores = (torch.einsum("bhl,btl->bht", q_latent, latent[..., :m.kv_lora])
              + torch.einsum("bhr,btr->bht", q_pe.float(), latent[..., m.kv_lora:])) * m.scale
    weights = torch.softmax(torch.where(valid[:, None, :], scores, float("-inf")), dim=-1)
    out_latent = torch.einsum("bht,btl->bhl", weights, latent[..., :m.kv_lora])
    return torch.einsum("bhl,hdl->bhd", out_latent, w_uv).to(q_nope.dtype)


def cache_lengths(batch: int, max_len: int, len_step: int) -> list[int]:
    """The sequences' cache lengths before the seed shuffles them: max_len - len_step * i."""
    lengths = [max_len - len_step * i for i in range(batch)]
    assert lengths[-1] >= 1, f"max_len={max_len}, len_step={len_step}: a sequence would have {lengths[-1]} tokens"
    return lengths


def get_inputs(batch: int = 64, heads: int = 16, max_len: int = 4096, len_step: int = 50, kv_lora: int = 512,
               rope_dim: int = 64, nope_dim: int = 128, v_dim: int = 128) -> list[torch.Tensor]:
    lengths = torch.tensor(cache_lengths(batch, max_len, len_step))[torch.randperm(batch)]
    cu_seqlens = F.pad(torch.cumsum(lengths, 0), (1, 0))
    tokens = sum(cache_lengths(batch, max_len, len_step))
    # Queries of mixed sharpness: a temperature per (sequence, head) from 0.5 to 3.
    temperature = torch.empty(batch, heads, 1).uniform_(0.5, 3.0)
    q_nope = (torch.randn(batch, heads, nope_dim) * temperature).to(torch.bfloat16)
    q_pe = (torch.randn(batch, heads, rope_dim) * temperature).to(torch.bfloat16)
    kv_cache = torch.randn(tokens, kv_lora + rope_dim).to(torch.bfloat16)
    return [q_nope, q_pe, kv_cache, cu_seqlens.to(torch.int32)]


def get_init_inputs(batch: int = 64, heads: int = 16, max_len: int = 4096, len_step: int = 50, kv_lora: int = 512,
                    rope_dim: int = 64, nope_dim: int = 128, v_dim: int = 128) -> list:
    return [heads, kv_lora, rope_dim, nope_dim, v_dim, max_len]
