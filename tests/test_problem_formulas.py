"""Every problem's FLOPs and bytes formula, unit-tested against the work its reference really does.

FLOPs: the reference Model's forward is traced with ``make_fx`` into primitive ATen/prims ops
(the core-ATen decompositions, plus the composites that core ATen keeps whole: softmax, GELU,
mean) and counted by `count_flops`:

- a matrix product (mm, bmm) is 2*M*N*K, addmm/baddbmm add M*N for the added term;
- a pointwise arithmetic op (add, mul, exp, tanh, rsqrt, pow, ...) is 1 FLOP per output element;
- a reduction (sum, amax, ...) is 1 FLOP per input element, and so is a sort (the least a
  selection does: one comparison per element);
- a scan (cumsum) is 1 FLOP per input element: one add each, like a reduction;
- a variance (prims.var, from LayerNorm) is 3 FLOPs per input element: subtract the mean, square,
  accumulate (the mean's own sum is a separate node, counted as a reduction);
- a convolution is 2 * (C_in / groups) * kh * kw FLOPs per output element (a multiply and an add
  per weight tap), plus 1 per output element for the bias when there is one;
- a comparison (ne, ...) or a select (where) is 1 FLOP per output element, like pointwise
  arithmetic (cross-entropy's ignore_index bookkeeping);
- attention (torch's scaled_dot_product_attention, kept whole) is the textbook math per score it
  does not mask: 2*D for q.k, 1 for the scale, 5 for the softmax (max, subtract, exp, sum,
  divide) and 2*Dv for the p.v product. A causal mask (``is_causal``, top-left aligned as torch
  aligns it) leaves the scores of keys at or before the query, S*(S+1)/2 per head when S == Sk:
  that is the work a kernel needs, the dense-equivalent count of the unmasked scores. Counting
  the masked half too would let a good causal kernel's peak_fraction pass 1.
  `test_attention_rule_matches_textbook_math` ties this to a traced explicit computation;
- dtype conversions, views, broadcasts, copies, indexing (gather) and allocations are free.

An op in none of these lists makes the counter raise: a new reference that uses one forces a
decision here rather than being silently counted as zero. The formulas must equal the count
exactly: the trace is deterministic and the conventions above are the ones the problem.yaml
comments use, so any difference is a formula that does not describe its reference.

Bytes: the minimum traffic of one forward: every input tensor, every state_dict tensor
(parameters and buffers) and every output, each moved once.

CPU shapes are traced on real tensors; GPU shapes (too big to materialise here in a few seconds)
on fake tensors, which carry shapes and dtypes only -- `test_fake_trace_counts_like_real_trace`
checks the two agree.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import pytest
import torch
import torch._decomp
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from kb_env.evaluate.roofline import ridge_point, roofline_time_s
from kb_env.hardware import by_key
from kb_env.problem import Interface, all_problems, import_file
from kb_env.sandbox.cases import make_reference_model

aten = torch.ops.aten

# ----- the work counter ----------------------------------------------------------------------
# Core ATen keeps these composites whole; decompose them too, so that what is counted is
# arithmetic rather than a library call.
DECOMPOSITIONS = {
    **torch._decomp.core_aten_decompositions(),
    **torch._decomp.get_decompositions([aten._softmax, aten._log_softmax, aten.gelu, aten.mean, aten.var_mean]),
    **torch._decomp.get_decompositions([aten.native_layer_norm]),
}
# Attention stays whole (its decomposition is masked dense math): see ATTENTION.
del DECOMPOSITIONS[aten._scaled_dot_product_flash_attention_for_cpu.default]

MATMUL = {"mm", "bmm", "addmm", "baddbmm"}
POINTWISE = {
    "add", "sub", "rsub", "mul", "div", "true_divide", "neg", "abs", "reciprocal", "square",
    "exp", "exp2", "expm1", "log", "log1p", "log2", "tanh", "sigmoid", "erf", "sin", "cos",
    "sqrt", "rsqrt", "pow", "maximum", "minimum", "clamp", "clamp_min", "clamp_max", "relu",
    "eq",  # a comparison, 1 per element (logsumexp's guard against an infinite row max)
    "where",  # a select, 1 per element (the same guard)
}
REDUCTION = {"sum", "amax", "amin", "prod", "argmax", "argmin"}
FREE = {
    "_to_copy", "convert_element_type", "to", "clone", "copy", "alias", "detach", "lift_fresh_copy",
    "view", "_unsafe_view", "reshape", "expand", "broadcast_in_dim", "permute", "t", "transpose",
    "squeeze", "unsqueeze", "slice", "select", "as_strided", "contiguous", "collapse_view", "split_dim",
    "empty", "empty_like", "empty_strided", "full", "full_like", "zeros", "zeros_like", "ones", "ones_like",
    "scalar_tensor", "getitem",
    "cat",  # a copy
    "split_with_sizes",  # views
    "index",  # a gather: data movement
}
# Rules added with the Level-1 deck, one per line (see the module docstring for each convention).
SCAN = {"cumsum"}
VARIANCE = {"var"}
CONVOLUTION = {"convolution"}
POINTWISE.add("ne")
POINTWISE.add("where")
FREE.add("gather")
REDUCTION.add("sort")  # a sort selects by comparing: 1 FLOP per input element, as for amax (topk's reference)
FREE.add("bitwise_and")  # integer bit work unpacking packed codes (int4 weights): no floating-point arithmetic
FREE.add("__rshift__")  # (the same, the high nibble)
MATMUL.add("_grouped_mm")  # 2*rows*K*N: every row of the 2-D operand once (each routed token, moe_swiglu_grouped)
ATTENTION = {"_scaled_dot_product_flash_attention_for_cpu"}  # what scaled_dot_product_attention runs on CPU


def _numel(node_or_value) -> int:
    val = node_or_value.meta["val"] if isinstance(node_or_value, torch.fx.Node) else node_or_value
    return val.numel()


def _op_name(target) -> str:
    name = getattr(getattr(target, "overloadpacket", None), "__name__", None) or getattr(target, "__name__", str(target))
    return name[:-1] if name.endswith("_") and not name.startswith("_") else name  # add_ -> add


def _matmul_flops(name: str, node: torch.fx.Node) -> int:
    a, b = (node.args[1], node.args[2]) if name in ("addmm", "baddbmm") else (node.args[0], node.args[1])
    a_shape, b_shape = a.meta["val"].shape, b.meta["val"].shape
    k = a_shape[-1]
    assert b_shape[-2] == k, (a_shape, b_shape)
    out = _numel(node)  # M*N (times the batch for bmm)
    return 2 * out * k + (out if name in ("addmm", "baddbmm") else 0)


def _conv_flops(node: torch.fx.Node) -> int:
    _, weight, bias, _stride, _padding, _dilation, transposed, *_ = node.args
    if transposed:
        raise NotImplementedError("the FLOP counter has no rule for a transposed convolution")
    per_output = weight.meta["val"][0].numel()  # (C_in / groups) * kernel area
    return 2 * _numel(node) * per_output + (_numel(node) if bias is not None else 0)


def causal_scores(s: int, sk: int) -> int:
    """Scores a top-left-aligned causal mask keeps: query i sees keys 0..i, at most sk of them."""
    return s * (s + 1) // 2 if s <= sk else sk * (sk + 1) // 2 + (s - sk) * sk


def _attention_flops(node: torch.fx.Node) -> tuple[int, int]:
    """(matmul, softmax) FLOPs of one attention call, by the module docstring's convention."""
    q, k, v = (a.meta["val"] for a in node.args[:3])
    dropout = node.args[3] if len(node.args) > 3 else 0.0
    causal = node.args[4] if len(node.args) > 4 else node.kwargs.get("is_causal", False)
    if dropout or node.kwargs.get("attn_mask") is not None:
        raise NotImplementedError("the FLOP counter has no rule for attention with dropout or an explicit mask")
    *batch, s, d = q.shape
    sk, dv = k.shape[-2], v.shape[-1]
    heads = 1
    for n in batch:
        heads *= n
    scores = heads * (causal_scores(s, sk) if causal else s * sk)
    return scores * (2 * d + 2 * dv), scores * 6


