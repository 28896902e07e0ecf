"""3x3 convolution (stride 1, padding 1) with bias, bfloat16 NCHW (reference)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        # Scaled so that the output is O(1) for O(1) inputs; a bias that is not zero.
        self.weight = nn.Parameter((torch.randn(cout, cin, 3, 3) / (9 * cin) ** 0.5).to(torch.bfloat16))
        self.bias = nn.Parameter((torch.randn(cout) * 0.5).to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight, self.bias, stride=1, padding=1)


def get_inputs(batch: int = 64, cin: int = 256, cout: int = 256, height: int = 56, width: int = 56) -> list[torch.Tensor]:
    # Every (image, channel) plane has its own scale (e^-1 to e).
    scale = torch.exp(torch.empty(batch, cin, 1, 1).uniform_(-1.0, 1.0))
    return [torch.randn(batch, cin, height, width, dtype=torch.bfloat16).mul_(scale)]


def get_init_inputs(batch: int = 64, cin: int = 256, cout: int = 256, height: int = 56, width: int = 56) -> list:
    return [cin, cout]
