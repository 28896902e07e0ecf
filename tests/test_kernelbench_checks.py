"""The importer's parts, in this process on tiny problems: the static scan (names, levels, network
use), the fake-tensor trace (FLOPs and bytes against hand counts), the checks that keep degenerate
or unfair problems out, the tolerance table, and the rules derived from a reference."""

from __future__ import annotations

import textwrap

import pytest
import torch

from kb_env.evaluate.correctness import compare_outputs
from kb_env.kernelbench import Budget
from kb_env.kernelbench.checks import Skip, run_checks
from kb_env.kernelbench.materialize import cpu_mode
from kb_env.kernelbench.rules import compute_dtype, forbidden, regime
from kb_env.kernelbench.scan import find_files, level_dirs, static_reason
from kb_env.kernelbench.tolerance import TABLE, tolerance_for
from kb_env.kernelbench.trace import trace
from kb_env.problem import import_source

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


def problem(body: str):
    """A KernelBench-style module from its source (after the usual imports)."""
    return import_source(HEADER + textwrap.dedent(body), "kb_test_problem", "<test problem>")


def simple(forward: str, inputs: str = "[torch.randn(8, 64)]", extra: str = "pass"):
    """A problem with no init inputs: `forward` of x, after `extra` in __init__."""
    return problem(
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        f"        {extra}\n"
        "    def forward(self, x):\n"
        f"        return {forward}\n"
        f"def get_inputs():\n    return {inputs}\n"
        "def get_init_inputs():\n    return []\n")


# ----- the static scan ---------------------------------------------------------------------------
@pytest.mark.parametrize("source,words", [
    ("def f(:\n", ["syntax error at line 1"]),
    ("from transformers import AutoModel\n", ["needs the network", "imports transformers"]),
    ("import huggingface_hub.utils\n", ["imports huggingface_hub"]),
    ("import urllib.request\n", ["imports urllib.request"]),
    ("import torch\nm = torch.hub.load('a/b', 'c')\n", ["calls torch.hub.load()", "line 2"]),
    ("import torchvision\nm = torchvision.models.resnet18(pretrained=True)\n", ["pretrained weights"]),
    ("x = Thing.from_pretrained('gpt2')\n", ["calls Thing.from_pretrained()"]),
    ("class Model: pass\ndef get_inputs(): pass\n", ["no get_init_inputs()"]),
    ("def get_inputs(): pass\ndef get_init_inputs(): pass\n", ["no Model at module level"]),
])
def test_static_reasons(source, words):
    why = static_reason(source, "f.py")
    assert why is not None and all(w in why for w in words), why


def test_a_plain_problem_passes_the_static_scan():
    assert static_reason("import torch\nclass Model: pass\ndef get_inputs(): pass\nget_init_inputs = list\n", "f.py") is None


def test_level_folders_are_found_from_the_repository_root_or_a_level(tmp_path):
    for level in ("level1", "level3", "level5"):
        (tmp_path / "KernelBench" / level).mkdir(parents=True)
    (tmp_path / "KernelBench" / "level1" / "7_Odd-name (v2).py").write_text("")
    (tmp_path / "KernelBench" / "level5" / "1_Future.py").write_text("")
    assert [lv for lv, _ in level_dirs(tmp_path)] == [1, 3, 5]
    assert level_dirs(tmp_path / "KernelBench" / "level3") == [(3, tmp_path / "KernelBench" / "level3")]
    files, other = find_files(tmp_path)
    assert [f.name for f in files] == ["level1-7_Odd_name__v2_"]  # a valid env id
    assert other == [("level5/1_Future.py", "level 5 is not one of KernelBench's levels 1-4")]