@dataclass
class Work:
    matmul: int  # matrix products and convolutions
    pointwise: int
    reduction: int
    ops: Counter  # op name -> FLOPs it contributed

    @property
    def flops(self) -> int:
        return self.matmul + self.pointwise + self.reduction


def count_flops(graph: torch.fx.Graph) -> Work:
    """FLOPs of a traced (decomposed) graph, by the conventions in the module docstring."""
    work = Work(0, 0, 0, Counter())
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        name = _op_name(node.target)
        if name in FREE:
            continue
        if name in MATMUL:
            n = _matmul_flops(name, node)
            work.matmul += n
        elif name in POINTWISE:
            n = _numel(node)
            work.pointwise += n
        elif name in REDUCTION or name in SCAN:
            n = _numel(node.args[0])
            work.reduction += n
        elif name in VARIANCE:
            n = 3 * _numel(node.args[0])
            work.reduction += n
        elif name in CONVOLUTION:
            n = _conv_flops(node)
            work.matmul += n
        elif name in ATTENTION:
            products, softmax = _attention_flops(node)
            work.matmul += products
            work.pointwise += softmax
            n = products + softmax
        else:
            raise NotImplementedError(f"the FLOP counter has no rule for {node.target} ({name}); "
                                      "add it to one of the rule lists in this module (MATMUL, POINTWISE, REDUCTION, CONVOLUTION, ATTENTION, FREE, ...)")
        work.ops[name] += n
    return work


