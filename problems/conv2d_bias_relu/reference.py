"""relu(conv2d(x, W, 3x3, padding 1) + bias) in float16, NCHW (reference)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, C_in: int, C_out: int):
        super().__init__()
        self.weight = nn.Parameter((torch.randn(C_out, C_in, 3, 3) / (9 * C_in) ** 0.5).to(torch.float16))
        self.bias = nn.Parameter((torch.randn(C_out) * 0.5).to(torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, self.weight, padding=1)
        return torch.relu(y + self.bias.view(1, -1, 1, 1))


def get_inputs(N: int = 32, C_in: int = 256, C_out: int = 256, H: int = 96, W: int = 96) -> list[torch.Tensor]:
    # Channels of different magnitude (0.25x to 4x): the bias matters more for some outputs than others.
    scale = torch.exp(torch.empty(N, C_in, 1, 1).uniform_(-1.4, 1.4))
    return [(torch.randn(N, C_in, H, W) * scale).to(torch.float16)]


def get_init_inputs(N: int = 32, C_in: int = 256, C_out: int = 256, H: int = 96, W: int = 96) -> list:
    return [C_in, C_out]
