"""What the attention-decode and delta-rule problems promise beyond the generic per-problem tests:
their inputs hold the cases the problem statements name (a block table that is a real
permutation, ragged lengths, decays strong enough to overflow a naive quotient and weak enough
for long memory), the kernels that skip those cases fail the tolerance, and every stress case
keeps the reference well-defined (finite, and within the tolerance of its float64 oracle)."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from kb_env.evaluate.correctness import compare_outputs
from kb_env.problem import get_problem, import_file
from kb_env.sandbox.cases import as_output_list, make_inputs, make_reference_model

PAGED, MLA, KDA, GDN = "paged_attention_decode", "mla_decode", "kda_chunk", "gated_deltanet_chunk"
PROBLEMS = (PAGED, MLA, KDA, GDN)


@lru_cache(maxsize=None)
def _ref(name: str):
    return import_file(get_problem(name).reference_path, f"_deck_ref_{name}")


def _cases(name: str):
    spec = get_problem(name)
    return [(i, seed) for i in range(len(spec.shapes.cpu)) for seed in spec.seeds]


def _run(name: str, shape_index: int, seed: int, stress: dict | None = None):
    ref, spec = _ref(name), get_problem(name)
    shape = spec.shapes.cpu[shape_index]
    inputs = make_inputs(ref, shape, seed, "cpu", stress)
    model = make_reference_model(ref, shape, param_seed=0).eval()
    with torch.no_grad():
        return inputs, model, as_output_list(model(*inputs))


def _fails(name: str, got, expected) -> bool:
    ok, _, _ = compare_outputs(as_output_list(got), expected, get_problem(name).tolerance)
    return not ok


# ----- every problem: stress cases keep the reference well-defined --------------------------
def _oracle(name: str, model, inputs):
    ref = _ref(name)
    if hasattr(ref, "oracle"):
        return as_output_list(ref.oracle(model, inputs))
    up = [x.double() if x.is_floating_point() else x for x in inputs]
    return as_output_list(model.double()(*up))


@pytest.mark.parametrize("name", PROBLEMS)
def test_stress_cases_keep_the_reference_within_tolerance_of_its_oracle(name):
    spec = get_problem(name)
    for stress in spec.stress:
        inputs, model, outs = _run(name, 0, spec.seeds[0], stress.model_dump())
        assert all(bool(torch.isfinite(o).all()) for o in outs), f"{name}: {stress.describe()}: non-finite output"
        with torch.no_grad():
            oracle = _oracle(name, model, inputs)
        ok, mismatch, _ = compare_outputs(outs, [o.to(r.dtype) for o, r in zip(oracle, outs)], spec.tolerance)
        assert ok, f"{name}: {stress.describe()}: {mismatch}"


# ----- paged_attention_decode -------------------------------------------------------------------
@pytest.mark.parametrize("shape_index,seed", _cases(PAGED))
def test_paged_block_table_is_a_permutation_and_lengths_are_ragged(shape_index, seed):
    shape = get_problem(PAGED).shapes.cpu[shape_index]
    _, k_cache, _, table, lens = make_inputs(_ref(PAGED), shape, seed, "cpu")
    pages = (lens + 15) // 16
    used = torch.cat([table[b, :n] for b, n in enumerate(pages.tolist())])
    assert sorted(used.tolist()) == list(range(k_cache.shape[0])), "every page belongs to exactly one sequence"
    plan = _ref(PAGED).sequence_pages_and_lengths(shape["batch"], shape["pages"], shape["page_step"])
    assert sorted(lens.tolist()) == sorted(n for _, n in plan)
    assert any(n % 16 for n in lens.tolist()), "some length is not a multiple of the page"


def test_paged_seeds_shuffle_pages_and_lengths():
    shape = get_problem(PAGED).shapes.cpu[0]
    a, b = (make_inputs(_ref(PAGED), shape, seed, "cpu") for seed in (0, 1))
    assert not torch.equal(a[3], b[3])
    identity = torch.arange(a[1].shape[0])
    assert not torch.equal(torch.cat([a[3][i, :n] for i, n in enumerate(((a[4] + 15) // 16).tolist())]), identity)


def _paged_attention(q, k_cache, v_cache, table, lens, kv_heads, *, follow_table=True, mask_length=True,
                     gqa_group=True):
    """A plain decode attention that can skip what the problem requires."""
    batch, heads, dim = q.shape
    out = torch.empty(batch, heads, dim)
    start = 0
    for b in range(batch):
        n = int(lens[b])
        pages = (n + 15) // 16
        ids = table[b, :pages] if follow_table else torch.arange(start, start + pages)
        start += pages
        k = k_cache[ids].reshape(-1, kv_heads, dim).float()
        v = v_cache[ids].reshape(-1, kv_heads, dim).float()
        if mask_length:
            k, v = k[:n], v[:n]
        for h in range(heads):
            kvh = h // (heads // kv_heads) if gqa_group else h % kv_heads
            w = torch.softmax(k[:, kvh] @ q[b, h].float() * dim ** -0.5, 0)
            out[b, h] = w @ v[:, kvh]
    return out.to(q.dtype)


@pytest.mark.parametrize("shape_index,seed", _cases(PAGED))
def test_paged_kernels_that_skip_the_table_the_lengths_or_the_head_groups_fail(shape_index, seed):
    inputs, model, expected = _run(PAGED, shape_index, seed)
    kv = model.kv_heads
    assert not _fails(PAGED, _paged_attention(*inputs, kv), expected), "the plain loop itself must pass"
    assert _fails(PAGED, _paged_attention(*inputs, kv, follow_table=False), expected)
    assert _fails(PAGED, _paged_attention(*inputs, kv, mask_length=False), expected)
    if kv > 1:
        assert _fails(PAGED, _paged_attention(*inputs, kv, gqa_group=False), expected)


# ----- mla_decode -------------------------------------------------------------------------------
@pytest.mark.parametrize("shape_index,seed", _cases(MLA))
def test_mla_absorbed_form_matches_and_ignoring_the_offsets_fails(shape_index, seed):
    inputs, model, expected = _run(MLA, shape_index, seed)
    with torch.no_grad():
        assert not _fails(MLA, _ref(MLA).counted_forward(model, *inputs), expected)
        # The caches in the unshuffled order (longest first): each sequence reads another's tokens.
        q_nope, q_pe, cache, cu = inputs
        lens = sorted((cu[1:] - cu[:-1]).tolist(), reverse=True)
        naive_cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
        if not torch.equal(naive_cu, cu):
            assert _fails(MLA, model(q_nope, q_pe, cache, naive_cu), expected)


# ----- the delta rules --------------------------------------------------------------------------
def test_kda_decays_reach_long_memory_and_overflow_a_quotient():
    """Within 64-token chunks, some channel's decay sums past -88 (exp(-gc) overflows float32)
    while others stay near 0 (long memory), in every head."""
    *_, g, _, _ = make_inputs(_ref(KDA), dict(batch=1, seq_len=128, heads=3, dk=32, dv=32), 0, "cpu")
    chunk_sums = g.reshape(1, 2, 64, 3, 32).sum(2)  # [batch, chunk, head, channel]
    for h in range(3):
        assert float(chunk_sums[..., h, :].min()) < -88
        assert float(chunk_sums[..., h, :].max()) > -0.2


def test_gdn_decays_come_in_three_regimes():
    *_, g, _, _ = make_inputs(_ref(GDN), dict(batch=1, seq_len=64, heads=3, dk=16, dv=16), 0, "cpu")
    per_head = g.sum(1)[0]  # summed over the 64 tokens
    assert float(per_head.max()) > -0.2 and float(per_head.min()) < -20


@pytest.mark.parametrize("name", [KDA, GDN])
def test_delta_rule_kernels_that_drop_the_state_or_flatten_the_decay_fail(name):
    ref = _ref(name)
    for shape_index, seed in _cases(name):
        inputs, model, expected = _run(name, shape_index, seed)
        q, k, v, g, b, h0 = inputs
        with torch.no_grad():
            assert _fails(name, model(q, k, v, g, b, torch.zeros_like(h0)), expected), "initial state ignored"
            assert _fails(name, model(q, k, v, torch.zeros_like(g), b, h0), expected), "no decay"
            if name == KDA:  # one decay per token and head, the channels' mean
                assert _fails(name, model(q, k, v, g.mean(-1, keepdim=True).expand_as(g), b, h0), expected)
            o, state = ref.recurrence(*[x.double() for x in inputs])
            assert not _fails(name, [o.to(torch.bfloat16), state.float()], expected)