def trace(fn, *args) -> torch.fx.Graph:
    with torch.no_grad():
        return make_fx(fn, decomposition_table=DECOMPOSITIONS)(*args).graph


# ----- the problems ---------------------------------------------------------------------------
PROBLEMS = all_problems()
FORWARD = {name: spec for name, spec in PROBLEMS.items() if spec.interface is Interface.forward}


@lru_cache(maxsize=None)
def _reference(name: str):
    return import_file(PROBLEMS[name].reference_path, f"_formula_ref_{name}")


def _tensor_bytes(values) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


@dataclass
class Measured:
    work: Work
    input_bytes: int
    state_bytes: int
    output_bytes: int

    @property
    def bytes(self) -> int:
        return self.input_bytes + self.state_bytes + self.output_bytes


def _measure(name: str, shape: dict[str, int]) -> Measured:
    ref = _reference(name)
    model = make_reference_model(ref, shape, param_seed=0).eval()
    torch.manual_seed(0)
    inputs = ref.get_inputs(**shape)
    with torch.no_grad():
        out = model(*inputs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    graph = trace(lambda *xs: model(*xs), *inputs)
    return Measured(count_flops(graph), _tensor_bytes(inputs), _tensor_bytes(model.state_dict().values()),
                    _tensor_bytes(outs))


@lru_cache(maxsize=None)
def measure(name: str, shape_items: tuple, fake: bool) -> Measured:
    shape = dict(shape_items)
    if not fake:
        return _measure(name, shape)
    with FakeTensorMode():  # shapes and dtypes only: a GPU-sized problem costs nothing
        return _measure(name, shape)


def _cases():
    for name, spec in FORWARD.items():
        for where in ("cpu", "gpu"):
            for i, shape in enumerate(getattr(spec.shapes, where)):
                yield pytest.param(name, shape, where == "gpu", id=f"{name}-{where}{i}")


CASES = list(_cases())

# ----- the counter itself -------------------------------------------------------------------
def test_counter_counts_matmul_pointwise_and_reduction():
    a, b, c = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5)
    work = count_flops(trace(lambda a, b, c: torch.addmm(c, a, b).exp().sum(-1), a, b, c))
    assert (work.matmul, work.pointwise, work.reduction) == (2 * 3 * 5 * 4 + 3 * 5, 3 * 5, 3 * 5)
    x = torch.randn(2, 3, 4)
    work = count_flops(trace(lambda x: torch.bmm(x, x.transpose(1, 2)).float() * 2, x))
    assert (work.matmul, work.pointwise) == (2 * 2 * 3 * 3 * 4, 2 * 3 * 3)


