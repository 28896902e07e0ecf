"""Grouped-query causal attention layer (Llama 3 style), bfloat16 (reference).

q, k and v projections (H query heads, KV key/value heads of size D = E / H; each KV head serves
H / KV query heads), rotary position embedding on q and k (rotate-half layout, theta 500000,
positions 0 .. S-1, computed in float32 from float32 cos/sin tables and rounded to bfloat16),
causal attention with softmax scale 1/sqrt(D), and the output projection. No biases, no dropout."""

import torch
import torch.nn as nn
from torch.nn.functional import linear, scaled_dot_product_attention


def rope_tables(S: int, D: int, theta: float = 500000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos and sin of pos * theta^(-2i/D), shape [S, D/2] (computed in float64)."""
    inv_freq = theta ** (-torch.arange(0, D // 2, dtype=torch.float64) * 2 / D)
    angles = torch.arange(S, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().to(torch.float32), angles.sin().to(torch.float32)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [B, heads, S, D] with tables [S, D/2], in the tables' dtype."""
    a, b = x.to(cos.dtype).chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)


class Model(nn.Module):
    def __init__(self, S: int, E: int, H: int, KV: int):
        super().__init__()
        self.heads, self.kv_heads, D = H, KV, E // H
        self.q = nn.Parameter((torch.randn(E, E) / E**0.5).to(torch.bfloat16))
        self.k = nn.Parameter((torch.randn(KV * D, E) / E**0.5).to(torch.bfloat16))
        self.v = nn.Parameter((torch.randn(KV * D, E) / E**0.5).to(torch.bfloat16))
        self.o = nn.Parameter((torch.randn(E, E) / E**0.5).to(torch.bfloat16))
        cos, sin = rope_tables(S, D)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, E = x.shape
        D = E // self.heads
        q = linear(x, self.q).view(B, S, self.heads, D).transpose(1, 2)
        k = linear(x, self.k).view(B, S, self.kv_heads, D).transpose(1, 2)
        v = linear(x, self.v).view(B, S, self.kv_heads, D).transpose(1, 2)
        q, k = rotate(q, self.cos, self.sin), rotate(k, self.cos, self.sin)
        o = scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # [B, H, S, D]
        return linear(o.transpose(1, 2).reshape(B, S, E), self.o)


def get_inputs(B: int = 1, S: int = 4096, E: int = 4096, H: int = 32, KV: int = 8) -> list[torch.Tensor]:
    # Tokens of different magnitude (0.5x to 2x): attention logits from nearly flat to peaked.
    scale = torch.exp(torch.empty(B, S, 1).uniform_(-0.7, 0.7))
    return [(torch.randn(B, S, E) * scale).to(torch.bfloat16)]


def get_init_inputs(B: int = 1, S: int = 4096, E: int = 4096, H: int = 32, KV: int = 8) -> list:
    return [S, E, H, KV]
