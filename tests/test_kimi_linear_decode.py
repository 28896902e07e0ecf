"""KernelBench/kimi_linear_decode-v0: the contract published KernelBench-Mega solutions rely on
(cfg attributes, state_dict names, dtypes and shapes, state layout), the W4A16 format, the
bytes and FLOPs formulas against the work the reference really does, and the step checker:
calibrated against the bf16 baseline, rejecting zeros, an echo, a stale state and a cache
without its new row. The reference submitted as a candidate is correct in CPU mode; on a GPU the
launch cap flags a multi-kernel step with its count (GPU-only tests skip without CUDA)."""

from __future__ import annotations

from functools import lru_cache

import gymnasium as gym
import pytest
import torch
from conftest import requires_cpu_mode, requires_cuda

import kb_env  # noqa: F401 (registers the environments)
import kb_env.feedback
from kb_env import get_problem
from kb_env.evaluate.decode_check import compare_step, cosine
from kb_env.evaluate.evaluator import Evaluator
from kb_env.problem import import_file
from kb_env.sandbox import decode
from kb_env.sandbox.cases import make_inputs, make_reference_model

SPEC = get_problem("kimi_linear_decode")
CPU0 = SPEC.shapes.cpu[0]
GPU0 = SPEC.shapes.gpu[0]
PARAM_SEED = 11


@lru_cache(maxsize=None)
def ref():
    return import_file(SPEC.reference_path, "_kimi_ref")


@lru_cache(maxsize=None)
def base():
    return import_file(SPEC.folder / "baseline.py", "_kimi_base")


@lru_cache(maxsize=None)
def model(shape_items: tuple, device: str = "cpu"):
    return make_reference_model(ref(), dict(shape_items), PARAM_SEED, device).eval()


def cpu_model():
    return model(tuple(CPU0.items()))


def gpu_model_on_meta():
    """The real unit's reference Model on the meta device: names, shapes and dtypes, no data."""
    return model(tuple(GPU0.items()), "meta")


# ----- the contract -------------------------------------------------------------------------------------
CFG_ATTRS = {"hidden": 2304, "kda_heads": 32, "kda_head_dim": 128, "short_conv": 4, "mla_heads": 32, "kv_lora": 512,
             "qk_nope": 128, "qk_rope": 64, "v_head": 128, "rope_theta": 10000, "n_experts": 64, "n_active": 8,
             "n_shared": 1, "moe_inter": 1024, "routed_scaling": 2.446, "group": 128, "pattern": ("K", "K", "K", "M"),
             "dtype": torch.bfloat16}


def test_env_makes_in_cpu_mode_and_shows_the_reference():
    env = gym.make("KernelBench/kimi_linear_decode-v0", device="cpu")
    obs, info = env.reset(seed=0)
    assert "def step" in obs["reference"] and info["problem"] == "kimi_linear_decode"
    assert info["shapes"] == SPEC.shapes.cpu
    env.close()


def test_every_gpu_shape_builds_the_real_unit_config():
    for shape in SPEC.shapes.gpu:
        cfg = ref().build_config(shape)
        assert {k: getattr(cfg, k) for k in CFG_ATTRS} == CFG_ATTRS
    assert [s["context"] for s in SPEC.shapes.gpu] == [2048, 8192, 16384]
    assert [s["steps"] for s in SPEC.shapes.gpu] == [32, 16, 16]