def test_counter_sees_primitives_not_composites():
    """Softmax, tanh-GELU and RMS norm reach the counter as primitive arithmetic (on this torch)."""
    x = torch.randn(4, 8)
    soft = count_flops(trace(lambda x: torch.softmax(x, dim=-1), x))
    assert dict(soft.ops) == {"amax": 32, "sub": 32, "exp": 32, "sum": 32, "div": 32}
    gelu = count_flops(trace(lambda x: F.gelu(x, approximate="tanh"), x))
    assert set(gelu.ops) == {"mul", "add", "tanh"} and gelu.ops["tanh"] == 32
    assert gelu.flops == 9 * 32  # x*x*x, *0.044715, +x, *sqrt(2/pi), tanh, +1, *x, *0.5
    rms = count_flops(trace(lambda x, w: F.rms_norm(x, (8,), w, 1e-6), x, torch.randn(8)))
    assert set(rms.ops) == {"pow", "sum", "div", "add", "rsqrt", "mul"}
    assert rms.flops == 4 * 32 + 3 * 4


def test_counter_counts_scan_variance_convolution_and_selects():
    """The conventions added for the Level-1 deck, on the ops that reach the counter."""
    x = torch.randn(4, 8)
    assert dict(count_flops(trace(lambda x: x.cumsum(-1), x)).ops) == {"cumsum": 32}
    ln = count_flops(trace(lambda x, w, b: F.layer_norm(x, (8,), w, b, 1e-5), x, torch.randn(8), torch.randn(8)))
    assert dict(ln.ops) == {"var": 3 * 32, "sum": 32, "div": 4, "add": 4 + 32, "rsqrt": 4, "sub": 32, "mul": 2 * 32}
    img, w = torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3)
    conv = count_flops(trace(lambda x, w, b: F.conv2d(x, w, b, padding=1), img, w, torch.randn(4)))
    assert conv.matmul == 2 * (2 * 4 * 5 * 5) * (3 * 3 * 3) + 2 * 4 * 5 * 5
    strided = count_flops(trace(lambda x, w: F.conv2d(x, w, stride=2, groups=3), img, torch.randn(6, 1, 3, 3)))
    assert strided.matmul == 2 * (2 * 6 * 2 * 2) * (1 * 3 * 3)
    ce = count_flops(trace(lambda x, t: F.cross_entropy(x, t, reduction="none"), x, torch.tensor([0, 7, 3, 3])))
    assert dict(ce.ops) == {"amax": 32, "sub": 2 * 32, "exp": 32, "sum": 32, "log": 4, "ne": 2 * 4, "where": 2 * 4,
                            "neg": 4}


def test_counter_refuses_an_op_it_has_no_rule_for():
    with pytest.raises(NotImplementedError, match="bessel_j0"):
        count_flops(trace(lambda x: torch.special.bessel_j0(x), torch.randn(3, 4)))


def test_convolution_rule_counts_multiply_adds():
    """A 1x1 convolution is a matrix product and counts like one; a 3x3 one with bias and a
    grouped one by hand (2 per multiply-add over C_in / groups * 9 taps, 1 per output for the bias)."""
    x, w = torch.randn(2, 6, 5, 7), torch.randn(4, 6, 1, 1)
    conv = count_flops(trace(lambda x, w: F.conv2d(x, w), x, w))
    product = count_flops(trace(lambda x, w: w.view(4, 6) @ x.view(2, 6, 35), x, w))
    assert conv.flops == product.flops == 2 * (2 * 4 * 35) * 6
    b = torch.randn(4)
    assert count_flops(trace(lambda x, w, b: F.conv2d(x, w, b, padding=1), x, torch.randn(4, 6, 3, 3), b)).flops == (
        2 * (2 * 4 * 35) * 6 * 9 + 2 * 4 * 35)
    assert count_flops(trace(lambda x, w: F.conv2d(x, w, groups=2), x, torch.randn(4, 3, 3, 3))).flops == (
        2 * (2 * 4 * 3 * 5) * 3 * 9)


def test_attention_rule_matches_textbook_math():
    """Attention counts what softmax(q k^T * scale) v does when traced as explicit math, per
    score; causal keeps S*(S+1)/2 of the S*S scores per head; grouped-query counts per query head."""
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    fused = count_flops(trace(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v))
    explicit = count_flops(trace(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) * 8**-0.5, -1) @ v, q, k, v))
    assert set(fused.ops) == set(ATTENTION) and set(explicit.ops) == {"bmm", "mul", "amax", "sub", "exp", "sum", "div"}
    assert fused.flops == explicit.flops == 2 * 3 * 5 * 7 * (2 * 8 + 6 + 2 * 8)
    q = torch.randn(2, 3, 7, 8)
    causal = count_flops(trace(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v))
    assert causal.flops == 2 * 3 * (7 * 8 // 2) * (2 * 8 + 6 + 2 * 8)
    q6 = torch.randn(2, 6, 7, 8)
    gqa = count_flops(trace(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                            q6, k, v))
    wide = count_flops(trace(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                             q6, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)))
    assert gqa.flops == wide.flops == 2 * causal.flops


