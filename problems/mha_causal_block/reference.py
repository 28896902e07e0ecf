"""Causal multi-head self-attention block, bfloat16 (reference): a fused QKV projection, causal
scaled-dot-product attention over H heads of size D = E / H (softmax scale 1/sqrt(D)), and the
output projection; no biases, no dropout (GPT-style attention without position embedding)."""

import torch
import torch.nn as nn
from torch.nn.functional import linear, scaled_dot_product_attention


class Model(nn.Module):
    def __init__(self, E: int, H: int):
        super().__init__()
        self.heads = H
        self.qkv = nn.Parameter((torch.randn(3 * E, E) / E**0.5).to(torch.bfloat16))  # rows: q, then k, then v
        self.out = nn.Parameter((torch.randn(E, E) / E**0.5).to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, E = x.shape
        qkv = linear(x, self.qkv).view(B, S, 3, self.heads, E // self.heads).permute(2, 0, 3, 1, 4)
        o = scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)  # [B, H, S, D]
        return linear(o.transpose(1, 2).reshape(B, S, E), self.out)


def get_inputs(B: int = 2, S: int = 4096, E: int = 2048, H: int = 16) -> list[torch.Tensor]:
    # Tokens of different magnitude (0.5x to 2x): attention logits from nearly flat to peaked.
    scale = torch.exp(torch.empty(B, S, 1).uniform_(-0.7, 0.7))
    return [(torch.randn(B, S, E) * scale).to(torch.bfloat16)]


def get_init_inputs(B: int = 2, S: int = 4096, E: int = 2048, H: int = 16) -> list:
    return [E, H]
