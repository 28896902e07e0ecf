"""Per-row cross-entropy of bfloat16 logits over a large vocabulary, int64 targets (reference)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # loss[i] = logsumexp(logits[i]) - logits[i, targets[i]], one per row, in float32: the logits
        # are upcast first, as training code does (and as torch's CPU kernel needs: in bfloat16 it
        # rounds the row's logsumexp to bfloat16 before subtracting, up to 0.03 off at 10)
        acc = torch.promote_types(logits.dtype, torch.float32)  # float32, or float64 for an oracle
        return F.cross_entropy(logits.to(acc), targets, reduction="none")


def get_inputs(rows: int = 4096, vocab: int = 128256) -> list[torch.Tensor]:
    # Logits of very different temperature per row (0.5 to 8: nearly flat to sharply peaked), and
    # half the rows "confident": their target's logit raised by up to 1.5 times the expected
    # largest logit of the row, so that their loss runs down to ~0 while the others' runs up to ~40.
    # Drawn in bfloat16 and scaled in place (the logits are 1 GB).
    temperature = torch.exp(torch.empty(rows, 1).uniform_(math.log(0.5), math.log(8.0)))
    logits = torch.randn(rows, vocab, dtype=torch.bfloat16).mul_(temperature)
    targets = torch.randint(0, vocab, (rows,))
    confident = torch.rand(rows) < 0.5
    bump = torch.rand(rows) * 1.5 * temperature[:, 0] * math.sqrt(2 * math.log(vocab)) * confident
    rows_idx = torch.arange(rows)
    logits[rows_idx, targets] += bump.to(torch.bfloat16)
    return [logits, targets]


def get_init_inputs(rows: int = 4096, vocab: int = 128256) -> list:
    return []
