"""What the Level-1 problems' descriptions claim about their tolerances and rules, checked on the CPU.

Each problem.yaml says why its bar is what it is (which honest orders pass, which shortcuts fail);
these tests hold it to that, with the harness's own input generation (`make_inputs`, stress
included) and comparison (`compare_outputs`). Float32 accumulation orders are emulated with torch
float32 arithmetic on the CPU, a few rows at the GPU shapes' row lengths.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kb_env.evaluate.correctness import compare_outputs
from kb_env.evaluate.oprules import op_flags
from kb_env.problem import get_problem, import_file
from kb_env.sandbox.cases import make_inputs, make_reference_model
from kb_env.sandbox.oprecord import OpRecorder


def _problem(name: str):
    spec = get_problem(name)
    return spec, import_file(spec.reference_path, f"_claims_{name}")


def _passes(spec, got: torch.Tensor, expected: torch.Tensor) -> bool:
    return compare_outputs([got], [expected], spec.tolerance)[0]


def _rel_l2(got: torch.Tensor, exact: torch.Tensor) -> float:
    return float((got.double() - exact).norm() / exact.norm())


# ----- float32 accumulation orders ---------------------------------------------------------------
def _lane_sum(x: torch.Tensor, lanes: int) -> torch.Tensor:
    """Row sums as a blocked kernel adds: each of `lanes` lanes walks the row, then a tree."""
    rows, cols = x.shape
    padded = torch.zeros(rows, -(-cols // lanes) * lanes)
    padded[:, :cols] = x
    acc = torch.zeros(rows, lanes)
    for block in padded.view(rows, -1, lanes).unbind(1):
        acc = acc + block
    while acc.shape[1] > 1:
        acc = acc[:, 0::2] + acc[:, 1::2]
    return acc[:, 0]


def _sequential_scan(x: torch.Tensor) -> torch.Tensor:
    """A single float32 running total walked along each row (its last column is the row sum)."""
    out = torch.empty_like(x)
    total = torch.zeros(x.shape[0], dtype=x.dtype)
    for j in range(x.shape[1]):
        total = total + x[:, j]
        out[:, j] = total
    return out


def _blocked_scan(x: torch.Tensor, block: int = 4096) -> torch.Tensor:
    """Blocks scanned in float32 (cumsum within a block) plus a float32 running total."""
    out = torch.empty_like(x)
    total = torch.zeros(x.shape[0], 1)
    for start in range(0, x.shape[1], block):
        part = x[:, start:start + block]
        out[:, start:start + block] = torch.cumsum(part, dim=-1) + total
        total = total + part.sum(dim=-1, keepdim=True)
    return out


def test_sum_inner_blocked_order_passes_and_row_sequential_order_fails():
    spec, ref = _problem("sum_inner")
    x = make_inputs(ref, {"rows": 64, "cols": 16384}, 0, "cpu")[0]
    expected = x.sum(dim=-1)  # torch's own (blocked) order
    assert _passes(spec, _lane_sum(x, 4096), expected)
    assert _passes(spec, _lane_sum(x, 256), expected)
    sequential = _sequential_scan(x)[:, -1]
    assert _rel_l2(sequential, x.double().sum(dim=-1)) > 1e-6
    assert not _passes(spec, sequential, expected)


def test_cumsum_float32_orders_pass_against_torch_cuda_order_and_bfloat16_fails():
    """At the first GPU shape's row length: torch's CUDA order (emulated) is within half the bar of
    float64; a blocked scan and a row-sequential loop pass against it; a bfloat16 running total fails."""
    spec, ref = _problem("cumsum_rows")
    shape = spec.shapes.gpu[0]
    x = make_inputs(ref, {"rows": 4, "cols": shape["cols"]}, 0, "cpu")[0]
    exact = x.double().cumsum(dim=-1)
    cuda_order = ref.gpu_accumulation(None, [x])
    assert _rel_l2(cuda_order, exact) <= 0.5 * spec.tolerance["float32"].max_rel_l2
    assert _passes(spec, _blocked_scan(x), cuda_order)
    assert _passes(spec, _sequential_scan(x), cuda_order)
    assert not _passes(spec, _blocked_scan(x.bfloat16()).float(), cuda_order)


def test_cumsum_gpu_accumulation_is_a_float32_scan_of_its_input():
    """The emulation is the cumulative sum (to float32 accuracy), in the input's dtype, any length."""
    _, ref = _problem("cumsum_rows")
    x = torch.randn(3, 1000)
    out = ref.gpu_accumulation(None, [x])
    assert out.dtype == x.dtype and out.shape == x.shape
    torch.testing.assert_close(out, x.double().cumsum(-1).float(), rtol=1e-5, atol=1e-4)


