"""LayerNorm over the last dimension with a learned weight and bias, bfloat16 in and out (reference)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        # Neither ones nor zeros: a kernel that ignores the weight or the bias must fail.
        self.weight = nn.Parameter(torch.empty(hidden).normal_(1.0, 0.25).to(torch.bfloat16))
        self.bias = nn.Parameter(torch.empty(hidden).normal_(0.0, 0.5).to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


def get_inputs(rows: int = 32768, hidden: int = 8192) -> list[torch.Tensor]:
    # Rows of very different spread (e^-3 to e^3) around very different means (up to 4 spreads
    # away from zero): the kernel must really subtract each row's mean and divide by its deviation.
    # Drawn in bfloat16 and transformed in place (the input is 0.5 GB).
    spread = torch.exp(torch.empty(rows, 1).uniform_(-3.0, 3.0))
    mean = torch.empty(rows, 1).uniform_(-4.0, 4.0) * spread
    return [torch.randn(rows, hidden, dtype=torch.bfloat16).mul_(spread).add_(mean)]


def get_init_inputs(rows: int = 32768, hidden: int = 8192) -> list:
    return [hidden]
