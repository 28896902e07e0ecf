"""w4a16_gemm: the packing and quantization are as problem.yaml states them, and the bar tells
apart the mistakes a kernel makes with that layout (nibbles swapped, zeros or scales ignored,
groups taken along N)."""

from __future__ import annotations

import pytest
import torch

from kb_env import get_problem
from kb_env.evaluate.correctness import compare_outputs
from kb_env.problem import import_file
from kb_env.sandbox.cases import make_inputs, make_reference_model

SPEC = get_problem("w4a16_gemm")
REF = import_file(SPEC.reference_path, "_w4a16_ref")


def test_quantizer_follows_the_stated_rule():
    torch.manual_seed(0)
    w = torch.randn(256, 6) * 0.02
    qweight, scales, zeros = REF.quantize(w)
    assert qweight.dtype == torch.uint8 and qweight.shape == (128, 6)
    assert scales.dtype == zeros.dtype == torch.bfloat16 and scales.shape == zeros.shape == (2, 6)
    for g, n in [(0, 0), (1, 5), (0, 3)]:
        block = w[128 * g : 128 * (g + 1), n]
        scale = (block.max() - block.min()) / 15
        zero = torch.round(-block.min() / scale).clamp(0, 15)
        assert scales[g, n] == scale.to(torch.bfloat16) and zeros[g, n] == zero
        for k in (0, 1, 77, 127):  # even rows in the low nibble, odd rows in the high nibble
            byte = int(qweight[64 * g + k // 2, n])
            code = (byte >> 4) if k % 2 else (byte & 0xF)
            assert code == int(torch.round(block[k] / scale + zero).clamp(0, 15))
    q = REF.unpack(qweight).reshape(2, 128, 6).float()
    dequant = ((q - zeros.float()[:, None]) * scales.float()[:, None]).reshape(256, 6)
    step = scales.float().repeat_interleave(128, 0)
    error = (dequant - w).abs() / step  # rounding to the grid, which the integer zero shifts by up to half a step
    assert float(error.max()) <= 1.0 and float(error.mean()) < 0.3


def _mistakes(model, x: torch.Tensor) -> dict[str, torch.Tensor]:
    K, N = 2 * model.qweight.shape[0], model.qweight.shape[1]
    low, high = (model.qweight & 0xF).double(), (model.qweight >> 4).double()
    right = torch.stack([low, high], 1).reshape(K, N)
    swapped = torch.stack([high, low], 1).reshape(K, N)
    s, z = model.scales.double(), model.zeros.double()

    def dequant(q, s, z):
        return ((q.reshape(K // 128, 128, N) - z[:, None]) * s[:, None]).reshape(K, N)

    x64 = x.double()
    return {
        "nibbles swapped": x64 @ dequant(swapped, s, z),
        "zeros ignored": x64 @ dequant(right, s, torch.zeros_like(z)),
        "scales ignored": x64 @ dequant(right, torch.full_like(s, float(s.mean())), z),
        "groups along N": x64 @ ((right - z.mean(0)) * s.mean(0)),
    }


@pytest.mark.parametrize("shape_index", range(len(SPEC.shapes.cpu)))
def test_layout_mistakes_fail_the_bar(shape_index):
    shape = SPEC.shapes.cpu[shape_index]
    model = make_reference_model(REF, shape, param_seed=0)
    x, = make_inputs(REF, shape, 0, "cpu")
    with torch.no_grad():
        expected = model(x)
    for mistake, y in _mistakes(model, x).items():
        ok, _, stats = compare_outputs([y.to(torch.bfloat16)], [expected], SPEC.tolerance)
        assert not ok, f"{mistake} passes (rel-L2 {stats['rel_l2_err']:.3g})"
    ok, mismatch, _ = compare_outputs([REF.oracle(model, [x]).to(torch.bfloat16)], [expected], SPEC.tolerance)
    assert ok, mismatch  # while the exact dequantization, rounded once, passes


def test_packing_is_kimi_linear_decodes():
    """The issue asks for kimi_linear_decode's int4 layout: the same codes, scales and zeros."""
    kimi = import_file(get_problem("kimi_linear_decode").reference_path, "_kimi_ref")
    torch.manual_seed(1)
    w = torch.randn(384, 24) * 0.02
    ours, theirs = REF.quantize(w), kimi.quantize_w4(w, 128)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert torch.equal(REF.unpack(ours[0]), kimi.unpack_w4(ours[0]))
