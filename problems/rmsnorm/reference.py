"""RMSNorm with a learned weight, bfloat16 in and out, float32 accumulation (reference)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        # Not ones: a kernel that ignores the weight must fail.
        self.weight = nn.Parameter(torch.empty(hidden).normal_(1.0, 0.25).to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acc = torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for an oracle
        xf = x.to(acc)
        rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (xf * rstd * self.weight.to(acc)).to(x.dtype)


def get_inputs(rows: int = 16384, hidden: int = 8192) -> list[torch.Tensor]:
    # Rows of very different magnitude: normalisation must really divide by each row's RMS.
    scale = torch.exp(torch.empty(rows, 1).uniform_(-3.0, 3.0))
    return [(torch.randn(rows, hidden) * scale).to(torch.bfloat16)]


def get_init_inputs(rows: int = 16384, hidden: int = 8192) -> list:
    return [hidden]
