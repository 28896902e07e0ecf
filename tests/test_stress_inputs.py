"""Stress inputs (`problem.yaml: stress`): the reference and candidate workers draw identical
transformed inputs from one seed, the transform changes only floating tensors, and a heavy tail
is really heavy."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from kb_env.sandbox import cases
from kb_env.sandbox.cases import make_inputs


def _reference(n: int = 200_000):
    """A stand-in reference module: one float input, one integer input."""
    return SimpleNamespace(get_inputs=lambda n=n: [torch.randn(n), torch.randint(0, 10, (n,))])


def _kurtosis(x: torch.Tensor) -> float:
    x = x.double()
    x = x - x.mean()
    return float((x**4).mean() / (x**2).mean() ** 2)


def test_same_seed_and_stress_draw_identical_inputs():
    ref = _reference()
    a = make_inputs(ref, {}, 7, "cpu", {"scale": 1.0, "heavy_tail": 3})
    b = make_inputs(ref, {}, 7, "cpu", {"scale": 1.0, "heavy_tail": 3})
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    c = make_inputs(ref, {}, 8, "cpu", {"scale": 1.0, "heavy_tail": 3})
    assert not torch.equal(a[0], c[0])


def test_scale_multiplies_floating_inputs_only():
    ref = _reference()
    plain = make_inputs(ref, {}, 3, "cpu")
    scaled = make_inputs(ref, {}, 3, "cpu", {"scale": 64.0, "heavy_tail": None})
    assert torch.equal(scaled[0], plain[0] * 64)
    assert torch.equal(scaled[1], plain[1])  # integer inputs are left alone


def test_heavy_tail_turns_normal_inputs_student_t():
    ref = _reference()
    plain = make_inputs(ref, {}, 5, "cpu")[0]
    heavy = make_inputs(ref, {}, 5, "cpu", {"scale": 1.0, "heavy_tail": 3})[0]
    assert abs(_kurtosis(plain) - 3.0) < 0.1  # normal
    assert _kurtosis(heavy) > 8  # Student-t with 3 dof: infinite in theory, large in any sample
    assert float(heavy.abs().max()) > 3 * float(plain.abs().max())
    assert torch.equal(torch.sign(heavy), torch.sign(plain))  # a positive factor per element


def test_heavy_tail_keeps_the_dtype():
    ref = SimpleNamespace(get_inputs=lambda: [torch.randn(1000).to(torch.bfloat16)])
    out = make_inputs(ref, {}, 1, "cpu", {"scale": 0.5, "heavy_tail": 4})[0]
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_large_inputs_are_transformed_slice_by_slice_alike(monkeypatch):
    """Inputs larger than a slice (here 1000 elements) are transformed slice by slice (peak memory one
    more copy of the input): still identical in both workers, still heavy-tailed, signs kept, and a
    strided input keeps its layout."""
    monkeypatch.setattr(cases, "STRESS_SLICE", 1000)
    ref = SimpleNamespace(get_inputs=lambda: [torch.randn(300, 200), torch.randn(50, 40).t()])
    stress = {"scale": 2.0, "heavy_tail": 3}
    a, b = make_inputs(ref, {}, 9, "cpu", stress), make_inputs(ref, {}, 9, "cpu", stress)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    plain = make_inputs(ref, {}, 9, "cpu")
    assert _kurtosis(a[0]) > 8 and torch.equal(torch.sign(a[0]), torch.sign(plain[0]))
    assert a[1].stride() == plain[1].stride() and torch.equal(torch.sign(a[1]), torch.sign(plain[1]))
    scaled = make_inputs(ref, {}, 9, "cpu", {"scale": 2.0})
    assert torch.equal(scaled[1], plain[1] * 2)


def test_inputs_and_weights_are_built_on_one_thread_whatever_the_caller_set():
    """Two processes draw the same inputs only if they do the same arithmetic; torch's CPU ops are
    not the same arithmetic on every thread (see `cases`), so both are built on one thread, and a
    thread count the caller set (a candidate may set its own) comes back afterwards."""
    seen = []

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            seen.append(("model", torch.get_num_threads()))

    def get_inputs():
        seen.append(("inputs", torch.get_num_threads()))
        return [torch.randn(8)]

    ref = SimpleNamespace(get_inputs=get_inputs, get_init_inputs=lambda: [], Model=Model)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        make_inputs(ref, {}, 1, "cpu", {"heavy_tail": 3})
        cases.make_reference_model(ref, {}, 1)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen == [("inputs", 1), ("model", 1)]

