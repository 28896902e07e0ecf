import torch
import torch.nn as nn


class Model(nn.Module):
    """
    A matrix product too big to check on a small CPU: 2 GiB of float32 tensors.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


M = 16384
K = 8192
N = 16384


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
