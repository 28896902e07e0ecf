"""NCHW -> NHWC layout change of a bfloat16 tensor: a permute, materialised (reference)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 3, 1).contiguous()


def get_inputs(batch: int = 64, channels: int = 256, height: int = 128, width: int = 128) -> list[torch.Tensor]:
    # Each channel plane its own scale (e^-2 to e^2): a layout change must not care, but a wrong
    # copy is then visible as a change of scale, not only a change of noise.
    scale = torch.exp(torch.empty(batch, channels, 1, 1).uniform_(-2.0, 2.0))
    return [torch.randn(batch, channels, height, width, dtype=torch.bfloat16).mul_(scale)]


def get_init_inputs(batch: int = 64, channels: int = 256, height: int = 128, width: int = 128) -> list:
    return []