# ----- the formulas ---------------------------------------------------------------------------
@pytest.mark.parametrize("name,shape,fake", list(CASES))
def test_flops_formula_matches_counted_work(name, shape, fake):
    spec = PROBLEMS[name]
    work = measure(name, tuple(shape.items()), fake).work
    formula = spec.flops_of(shape)
    assert formula == work.flops, (
        f"{name} {shape}: flops formula {spec.flops!r} = {formula:.0f}, the reference does {work.flops} "
        f"(matmul {work.matmul}, pointwise {work.pointwise}, reduction {work.reduction}; by op {dict(work.ops)})")


@pytest.mark.parametrize("name,shape,fake", CASES)
def test_bytes_formula_matches_tensor_traffic(name, shape, fake):
    spec = PROBLEMS[name]
    m = measure(name, tuple(shape.items()), fake)
    assert m.input_bytes > 0 and m.output_bytes > 0
    assert spec.bytes_of(shape) == m.bytes, (
        f"{name} {shape}: bytes formula {spec.bytes!r} = {spec.bytes_of(shape):.0f}, the tensors move {m.bytes} "
        f"(inputs {m.input_bytes}, state_dict {m.state_bytes}, outputs {m.output_bytes})")


@pytest.mark.parametrize("name", sorted(FORWARD))
def test_fake_trace_counts_like_real_trace(name):
    spec = PROBLEMS[name]
    if spec.gpu_only:
        pytest.skip(f"{name} is GPU-only: its shapes are traced on fake tensors only")
    shape = tuple(spec.shapes.cpu[0].items())
    real, fake = measure(name, shape, False), measure(name, shape, True)
    assert fake.work.ops == real.work.ops
    # Some work was counted, unless the problem is pure data movement (a permute copy: 0 FLOPs).
    assert fake.work.flops > 0 or spec.flops_of(dict(shape)) == 0
    assert (fake.input_bytes, fake.state_bytes, fake.output_bytes) == (real.input_bytes, real.state_bytes, real.output_bytes)


# ----- roofline regime ------------------------------------------------------------------------
REGIME_GPUS = ("h100-sxm", "h200")  # the GPUs the deck is measured on
REGIME_MARGIN = 1.5  # how far from the ridge a declared regime must be: not a borderline call


def test_every_problem_declares_its_regime():
    assert [name for name, spec in PROBLEMS.items() if spec.regime is None] == []


@pytest.mark.parametrize("gpu_key", REGIME_GPUS)
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_declared_regime_follows_from_the_formulas(name, gpu_key):
    """problem.yaml's `regime` (one, or one per shape) holds for every GPU shape on these GPUs, at
    least REGIME_MARGIN times away from the ridge point (the product's intensity over the GPU's
    FLOP/s per byte/s). A problem with no FLOPs at all (pure data movement) is memory-bound
    whatever the GPU."""
    spec = PROBLEMS[name]
    if spec.regime is None:
        pytest.skip(f"{name} declares no regime")
    gpu = by_key(gpu_key)
    ridge = ridge_point(gpu, spec.compute_dtype)
    for i, shape in enumerate(spec.shapes.gpu):
        flops, nbytes = spec.flops_of(shape), spec.bytes_of(shape)
        intensity = flops / nbytes
        assert roofline_time_s(flops, nbytes, gpu, spec.compute_dtype)[1] == spec.regime_of(i), (
            f"{name} {shape}: {intensity:.3g} FLOP/byte against a {gpu.name} ridge of {ridge:.3g} ({spec.compute_dtype})")
        assert intensity == 0 or max(intensity / ridge, ridge / intensity) >= REGIME_MARGIN, (
            f"{name} {shape}: {intensity:.3g} FLOP/byte is within {REGIME_MARGIN}x of the {gpu.name} ridge {ridge:.3g}")