# ----- the trace ---------------------------------------------------------------------------------
def test_trace_counts_products_and_tensor_bytes():
    mod = problem("""
        class Model(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.a = nn.Linear(d, 2 * d)
                self.b = self.a  # the same weights twice: moved once
                self.register_buffer("scale", torch.ones(2 * d))
            def forward(self, x, n):
                return self.b(x) * self.scale, x.sum() * n

        def get_inputs():
            return [torch.randn(4, 16), 3]

        def get_init_inputs():
            return [16]
        """)
    traced, fake_failed = trace(mod)
    assert fake_failed is None and traced.on == "fake tensors"
    assert traced.flops == 2 * 4 * 16 * 32  # addmm: the product only, not the bias add
    assert traced.flops_by_op == {"aten::addmm": 2 * 4 * 16 * 32}
    assert traced.input_bytes == 4 * 16 * 4 and traced.output_bytes == (4 * 32 + 1) * 4
    assert traced.state_bytes == (16 * 32 + 32 + 32) * 4
    assert {"aten::addmm", "aten::mul", "aten::sum"} <= set(traced.ops)


def test_trace_counts_recurrent_layers_and_cpu_attention():
    b, t, i, h = 2, 5, 8, 16
    lstm = problem(f"""
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = nn.LSTM({i}, {h}, batch_first=True)
            def forward(self, x):
                return self.rnn(x)[0]

        def get_inputs():
            return [torch.randn({b}, {t}, {i})]

        def get_init_inputs():
            return []
        """)
    traced = trace(lstm)[0]
    assert traced.flops == t * 2 * b * 4 * h * (i + h)  # per step: x W_ih^T and h W_hh^T
    # on a GPU the layer dispatches as aten::_cudnn_rnn: forbidden too, as the layer's other name
    assert "aten::lstm" in traced.ops and "aten::_cudnn_rnn" in forbidden(traced.ops, "reference").torch_ops
    sdpa = simple("F.scaled_dot_product_attention(x, x, x)", "[torch.randn(1, 2, 16, 8)]")
    assert trace(sdpa)[0].flops == 2 * (2 * 1 * 2 * 16 * 16 * 8)  # Q K^T and P V


def test_a_reference_that_reads_values_is_traced_on_real_tensors():
    mod = simple("x * 2 if float(x.sum()) > -1e9 else x")
    traced, fake_failed = trace(mod)
    assert traced.on == "real tensors" and fake_failed and traced.output_bytes == 8 * 64 * 4


# ----- the checks --------------------------------------------------------------------------------
def test_an_ordinary_problem_passes_with_a_tolerance_from_the_table():
    checked = run_checks(simple("torch.tanh(x) * 3"), "cpu")
    atol_frac, rtol, bar = TABLE["float32"]
    tol = checked.tolerance["float32"]
    assert (tol.rtol, tol.max_rel_l2) == (rtol, bar) and tol.atol == pytest.approx(atol_frac * checked.rms["float32"], rel=1e-2)
    assert len(checked.stress) == 3 and checked.stress_dropped == []
    assert 0 < checked.oracle_rel_l2[0] < 0.5 * bar


@pytest.mark.parametrize("mod,words", [
    (lambda: simple("torch.softmax(x, -1).sum(-1)"), "barely depends on the input"),
    (lambda: simple("(x.bfloat16() ** 2).mean()", "[torch.randn(64, 1024)]"), "barely depends on the input"),
    (lambda: simple("x * 0"), "all zeros"),
    (lambda: simple("x.mean().expand_as(x).clone()"), "nearly constant"),
    (lambda: simple("torch.relu(x)", "[torch.rand(8, 64)]"), "equals the first input"),
    (lambda: simple("torch.log(x)"), "non-finite"),
    (lambda: simple("x * 2", "[torch.manual_seed(0) and torch.randn(8, 64)]"), "ignores the seed"),
    (lambda: simple("F.dropout(x, 0.5, training=True)"), "not deterministic"),
    (lambda: simple("x + self.h0", extra="self.h0 = torch.randn(64)"), "outside its state_dict"),
    (lambda: simple("(x * 1000 + 1) - x * 1000", "[torch.randn(8, 64).half()]"), "bar is too fine"),
], ids=["near_constant", "averaged_loss", "zeros", "constant", "echo", "nonfinite", "reseeds", "dropout", "stray_tensor", "too_fine"])
def test_a_degenerate_or_unfair_problem_is_skipped(mod, words):
    with pytest.raises(Skip, match=words):
        run_checks(mod(), "cpu")


