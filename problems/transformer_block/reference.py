"""A pre-norm transformer decoder block (Llama 3 style), bfloat16 (reference):

    h   = x + Attention(RMSNorm(x))        grouped-query causal attention with rotary embedding
    out = h + MLP(RMSNorm(h))              SwiGLU: down(silu(gate(.)) * up(.))

RMSNorm: float32 math (eps 1e-5), a learned weight, bfloat16 out. Attention: q, k, v projections
(H query heads, KV key/value heads of size D = E / H), rotary embedding on q and k (rotate-half,
theta 500000, positions 0 .. S-1, float32 math from float32 cos/sin tables, bfloat16 out), causal
softmax(q k^T / sqrt(D)) v, output projection. No biases, no dropout; every sublayer's result is
rounded to bfloat16 as eager PyTorch runs it."""

import torch
import torch.nn as nn
from torch.nn.functional import linear, scaled_dot_product_attention, silu


def rope_tables(S: int, D: int, theta: float = 500000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos and sin of pos * theta^(-2i/D), shape [S, D/2] (computed in float64)."""
    inv_freq = theta ** (-torch.arange(0, D // 2, dtype=torch.float64) * 2 / D)
    angles = torch.arange(S, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().to(torch.float32), angles.sin().to(torch.float32)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [B, heads, S, D] with tables [S, D/2], in the tables' dtype."""
    a, b = x.to(cos.dtype).chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    acc = torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for the oracle
    xf = x.to(acc)
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.to(acc)).to(x.dtype)


class Model(nn.Module):
    def __init__(self, S: int, E: int, H: int, KV: int, F: int, eps: float = 1e-5):
        super().__init__()
        self.heads, self.kv_heads, self.eps, D = H, KV, eps, E // H
        # Norm weights not ones: a kernel that ignores them must fail.
        self.attn_norm = nn.Parameter(torch.empty(E).normal_(1.0, 0.2).to(torch.bfloat16))
        self.q = nn.Parameter((torch.randn(E, E) / E**0.5).to(torch.bfloat16))
        self.k = nn.Parameter((torch.randn(KV * D, E) / E**0.5).to(torch.bfloat16))
        self.v = nn.Parameter((torch.randn(KV * D, E) / E**0.5).to(torch.bfloat16))
        self.o = nn.Parameter((torch.randn(E, E) / E**0.5).to(torch.bfloat16))
        self.mlp_norm = nn.Parameter(torch.empty(E).normal_(1.0, 0.2).to(torch.bfloat16))
        self.gate = nn.Parameter((torch.randn(F, E) / E**0.5).to(torch.bfloat16))
        self.up = nn.Parameter((torch.randn(F, E) / E**0.5).to(torch.bfloat16))
        self.down = nn.Parameter((torch.randn(E, F) / F**0.5).to(torch.bfloat16))
        cos, sin = rope_tables(S, D)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        B, S, E = x.shape
        D = E // self.heads
        q = linear(x, self.q).view(B, S, self.heads, D).transpose(1, 2)
        k = linear(x, self.k).view(B, S, self.kv_heads, D).transpose(1, 2)
        v = linear(x, self.v).view(B, S, self.kv_heads, D).transpose(1, 2)
        q, k = rotate(q, self.cos, self.sin), rotate(k, self.cos, self.sin)
        o = scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return linear(o.transpose(1, 2).reshape(B, S, E), self.o)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return linear(silu(linear(x, self.gate)) * linear(x, self.up), self.down)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(rms_norm(x, self.attn_norm, self.eps))
        return h + self.mlp(rms_norm(h, self.mlp_norm, self.eps))


def get_inputs(B: int = 2, S: int = 4096, E: int = 2048, H: int = 32, KV: int = 8, F: int = 8192) -> list[torch.Tensor]:
    # Tokens of different magnitude (0.5x to 2x): the residual stream and the sublayers' outputs
    # are of the same order, so neither can be dropped.
    scale = torch.exp(torch.empty(B, S, 1).uniform_(-0.7, 0.7))
    return [(torch.randn(B, S, E) * scale).to(torch.bfloat16)]


def get_init_inputs(B: int = 2, S: int = 4096, E: int = 2048, H: int = 32, KV: int = 8, F: int = 8192) -> list:
    return [S, E, H, KV, F]
