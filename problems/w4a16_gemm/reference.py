"""y = x @ w with int4 weights (asymmetric, groups of 128 along K) and bfloat16 activations (reference).

Weight layout (the usual GPTQ/AWQ-style asymmetric int4 packed along K, as kimi_linear_decode's
W4A16 layers hold theirs):
- `qweight` uint8 (K/2, N): two 4-bit codes per byte along K, q[2j, n] in the low nibble of
  qweight[j, n] and q[2j+1, n] in the high nibble;
- `scales`, `zeros` bfloat16 (K/128, N): per group of 128 rows of K and per column;
- w[k, n] = (q[k, n] - zeros[k // 128, n]) * scales[k // 128, n].
The weights are quantized at init from normal(0, 0.02) values by each group's min and max
(scale = (max - min) / 15, zero = round(-min / scale) clamped to 0..15).

The reference dequantizes to bfloat16 (each weight rounded once) and multiplies in bfloat16 with
float32 accumulation; `oracle` does the same in float64 from the stored codes.
"""

import torch
import torch.nn as nn

GROUP = 128


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qweight uint8 (K/2, N), scales bf16 (K/G, N), zeros bf16 (K/G, N)) for a float (K, N) weight."""
    K, N = w.shape
    groups = w.float().reshape(K // GROUP, GROUP, N)
    lo, hi = groups.amin(dim=1), groups.amax(dim=1)
    scale = ((hi - lo) / 15).clamp_min(1e-8)
    zero = torch.round(-lo / scale).clamp(0, 15)
    q = torch.round(groups / scale[:, None] + zero[:, None]).clamp(0, 15).to(torch.uint8).reshape(K, N)
    return q[0::2] | (q[1::2] << 4), scale.to(torch.bfloat16), zero.to(torch.bfloat16)


def unpack(qweight: torch.Tensor) -> torch.Tensor:
    """The 4-bit codes (K, N) uint8 of a packed (K/2, N) weight."""
    return torch.stack([qweight & 0xF, qweight >> 4], dim=1).reshape(-1, qweight.shape[-1])


class Model(nn.Module):
    def __init__(self, K: int, N: int):
        super().__init__()
        assert K % GROUP == 0, f"K={K} must be a multiple of the group size {GROUP}"
        qweight, scales, zeros = quantize(torch.randn(K, N) * 0.02)
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.register_buffer("zeros", zeros)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        K, N = 2 * self.qweight.shape[0], self.qweight.shape[1]
        q = unpack(self.qweight).reshape(K // GROUP, GROUP, N).to(x.dtype)
        w = ((q - self.zeros[:, None, :]) * self.scales[:, None, :]).reshape(K, N)
        return x @ w


def oracle(model: Model, inputs: list[torch.Tensor]) -> torch.Tensor:
    """float64 from the stored codes, scales and zeros (upcasting the Model would leave the uint8
    codes alone and multiply in bfloat16)."""
    K, N = 2 * model.qweight.shape[0], model.qweight.shape[1]
    q = unpack(model.qweight).double().reshape(K // GROUP, GROUP, N)
    w = ((q - model.zeros.double()[:, None, :]) * model.scales.double()[:, None, :]).reshape(K, N)
    return inputs[0].double() @ w


def get_inputs(M: int = 16, N: int = 22016, K: int = 8192) -> list[torch.Tensor]:
    # Activations scaled so that y is of about unit RMS at every K (one tolerance fits all
    # shapes), rows between 0.5x and 2x of that, and a few outlier channels (x8).
    x = torch.randn(M, K) * torch.exp2(torch.empty(M, 1).uniform_(-1.0, 1.0)) / (0.02 * K**0.5)
    x[:, torch.randperm(K)[: max(1, K // 64)]] *= 8.0
    return [x.to(torch.bfloat16)]


def get_init_inputs(M: int = 16, N: int = 22016, K: int = 8192) -> list:
    return [K, N]