def test_a_stress_case_that_overflows_the_reference_is_dropped():
    checked = run_checks(simple("torch.exp(x.half())", "[torch.randn(8, 64)]"), "cpu")
    assert {"scale": 8.0} not in checked.stress and {"scale": 0.125} in checked.stress
    assert any(d.startswith("scale=8: the reference's output 0 is not finite") for d in checked.stress_dropped)


def test_the_oracle_follows_code_that_closes_over_submodules():
    """minGPT-style `self.mlpf = lambda x: m.c_proj(...)`: the float64 model is built afresh, so
    the closure holds float64 weights (a deep copy's closure would still hold float32 ones)."""
    checked = run_checks(simple("self.f(x)", extra="m = nn.Linear(64, 64); self.m = m; self.f = lambda x: m(x)"), "cpu")
    assert checked.oracle_note is None and 0 < checked.oracle_rel_l2[0] < 1e-6


def test_a_constant_tensor_outside_the_state_dict_is_fine():
    checked = run_checks(simple("x * self.c", extra="self.c = torch.full((64,), 2.0)"), "cpu")
    assert checked.device == "cpu"


# ----- the tolerance table -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", list(TABLE))
def test_the_table_admits_an_ulp_and_rejects_zeros(dtype):
    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    exp = (torch.randn(256, 256, dtype=torch.float64) * 3).to(dt)
    tol = {dtype: tolerance_for(dtype, float(exp.double().square().mean().sqrt()))}
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[exp.element_size()]
    ulp = (exp.view(bits) + 1).view(dt)  # one ulp away from zero, every element
    assert compare_outputs([ulp], [exp], tol)[0]
    assert not compare_outputs([torch.zeros_like(exp)], [exp], tol)[0]


def test_float32_admits_another_summation_order_but_not_tf32():
    torch.manual_seed(0)
    a, b = torch.randn(128, 4096), torch.randn(4096, 128)
    ref = a @ b
    tol = {"float32": tolerance_for("float32", float(ref.square().mean().sqrt()))}
    split_k = sum(a[:, i::8] @ b[i::8, :] for i in range(8))
    assert compare_outputs([split_k], [ref], tol)[0]

    def tf32(x):  # round the mantissa to TF32's 10 bits
        return ((x.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)

    assert not compare_outputs([(tf32(a).double() @ tf32(b).double()).float()], [ref], tol)[0]


# ----- rules ---------------------------------------------------------------------------------------
def test_forbidden_modes_and_families():
    ref = forbidden(["aten::addmm", "aten::t", "aten::gelu", "prim::device"], "reference")
    assert {"aten::addmm", "aten::mm", "aten::bmm", "aten::gelu"} <= set(ref.torch_ops)
    assert "aten::t" not in ref.torch_ops and ref.allowed_torch_ops is None
    assert forbidden(["aten::gelu"], "all").allowed_torch_ops == []
    assert forbidden(["aten::gelu"], "none").torch_ops == []


def test_compute_dtype_and_regime():
    assert compute_dtype({"float16": 100, "float32": 10}) == "float16"
    assert compute_dtype({}) == "float32"
    assert regime(0, 1e6, "float32") == "memory-bound"
    assert regime(2 * 8192**3, 3 * 2 * 8192**2, "float16") == "compute-bound"
    assert regime(20 * 1e6, 1e6, "float32") is None  # 20 FLOP/byte: at the H100's float32 ridge


def test_cpu_mode_reasons():
    traced = {"input_bytes": 1000, "state_bytes": 0, "output_bytes": 1000, "flops": 10}
    checked = {"device": "cpu", "reference_ms": 1.0}
    budget = Budget()
    assert cpu_mode(traced, checked, budget, "float32") is None
    assert "too big to check" in cpu_mode(traced, None, budget, "float32")
    assert "checked on a GPU" in cpu_mode(traced, {**checked, "device": "cuda"}, budget, "float32")
    assert "Triton 3.9" in cpu_mode(traced, checked, budget, "bfloat16")
    assert "reference takes" in cpu_mode(traced, {**checked, "reference_ms": 1e4}, budget, "float32")
    assert "MiB of tensors" in cpu_mode({**traced, "input_bytes": 1 << 30}, checked, budget, "float32")