def _expected_state_dict() -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The names, shapes and dtypes the issue fixes (and published solutions load)."""
    d, hk, e, i = 2304, 32 * 128, 64, 1024
    out: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}

    def w4(prefix: str, n_in: int, n_out: int, lead: tuple[int, ...] = ()):
        out[f"{prefix}.w_q"] = ((*lead, n_in // 2, n_out), torch.uint8)
        out[f"{prefix}.scales"] = ((*lead, n_in // 128, n_out), torch.bfloat16)
        out[f"{prefix}.zeros"] = ((*lead, n_in // 128, n_out), torch.bfloat16)

    for b in range(4):
        out[f"blocks.{b}.attn_norm"] = ((d,), torch.bfloat16)
        out[f"blocks.{b}.moe_norm"] = ((d,), torch.bfloat16)
        if b < 3:
            for name in ("q_proj", "k_proj", "v_proj", "g_proj"):
                w4(f"blocks.{b}.attn.{name}", d, hk)
            w4(f"blocks.{b}.attn.o_proj", hk, d)
            out[f"blocks.{b}.attn.beta_proj.weight"] = ((32, d), torch.bfloat16)
            out[f"blocks.{b}.attn.conv_w"] = ((3, hk, 4), torch.bfloat16)
        else:
            w4(f"blocks.{b}.attn.q_proj", d, 32 * 192)
            w4(f"blocks.{b}.attn.kv_a", d, 512 + 64)
            w4(f"blocks.{b}.attn.kv_b", 512, 32 * 256)
            w4(f"blocks.{b}.attn.o_proj", 32 * 128, d)
        out[f"blocks.{b}.moe.router.weight"] = ((e, d), torch.bfloat16)
        for name, n_in, n_out, lead in (("gate", d, i, e), ("up", d, i, e), ("down", i, d, e),
                                        ("s_gate", d, i, 1), ("s_up", d, i, 1), ("s_down", i, d, 1)):
            w4(f"blocks.{b}.moe.{name}", n_in, n_out, (lead,))
    return out


def test_state_dict_has_exactly_the_published_names_shapes_and_dtypes():
    sd = gpu_model_on_meta().state_dict()
    expected = _expected_state_dict()
    assert sorted(sd) == sorted(expected), (set(sd) ^ set(expected))
    for name, (shape, dtype) in expected.items():
        assert tuple(sd[name].shape) == shape and sd[name].dtype == dtype, name


def test_norm_weights_start_at_ones_and_weights_are_really_int4():
    sd = cpu_model().state_dict()
    assert all(bool((v == 1).all()) for k, v in sd.items() if k.endswith("_norm"))
    w_q = sd["blocks.0.moe.gate.w_q"]
    assert w_q.dtype == torch.uint8 and int(w_q.max()) > 15  # both nibbles used
    zeros = sd["blocks.0.moe.gate.zeros"].float()
    assert float(zeros.min()) >= 0 and float(zeros.max()) <= 15 and torch.equal(zeros, zeros.round())


def test_state_layout():
    cfg = ref().build_config(GPU0)
    state = ref().init_state(cfg, 5, seed=3)
    assert [sorted(layer) for layer in state] == [["S", "ck", "cq", "cv"]] * 3 + [["c_kv", "k_rope"]]
    for layer in state[:3]:
        assert layer["S"].shape == (32, 128, 128) and layer["S"].dtype == torch.float32
        assert all(layer[k].shape == (3, 4096) and layer[k].dtype == torch.bfloat16 for k in ("cq", "ck", "cv"))
    assert state[3]["c_kv"].shape == (5, 512) and state[3]["k_rope"].shape == (5, 64)
    assert state[3]["c_kv"].dtype == state[3]["k_rope"].dtype == torch.bfloat16
    hidden = ref().init_token(cfg, 3)
    assert hidden.shape == (2304,) and hidden.dtype == torch.bfloat16
    assert torch.equal(hidden, ref().init_token(cfg, 3)) and not torch.equal(hidden, ref().init_token(cfg, 4))


def test_a_step_grows_the_caches_by_one_row_and_keeps_the_layout():
    m, (hidden, state) = cpu_model(), make_inputs(ref(), CPU0, 5, "cpu")
    out, new = m.step(hidden, state)
    assert out.shape == hidden.shape and out.dtype == torch.bfloat16
    assert [sorted(x) for x in new] == [sorted(x) for x in state]
    assert new[3]["c_kv"].shape[0] == state[3]["c_kv"].shape[0] + 1
    assert torch.equal(new[3]["c_kv"][:-1], state[3]["c_kv"]) and torch.equal(new[0]["cq"][:2], state[0]["cq"][1:])


def test_harness_inputs_honour_the_seed():
    a = make_inputs(ref(), CPU0, 1, "cpu")
    b = make_inputs(ref(), CPU0, 1, "cpu")
    c = make_inputs(ref(), CPU0, 2, "cpu")
    flat = lambda x: decode.flatten(*x)[1]  # noqa: E731
    assert all(torch.equal(u, v) for u, v in zip(flat(a), flat(b)))
    assert not torch.equal(flat(a)[0], flat(c)[0]) and not torch.equal(flat(a)[1], flat(c)[1])


# ----- the W4A16 format -----------------------------------------------------------------------------------
def test_packing_puts_even_rows_in_the_low_nibble():
    q = torch.tensor([[3, 12], [10, 1], [0, 15], [7, 7]], dtype=torch.uint8)  # (in=4, out=2)
    packed = q[0::2] | (q[1::2] << 4)
    assert packed.tolist() == [[3 | 10 << 4, 12 | 1 << 4], [0 | 7 << 4, 15 | 7 << 4]]
    assert torch.equal(ref().unpack_w4(packed), q)


def test_quantization_round_trip_is_within_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(256, 48) * 0.02
    w_q, scales, zeros = ref().quantize_w4(w, 128)
    assert w_q.shape == (128, 48) and scales.shape == zeros.shape == (2, 48)
    back = ref().dequant_w4(w_q, scales, zeros)
    step = scales.float().repeat_interleave(128, 0)
    # half a quantization step, plus what rounding scale and zero to bf16 moves
    assert bool(((back - w).abs() <= 0.5 * step + 0.02 * w.abs().amax()).all())
    assert cosine(back, w) > 0.99


# ----- formulas: the work and the traffic of one step ------------------------------------------------------
def _routing(m, hidden, state) -> list[list[int]]:
    """The experts each MoE layer's router selects for this step (recorded from the reference)."""
    chosen: list[list[int]] = []
    orig = ref().MoE.forward

    def spy(self, x):
        probs = torch.softmax(x @ self.router.weight.float().t(), dim=-1)
        chosen.append(torch.topk(probs, self.cfg.n_active).indices.tolist())
        return orig(self, x)

    ref().MoE.forward = spy
    try:
        m.step(hidden, state)
    finally:
        ref().MoE.forward = orig
    return chosen