def test_cross_entropy_logsumexp_minus_logit_order_passes_at_every_scale():
    """At the first GPU shape's vocabulary, the float32 order lse - logit (a confident row's small
    loss as a difference of two large numbers) stays within atol, scaled by 64 too."""
    spec, ref = _problem("cross_entropy")
    shape = {"rows": 16, "vocab": spec.shapes.gpu[0]["vocab"]}
    for stress in (None, {"scale": 64.0}, {"heavy_tail": 3}):
        logits, targets = make_inputs(ref, shape, 0, "cpu", stress)
        expected = ref.Model()(logits, targets)
        x = logits.float()
        other_order = torch.logsumexp(x, dim=-1) - x[torch.arange(shape["rows"]), targets]
        assert _passes(spec, other_order, expected), stress


def test_gelu_tanh_approximation_fails():
    spec, ref = _problem("gelu")
    x = make_inputs(ref, spec.shapes.cpu[0], 0, "cpu")[0]
    exact = ref.Model()(x)
    assert not _passes(spec, F.gelu(x, approximate="tanh"), exact)
    assert _passes(spec, F.gelu(x.double()).to(x.dtype), exact)


def test_layernorm_misplaced_eps_fails_on_scaled_down_inputs():
    spec, ref = _problem("layernorm")
    shape = spec.shapes.cpu[0]
    model = make_reference_model(ref, shape, 0)
    x = make_inputs(ref, shape, 0, "cpu", {"scale": 0.015625})[0]
    with torch.no_grad():
        expected = model(x)
        xf = x.float()
        centred = xf - xf.mean(dim=-1, keepdim=True)
        std = centred.pow(2).mean(dim=-1, keepdim=True).sqrt()
        misplaced = (centred / (std + model.eps) * model.weight.float() + model.bias.float()).to(x.dtype)
        right = (centred / (std.pow(2) + model.eps).sqrt() * model.weight.float() + model.bias.float()).to(x.dtype)
    assert _passes(spec, right, expected)
    assert not _passes(spec, misplaced, expected)


def test_conv2d_one_rounding_and_cuda_two_roundings_are_within_half_the_bar():
    """The CPU reference adds the bias before its one rounding; torch on CUDA rounds the convolution,
    then adds the bias in bfloat16. Either side of that may be the reference: both pass the other."""
    spec, ref = _problem("conv2d_3x3")
    shape = spec.shapes.cpu[0]
    model = make_reference_model(ref, shape, 0)
    x = make_inputs(ref, shape, 0, "cpu")[0]
    with torch.no_grad():
        once = model(x)
        twice = F.conv2d(x, model.weight, None, padding=1) + model.bias[None, :, None, None]
    assert twice.dtype == torch.bfloat16 and not torch.equal(once, twice)
    assert _rel_l2(twice, once.double()) <= 0.5 * spec.tolerance["bfloat16"].max_rel_l2
    assert _passes(spec, twice, once) and _passes(spec, once, twice)


def test_gemm_float16_shortcut_overflows_on_scaled_up_inputs():
    spec, ref = _problem("gemm_bf16_square")
    a, b = make_inputs(ref, spec.shapes.cpu[1], 0, "cpu", {"scale": 64.0})
    expected = a @ b
    shortcut = (a.half() @ b.half()).to(torch.bfloat16)
    ok, mismatch, _ = compare_outputs([shortcut], [expected], spec.tolerance)
    assert not ok and mismatch.reason == "nonfinite"


def test_permute_copy_torch_one_liner_is_a_forbidden_op():
    spec, ref = _problem("permute_copy")
    x = make_inputs(ref, spec.shapes.cpu[1], 0, "cpu")[0]
    with torch.no_grad(), OpRecorder() as recorder:
        x.permute(0, 2, 3, 1).contiguous()
    assert "forbidden_op:aten::clone" in op_flags(recorder.ops, spec.forbidden)
