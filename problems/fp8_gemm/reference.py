"""y = (x_q @ w_q^T) * x_scale * w_scale in float8 e4m3, bfloat16 out (reference).

- `weight` float8_e4m3fn [N, K] (an nn.Linear layout) with `weight_scale` float32 [N], one per
  output channel: the real weight is weight[n, :] * weight_scale[n]. The weights are quantized
  at init (each channel's largest magnitude mapped to e4m3's 448) from normal weights whose
  magnitude differs from channel to channel, so the scale matters; no higher-precision copy
  exists anywhere.
- `x` float8_e4m3fn [M, K] with `x_scale` float32 [M, 1], one per row (dynamic per-token
  quantization: each row's largest magnitude mapped to 112, a quarter of e4m3's range, which
  leaves room for the x4 stress case).

The reference widens the e4m3 values to bfloat16 (exactly) and multiplies in bfloat16 with
float32 accumulation (cuBLAS), then applies both scales in float32. `oracle` does it in float64.
"""

import torch
import torch.nn as nn

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
X_AMAX = 112.0


class Model(nn.Module):
    def __init__(self, K: int, N: int):
        super().__init__()
        w = torch.randn(N, K) * 0.02 * torch.exp(torch.empty(N, 1).uniform_(-1.0, 1.0))
        scale = w.abs().amax(dim=1, keepdim=True) / FP8_MAX
        self.register_buffer("weight", (w / scale).to(FP8))
        self.register_buffer("weight_scale", scale.squeeze(1).float())

    def forward(self, x: torch.Tensor, x_scale: torch.Tensor) -> torch.Tensor:
        y = x.to(torch.bfloat16) @ self.weight.to(torch.bfloat16).t()
        return (y.float() * x_scale * self.weight_scale).to(torch.bfloat16)


def oracle(model: Model, inputs: list[torch.Tensor]) -> torch.Tensor:
    """float64 (upcasting the Model would still multiply in bfloat16)."""
    x, x_scale = inputs
    return (x.double() @ model.weight.double().t()) * x_scale.double() * model.weight_scale.double()


def get_inputs(M: int = 8192, N: int = 8192, K: int = 8192) -> list[torch.Tensor]:
    # Activations scaled so that y is of about unit RMS at every K, rows between 0.5x and 2x of
    # that, and a few outlier channels (x8) that set each row's scale.
    x = torch.randn(M, K) * torch.exp2(torch.empty(M, 1).uniform_(-1.0, 1.0)) / (0.02 * K**0.5)
    x[:, torch.randperm(K)[: max(1, K // 64)]] *= 8.0
    x_scale = x.abs().amax(dim=1, keepdim=True) / X_AMAX
    return [(x / x_scale).to(FP8), x_scale]


def get_init_inputs(M: int = 8192, N: int = 8192, K: int = 8192) -> list:
    return [K, N]