def _touched_bytes(m, hidden, state, routing) -> int:
    """Bytes a step must move at least: every state_dict tensor it uses (routed experts: only the
    selected ones) once, the fed state read, the new state written (a grown cache: its new row),
    the hidden read and written."""
    def nbytes(t):
        return t.numel() * t.element_size()

    total = 0
    routed = ("moe.gate.", "moe.up.", "moe.down.")
    for name, t in m.state_dict().items():
        if any(r in name for r in routed):
            layer = int(name.split(".")[1])
            total += nbytes(t) * len(set(routing[layer])) // t.shape[0]  # the selected experts' slices
        else:
            total += nbytes(t)
    for layer in state:
        for key, t in layer.items():
            total += nbytes(t)  # read
            total += nbytes(t) if key not in ("c_kv", "k_rope") else nbytes(t[0])  # written (cache: one new row)
    return total + 2 * nbytes(hidden)


def test_bytes_formula_counts_the_tensors_a_step_touches():
    m = cpu_model()
    for context in (CPU0["context"], 100):
        shape = {**CPU0, "context": context}
        hidden, state = make_inputs(ref(), shape, 4, "cpu")
        routing = _routing(m, hidden, state)
        assert all(len(set(r)) == CPU0["active"] for r in routing)
        assert SPEC.bytes_of(shape) == _touched_bytes(m, hidden, state, routing)


def test_bytes_formula_on_the_real_unit():
    """The GPU shapes' traffic from the meta model's tensor sizes with `active` experts selected."""
    m = gpu_model_on_meta()
    cfg = ref().build_config(GPU0)
    for shape in SPEC.shapes.gpu:
        state = [{k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in layer.items()}
                 for layer in ref().init_state(cfg, 1, 0)]
        state[3] = {k: torch.empty(shape["context"], v.shape[1], dtype=v.dtype, device="meta")
                    for k, v in state[3].items()}
        hidden = torch.empty(cfg.hidden, dtype=torch.bfloat16, device="meta")
        routing = [list(range(cfg.n_active))] * 4
        assert SPEC.bytes_of(shape) == _touched_bytes(m, hidden, state, routing), shape


