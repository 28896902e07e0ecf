"""topk: the tie rule (lower index first) is the reference's, checked against an independent
float64 path; the inputs really hold ties, at the cut and inside the top k; an implementation
that breaks ties otherwise fails; the known-good kernel's bitonic path (k > 128, not reached by
the CPU shapes) is right under the interpreter."""

from __future__ import annotations

import pytest
import torch
from conftest import requires_cpu_mode
from interpreted import run_interpreted

from kb_env import get_problem
from kb_env.evaluate.correctness import compare_outputs
from kb_env.problem import import_file
from kb_env.sandbox.cases import make_inputs

SPEC = get_problem("topk")
REF = import_file(SPEC.reference_path, "_topk_ref")
CASES = [(i, seed, stress) for i in range(len(SPEC.shapes.cpu)) for seed in SPEC.seeds
         for stress in [None, *[s.model_dump() for s in SPEC.stress]]]


def _case(shape_index: int, seed: int, stress=None):
    shape = SPEC.shapes.cpu[shape_index]
    x, = make_inputs(REF, shape, seed, "cpu", stress)
    model = REF.Model(shape["k"])
    with torch.no_grad():
        return x, model, model(x)


@pytest.mark.parametrize("shape_index,seed,stress", CASES)
def test_reference_follows_the_tie_rule_of_an_independent_path(shape_index, seed, stress):
    x, model, (values, indices) = _case(shape_index, seed, stress)
    oracle_values, oracle_indices = REF.oracle(model, [x])
    assert torch.equal(indices, oracle_indices)
    assert torch.equal(values.double(), oracle_values)


def test_inputs_hold_ties_at_the_cut_and_inside_the_top_k():
    for shape_index in range(len(SPEC.shapes.cpu)):
        across = inside = rows = 0
        for seed in SPEC.seeds:
            x, _, (values, _) = _case(shape_index, seed)
            kth = values[:, -1:]
            across += int(((x == kth).sum(-1) > (values == kth).sum(-1)).sum())  # a tied element left out
            inside += int((values[:, 1:] == values[:, :-1]).any(-1).sum())
            rows += x.shape[0]
        assert across >= max(2, rows // 10) and inside >= max(2, rows // 5), (shape_index, across, inside, rows)


def test_other_tie_breaking_fails_the_check():
    """The same values with tied indices in another order (the higher index first) fail."""
    x, model, (values, indices) = _case(1, SPEC.seeds[0])
    flipped = torch.sort(x.flip(-1), dim=-1, descending=True, stable=True).indices[..., : model.k]
    flipped = x.shape[-1] - 1 - flipped
    assert torch.equal(x.gather(-1, flipped), values) and not torch.equal(flipped, indices)
    ok, mismatch, _ = compare_outputs([values, flipped], [values, indices], SPEC.tolerance)
    assert not ok and mismatch.output == 1 and mismatch.reason == "values"


@requires_cpu_mode
def test_known_good_bitonic_path_under_interpreter(tmp_path):
    torch.manual_seed(5)
    x, = REF.get_inputs(rows=3, n=900, k=150)
    expected = REF.Model(150)(x)
    got, = run_interpreted([{"path": SPEC.solution_paths[0], "init": [150], "inputs": [x]}], tmp_path)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
