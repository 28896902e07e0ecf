"""Row softmax of float32 logits whose normaliser needs compensated summation (reference).

Each row is an attention-sink-like distribution: a hot prefix of a few thousand positions near
the row's maximum holds almost all of the mass, and a long cold tail (hundreds of thousands to
millions of positions, each about 2e-8 of the maximum's weight) holds a small share that still
matters at float32 precision. Every cold term is below half an ulp of any float32 running sum
that already holds a hot term, so a sequential float32 accumulation silently drops the tail;
compensated (Kahan/Neumaier) or float64 accumulation keeps it.

The reference accumulates in float64 and rounds the result to float32 once.
"""

import torch
import torch.nn as nn

HOT = 4096  # hot-prefix width: every lane of a 4096-lane accumulator starts with a hot term
HOT_SPREAD = (0.15, 0.35)  # hot logits lie this far below the row's level (so each hot weight > 0.7)
COLD_GAP = (17.4, 18.0)  # cold logits lie this far below it: weights 1.5e-8 .. 2.8e-8 < 2^-25


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x.double(), dim=-1).to(x.dtype)


def get_inputs(rows: int = 128, cols: int = 1048576) -> list[torch.Tensor]:
    level = torch.randn(rows, 1) * 3.0  # the rows' logit levels differ
    gap = torch.empty(rows, cols).uniform_(*COLD_GAP)
    hot = min(HOT, cols // 8)
    spread = torch.empty(rows, 1).uniform_(*HOT_SPREAD)
    gap[:, :hot] = torch.rand(rows, hot) * spread
    return [level - gap]


def get_init_inputs(rows: int = 128, cols: int = 1048576) -> list:
    return []
