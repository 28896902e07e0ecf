import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Elementwise affine transform (a learned scale and shift per feature) followed by LeakyReLU.
    """

    def __init__(self, features: int, negative_slope: float):
        super(Model, self).__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x * self.weight + self.bias, self.negative_slope)


batch_size = 32
features = 200
negative_slope = 0.05


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features, negative_slope]
