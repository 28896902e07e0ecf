"""moe_swiglu_grouped: the routing is ragged with an empty expert, the FLOP count covers every
routed row (T*K of them, not T), and the bar catches routing mistakes (an expert boundary off by
one row, the offsets ignored)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_problem_formulas import measure_work

from kb_env import get_problem
from kb_env.evaluate.correctness import compare_outputs
from kb_env.problem import import_file
from kb_env.sandbox.cases import make_inputs, make_reference_model

SPEC = get_problem("moe_swiglu_grouped")
REF = import_file(SPEC.reference_path, "_moe_ref")


@pytest.mark.parametrize("shape", [*SPEC.shapes.cpu, {"T": 512, "K": 4, "E": 16, "H": 64, "I": 32}],
                         ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_routing_is_ragged_with_an_empty_expert(shape):
    for seed in SPEC.seeds:
        x, offsets = make_inputs(REF, shape, seed, "cpu")
        counts = offsets[1:] - offsets[:-1]
        assert offsets.dtype == torch.int32 and offsets.shape == (shape["E"] + 1,)
        assert int(offsets[0]) == 0 and int(offsets[-1]) == shape["T"] * shape["K"] == x.shape[0]
        assert bool((counts >= 0).all()) and int((counts == 0).sum()) >= 1
        assert int(counts.max()) > int(counts[counts > 0].min())  # ragged, not equal shares


def test_flops_count_every_routed_row():
    shape = SPEC.shapes.cpu[0]
    T, K, H, I = shape["T"], shape["K"], shape["H"], shape["I"]
    work = measure_work("moe_swiglu_grouped", tuple(shape.items()), False)
    assert work.matmul == 2 * 2 * (T * K) * H * I  # two products over all T*K routed rows
    assert SPEC.flops_of(shape) == work.flops and SPEC.flops_of(shape) > K / 2 * 4 * T * H * I


def _routed(model, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    bounds = offsets.tolist()
    out = torch.zeros(x.shape[0], model.w_gate.shape[-1], dtype=torch.float64)
    for e in range(model.w_gate.shape[0]):
        rows = x[bounds[e] : bounds[e + 1]].double()
        out[bounds[e] : bounds[e + 1]] = F.silu(rows @ model.w_gate[e].double()) * (rows @ model.w_up[e].double())
    return out.to(torch.bfloat16)


@pytest.mark.parametrize("shape_index", range(len(SPEC.shapes.cpu)))
def test_routing_mistakes_fail_the_bar(shape_index):
    shape = SPEC.shapes.cpu[shape_index]
    model = make_reference_model(REF, shape, param_seed=0).requires_grad_(False)
    x, offsets = make_inputs(REF, shape, 0, "cpu")
    expected = model(x, offsets)
    ok, mismatch, _ = compare_outputs([_routed(model, x, offsets)], [expected], SPEC.tolerance)
    assert ok, mismatch  # the right routing, computed another way, passes
    busy = int(torch.nonzero(offsets[1:-1] > 0)[0])  # an inner boundary with rows before it
    shifted = offsets.clone()
    shifted[busy + 1] -= 1
    one_expert = torch.tensor([0] + [x.shape[0]] * shape["E"], dtype=torch.int32)
    for mistake, wrong in {"a boundary one row off": shifted, "offsets ignored": one_expert}.items():
        ok, _, _ = compare_outputs([_routed(model, x, wrong)], [expected], SPEC.tolerance)
        assert not ok, f"{mistake} passes"
