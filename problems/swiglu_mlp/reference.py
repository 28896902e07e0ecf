"""SwiGLU MLP, bfloat16 (reference): down(silu(x @ Wg^T) * (x @ Wu^T)), as in Llama's MLP.
Each product, the SiLU and the gating multiply are rounded to bfloat16, as eager PyTorch runs them."""

import torch
import torch.nn as nn
from torch.nn.functional import linear, silu


class Model(nn.Module):
    def __init__(self, D: int, F: int):
        super().__init__()
        self.gate = nn.Parameter((torch.randn(F, D) / D**0.5).to(torch.bfloat16))
        self.up = nn.Parameter((torch.randn(F, D) / D**0.5).to(torch.bfloat16))
        self.down = nn.Parameter((torch.randn(D, F) / F**0.5).to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(silu(linear(x, self.gate)) * linear(x, self.up), self.down)


def get_inputs(T: int = 2048, D: int = 4096, F: int = 14336) -> list[torch.Tensor]:
    # Tokens of different magnitude (0.3x to 3x): SiLU is far from linear over that range.
    scale = torch.exp(torch.empty(T, 1).uniform_(-1.2, 1.2))
    return [(torch.randn(T, D) * scale).to(torch.bfloat16)]


def get_init_inputs(T: int = 2048, D: int = 4096, F: int = 14336) -> list:
    return [D, F]
