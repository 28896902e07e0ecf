"""The expert MLP input half of a mixture-of-experts layer: per expert e, over the rows routed
to it, silu(x_e @ w_gate[e]) * (x_e @ w_up[e]) (reference).

`x` [T*K, H] bfloat16 holds every routed row (each of T tokens appears once per each of its K
experts), already sorted by expert; `offsets` [E+1] int32 marks expert e's rows as
x[offsets[e]:offsets[e+1]] (offsets[0] = 0, offsets[E] = T*K). The load is ragged: popular and
unpopular experts, and at least one expert with no rows at all.

The reference runs torch's grouped matrix product (`torch._grouped_mm`, float32 accumulation,
bfloat16 results), then SiLU and the product in bfloat16; `oracle` loops over the experts in
float64.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, E: int, H: int, I: int):
        super().__init__()
        self.w_gate = nn.Parameter((torch.randn(E, H, I) / H**0.5).to(torch.bfloat16))
        self.w_up = nn.Parameter((torch.randn(E, H, I) / H**0.5).to(torch.bfloat16))

    def forward(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        ends = offsets[1:]
        gate = torch._grouped_mm(x, self.w_gate, offs=ends)
        up = torch._grouped_mm(x, self.w_up, offs=ends)
        return F.silu(gate) * up


def oracle(model: Model, inputs: list[torch.Tensor]) -> torch.Tensor:
    """float64, expert by expert (torch's grouped product has no float64 kernel)."""
    x, offsets = inputs
    bounds = offsets.tolist()
    out = torch.zeros(x.shape[0], model.w_gate.shape[-1], dtype=torch.float64)
    for e in range(model.w_gate.shape[0]):
        rows = x[bounds[e] : bounds[e + 1]].double()
        out[bounds[e] : bounds[e + 1]] = F.silu(rows @ model.w_gate[e].double()) * (rows @ model.w_up[e].double())
    return out


def get_inputs(T: int = 4096, K: int = 2, E: int = 8, H: int = 4096, I: int = 14336) -> list[torch.Tensor]:
    rows = T * K
    # Ragged routing: expert popularity from a skewed distribution, then one expert emptied.
    # (Written with fixed-shape tensor ops only: the formula tests trace it on fake tensors.)
    popularity = torch.softmax(torch.randn(E) * 0.8, dim=0)
    choice = torch.multinomial(popularity, rows, replacement=True)
    experts = torch.arange(E)
    counts = (choice[:, None] == experts).sum(0)
    pick = torch.randperm(E)
    empty, other = experts == pick[0], experts == pick[1]
    counts = torch.where(empty, 0, counts + other * (counts * empty).sum())
    offsets = torch.zeros(E + 1, dtype=torch.int32)
    offsets[1:] = torch.cumsum(counts, dim=0).to(torch.int32)
    x = torch.randn(rows, H) * torch.exp2(torch.empty(rows, 1).uniform_(-1.0, 1.0))
    return [x.to(torch.bfloat16), offsets]


def get_init_inputs(T: int = 4096, K: int = 2, E: int = 8, H: int = 4096, I: int = 14336) -> list:
    return [E, H, I]
