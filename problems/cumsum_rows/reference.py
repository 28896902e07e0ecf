"""Cumulative sum along each row of a float32 matrix (reference)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=-1)


def get_inputs(rows: int = 4096, cols: int = 32768) -> list[torch.Tensor]:
    # Each row drifts: its own mean (0.25 to 2 in size, either sign) plus noise of its own spread
    # (e^-1 to e). The running sums leave zero within a few hundred elements and grow to about
    # cols times the mean, so the elementwise bar can be a relative one (see problem.yaml).
    sign = torch.where(torch.rand(rows, 1) < 0.5, -1.0, 1.0)
    mean = sign * torch.empty(rows, 1).uniform_(0.25, 2.0)
    spread = torch.exp(torch.empty(rows, 1).uniform_(-1.0, 1.0))
    return [torch.randn(rows, cols).mul_(spread).add_(mean)]


def get_init_inputs(rows: int = 4096, cols: int = 32768) -> list:
    return []


GPU_CHUNK = 128  # what torch's CUDA scan takes at 4096 rows of 32768 (256 at 2049 rows of 65537)


def gpu_accumulation(model: nn.Module, inputs: list[torch.Tensor]) -> torch.Tensor:
    """The cumulative sum with float32 accumulation in the order torch's CUDA kernel adds (for the
    tolerance calibration: torch's CPU cumsum accumulates float32 in float64, so on the CPU the
    reference shows none of the error its GPU run makes). Rows are scanned in chunks of GPU_CHUNK:
    the running total of the chunks before is added to the chunk's first element, then a Sklansky
    tree scans the chunk, and its last element is the next running total."""
    (x,) = inputs
    rows, cols = x.shape
    n_chunks = -(-cols // GPU_CHUNK)
    padded = torch.zeros(rows, n_chunks * GPU_CHUNK, dtype=torch.float32)
    padded[:, :cols] = x
    lanes = torch.arange(GPU_CHUNK // 2)
    steps = []  # (targets, sources) of each Sklansky level
    for level in range((GPU_CHUNK // 2).bit_length()):
        span = 1 << level
        base = ((lanes >> level) << (level + 1)) | span
        steps.append((base + lanes % span, base - 1))
    total = torch.zeros(rows, dtype=torch.float32)
    for c in range(n_chunks):
        chunk = padded[:, c * GPU_CHUNK:(c + 1) * GPU_CHUNK]
        chunk[:, 0] += total
        for targets, sources in steps:
            chunk[:, targets] += chunk[:, sources]
        total = chunk[:, -1].clone()
    return padded[:, :cols].to(x.dtype)
