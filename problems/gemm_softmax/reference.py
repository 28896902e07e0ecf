"""softmax(x @ W^T) over each output row, bfloat16 (reference): an LM head's logits turned into
probabilities. The logits are rounded to bfloat16 (as eager PyTorch writes them); the softmax
is computed in float32 and its probabilities returned in bfloat16."""

import torch
import torch.nn as nn
from torch.nn.functional import linear


class Model(nn.Module):
    def __init__(self, K: int, N: int):
        super().__init__()
        self.weight = nn.Parameter((torch.randn(N, K) / K**0.5).to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(linear(x, self.weight), dim=-1)


def get_inputs(M: int = 4096, K: int = 4096, N: int = 32000) -> list[torch.Tensor]:
    # Rows of different temperature (logit scale 0.3 to 1.5): some nearly flat, some peaked.
    scale = torch.exp(torch.empty(M, 1).uniform_(-1.2, 0.4))
    return [(torch.randn(M, K) * scale).to(torch.bfloat16)]


def get_init_inputs(M: int = 4096, K: int = 4096, N: int = 32000) -> list:
    return [K, N]