def test_flops_formula_counts_the_work_a_step_does():
    """The GEMV work from the weights the reference really dequantizes and multiplies in a step
    (kv_b once: applied in absorbed form, never to the cache), plus the attention over the cache
    in absorbed form and the KDA recurrence, by the conventions in problem.yaml."""
    m = cpu_model()
    hidden, state = make_inputs(ref(), CPU0, 6, "cpu")
    used: list[tuple[int, int]] = []
    w4_weight = ref().W4Linear.weight

    def spy(self, expert=None):
        w = w4_weight(self, expert)
        used.append(tuple(w.shape))
        return w

    ref().W4Linear.weight = spy
    try:
        m.step(hidden, state)
    finally:
        ref().W4Linear.weight = w4_weight
    cfg = ref().build_config(CPU0)
    gemv = sum(2 * n_in * n_out for n_in, n_out in used)
    gemv += 4 * 2 * cfg.hidden * cfg.n_experts + 3 * 2 * cfg.hidden * cfg.kda_heads  # routers, beta projections
    h, ctx = cfg.mla_heads, CPU0["context"] + 1
    attention = h * ctx * (2 * (cfg.kv_lora + cfg.qk_rope) + 2 * cfg.kv_lora)
    recurrence = 3 * 7 * cfg.kda_heads * cfg.kda_head_dim ** 2
    assert len(used) == 3 * 5 + 4 + 4 * 3 * (cfg.n_active + cfg.n_shared)
    assert SPEC.flops_of(CPU0) == gemv + attention + recurrence


# ----- the step checker ----------------------------------------------------------------------------------------
def _case(seed: int, shape=CPU0):
    m = cpu_model()
    hidden, state = make_inputs(ref(), shape, seed, "cpu")
    names, fed = decode.flatten(hidden, state)
    out_names, out = decode.flatten_step(m.step(hidden, state))
    return hidden, state, names, fed, out_names, out


def _check(got_names, got, exp_names, exp, fed):
    return compare_step(got_names, got, exp_names, exp, fed, SPEC.decode)


@pytest.mark.parametrize("seed", range(6))
def test_baseline_passes_with_headroom(seed):
    """Calibration: the bf16 baseline (what an honest bf16 kernel computes) against the fp32
    reference passes every bar with room: cosine >= 0.99 (bar 0.98), the step's change >= 0.95
    (bar 0.9)."""
    hidden, state, names, fed, out_names, out = _case(seed)
    b = base().Model(ref().build_config(CPU0))
    b.load_state_dict(cpu_model().state_dict(), strict=True)
    b_names, b_out = decode.flatten_step(b.step(hidden, state))
    ok, mismatch, stats = _check(b_names, b_out, out_names, out, fed)
    assert ok, mismatch
    assert stats["min_cosine"] >= 0.95


def test_reference_against_itself_passes():
    _, _, _, fed, names, out = _case(0)
    ok, mismatch, stats = _check(names, [o.clone() for o in out], names, out, fed)
    assert ok and stats["min_cosine"] > 0.999999


def test_zeros_fail():
    _, _, _, fed, names, out = _case(1)
    ok, mismatch, _ = _check(names, [torch.zeros_like(o) for o in out], names, out, fed)
    assert not ok and mismatch.reason == "values" and mismatch.cosine == 0.0


def test_an_echo_of_the_hidden_fails_though_its_cosine_is_high():
    hidden, _, _, fed, names, out = _case(2)
    assert cosine(hidden, out[0]) > 0.98  # the residual stream: a plain cosine would pass an echo
    got = [hidden.clone(), *out[1:]]
    ok, mismatch, _ = _check(names, got, names, out, fed)
    assert not ok and mismatch.output == 0 and "changed" in mismatch.message


def test_a_stale_state_fails():
    _, _, fed_names, fed, names, out = _case(3)
    fed_by_name = dict(zip(fed_names, fed))
    got = [fed_by_name["state[0].S"].clone() if n == "state[0].S" else o for n, o in zip(names, out)]
    ok, mismatch, _ = _check(names, got, names, out, fed)
    assert not ok and names[mismatch.output] == "state[0].S"


