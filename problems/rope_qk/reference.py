"""Rotary position embedding applied to q and k, bfloat16 (reference).

Rotate-half (GPT-NeoX / Llama) layout: each head's D channels are two halves (a, b) that rotate as
pairs (a_i, b_i) by the angle pos * theta^(-2i/D), i < D/2. The angle tables (float32 cos and sin,
[P, D/2], theta 500000 as in Llama 3) are buffers; each token's position comes in `positions`.
The rotation is computed in float32 and rounded to bfloat16 once. Returns (q_rotated, k_rotated)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, D: int, P: int, theta: float = 500000.0):
        super().__init__()
        inv_freq = theta ** (-torch.arange(0, D // 2, dtype=torch.float64) * 2 / D)
        angles = torch.arange(P, dtype=torch.float64)[:, None] * inv_freq[None, :]
        self.register_buffer("cos", angles.cos().to(torch.float32))
        self.register_buffer("sin", angles.sin().to(torch.float32))

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos = self.cos[positions].unsqueeze(2)  # [B, S, 1, D/2]
        sin = self.sin[positions].unsqueeze(2)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        a, b = x.to(cos.dtype).chunk(2, dim=-1)
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)


def get_inputs(B: int = 8, S: int = 4096, Hq: int = 32, Hk: int = 8, D: int = 128, P: int = 8192) -> list[torch.Tensor]:
    # Tokens of different magnitude (0.2x to 5x); positions anywhere in the table, in any order
    # (a batch of sequences at different offsets).
    scale = torch.exp(torch.empty(B, S, 1, 1).uniform_(-1.6, 1.6))
    q = (torch.randn(B, S, Hq, D) * scale).to(torch.bfloat16)
    k = (torch.randn(B, S, Hk, D) * scale).to(torch.bfloat16)
    positions = torch.randint(0, P, (B, S))
    return [q, k, positions]


def get_init_inputs(B: int = 8, S: int = 4096, Hq: int = 32, Hk: int = 8, D: int = 128, P: int = 8192) -> list:
    return [D, P]
