"""Top-k values and int64 indices along the last dimension of a float32 tensor (reference).

Ties are resolved by one fixed rule: values in descending order, and among equal values the
lower index first, both for which of the tied elements make the cut at the k-th place and for
their order. That is the order of a stable descending sort, which is how the reference computes
it. torch.topk promises no order among equal values (on the CPU it returns tied elements in no
particular order), so a rule is needed for the indices to be checked exactly, and the inputs
hold many ties on purpose (scores that went through bfloat16, saturated plateaus) so that the
rule is exercised. -0.0 and +0.0 are equal.
"""

import numpy as np
import torch
import torch.nn as nn

# The values returned are elements of the input, not computed: any correct answer is bit-exact,
# and so is the float64 oracle (tests/test_problem_tolerances.py then asks for zero error).
EXACT_OUTPUTS = True


class Model(nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = torch.sort(x, dim=-1, descending=True, stable=True)
        return values[..., : self.k], indices[..., : self.k]


def oracle(model: Model, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """An independent float64 path: numpy's lexsort on (value descending, index ascending)."""
    x = inputs[0].double().numpy()
    index = np.broadcast_to(np.arange(x.shape[-1]), x.shape)
    order = np.lexsort((index, -x), axis=-1)[..., : model.k]
    return torch.from_numpy(np.take_along_axis(x, order, -1)), torch.from_numpy(order.astype(np.int64))


def get_inputs(rows: int = 1024, n: int = 129280, k: int = 64) -> list[torch.Tensor]:
    # Logits with a temperature per row, then one of four kinds per row (a random quarter each):
    # as drawn; rounded through bfloat16 (ties everywhere, the k-th place included); saturated at
    # the value of rank k/2 (a run of equal maxima inside the top k); saturated at rank 3k/2 (the
    # cut at the k-th place falls inside a run of equal values, decided by index).
    x = torch.randn(rows, n) * torch.empty(rows, 1).uniform_(0.5, 4.0)
    kind = (torch.randperm(rows) % 4)[:, None]
    ranks = (max(k // 2, 1), min(k + k // 2, n))
    cut = torch.topk(x, ranks[1], dim=-1).values
    inside, across = (torch.minimum(x, cut[:, r - 1 : r]) for r in ranks)
    x = torch.where(kind == 1, x.to(torch.bfloat16).float(), x)
    x = torch.where(kind == 2, inside, torch.where(kind == 3, across, x))
    return [x]


def get_init_inputs(rows: int = 1024, n: int = 129280, k: int = 64) -> list:
    return [k]