def test_a_cache_without_its_new_row_or_with_a_zero_row_fails():
    _, _, fed_names, fed, names, out = _case(4)
    i = names.index("state[3].c_kv")
    stale = list(out)
    stale[i] = dict(zip(fed_names, fed))["state[3].c_kv"]
    ok, mismatch, _ = _check(names, stale, names, out, fed)
    assert not ok and mismatch.reason == "shape"
    zero_row = list(out)
    zero_row[i] = out[i].clone()
    zero_row[i][-1] = 0
    assert cosine(zero_row[i], out[i]) > 0.98  # the whole cache's cosine would pass it
    ok, mismatch, _ = _check(names, zero_row, names, out, fed)
    assert not ok and "new rows" in mismatch.message


def test_wrong_structure_and_nonfinite_fail_for_their_reason():
    _, _, _, fed, names, out = _case(5)
    ok, mismatch, _ = _check(names[:-1], out[:-1], names, out, fed)
    assert not ok and mismatch.reason == "count"
    bad = [o.clone() for o in out]
    bad[0][3] = float("nan")
    ok, mismatch, _ = _check(names, bad, names, out, fed)
    assert not ok and mismatch.reason == "nonfinite"
    ok, mismatch, _ = _check(names, [out[0].float(), *out[1:]], names, out, fed)
    assert not ok and mismatch.reason == "dtype"
    with pytest.raises(decode.StepShapeError, match="hidden, state"):
        decode.flatten_step(out[0])


# ----- through the harness ----------------------------------------------------------------------------------------
@requires_cpu_mode
def test_the_reference_submitted_as_a_candidate_is_correct_in_cpu_mode():
    res = Evaluator(SPEC, "cpu").evaluate(SPEC.reference_source(), salt=5)
    assert res.correct and res.error is None and not res.flags, res.message
    kinds = [c.kind for c in res.checks]
    assert kinds.count("grading") == len(SPEC.shapes.cpu) * len(SPEC.seeds)
    assert kinds.count("timing") == 2 * len(SPEC.shapes.cpu)  # each shape's last run: first and last step
    assert res.interface == "decode" and res.max_launches == 1 and len(res.timings) == len(SPEC.shapes.cpu)


@requires_cpu_mode
def test_a_step_that_is_only_right_from_a_fresh_state_fails_in_timing():
    """A candidate correct on the harness's fed states but lazy once it is fed its own state
    (the chained steps of a timed run): the last timed step is checked from the candidate's own
    state, so it fails there."""
    lazy = SPEC.reference_source() + '''

_honest_step = Model.step


def _lazy_step(self, hidden, state):
    if getattr(state, "_mine", False):  # its own state comes back: skip the work
        out = _StateList(state)
        out[3] = {k: torch.cat([v, v[-1:]]) for k, v in state[3].items()}
        return hidden, out
    h, new = _honest_step(self, hidden, state)
    return h, _StateList(new)


class _StateList(list):
    _mine = True


Model.step = _lazy_step
'''
    res = Evaluator(SPEC, "cpu").evaluate(lazy, salt=6)
    assert not res.correct and res.error is not None and res.error.value == "mismatch", res.message
    failed = [c for c in res.checks if not c.ok]
    assert failed and failed[0].kind == "timing"


def _small_gpu_spec():
    """One GPU shape (short runs), one seed, one timing round: the launch-cap tests time little."""
    from kb_env.problem import Shapes, Timing

    shape = {**GPU0, "steps": 4}
    return SPEC.model_copy(update={"shapes": Shapes(gpu=[shape], cpu=SPEC.shapes.cpu), "seeds": [0],
                                   "timing": Timing(warmup=1, reps=3, rounds=1, input_sets=1)})


@requires_cuda
def test_on_a_gpu_the_launch_cap_flags_a_multi_kernel_step_with_its_count():
    """The bf16 baseline as a candidate: a correct step of hundreds of kernels."""
    spec, src = _small_gpu_spec(), (SPEC.folder / "baseline.py").read_text()
    capped = Evaluator(spec, "cuda").evaluate(src)
    assert capped.correct and "too_many_launches" in capped.flags and capped.kernel_launches > 50
    assert f"{capped.kernel_launches} kernel launches per step" in kb_env.feedback.render(capped)
    uncapped = Evaluator(spec, "cuda", launch_cap=False).evaluate(src)
    assert uncapped.correct and "too_many_launches" not in uncapped.flags and uncapped.max_launches is None
