"""gelu_tanh(x @ w + bias) in float16 (reference)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, K: int, N: int):
        super().__init__()
        self.weight = nn.Parameter((torch.randn(K, N) / K**0.5).to(torch.float16))
        self.bias = nn.Parameter((torch.randn(N) * 0.5).to(torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x @ self.weight + self.bias, approximate="tanh")


def get_inputs(M: int = 8192, N: int = 8192, K: int = 2048) -> list[torch.Tensor]:
    return [torch.randn(M, K).to(torch.float16)]


def get_init_inputs(M: int = 8192, N: int = 8192, K: int = 2048) -> list:
    return [K, N]
