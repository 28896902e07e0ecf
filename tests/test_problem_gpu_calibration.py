"""GPU-only: every problem's tolerance holds for its reference as run on a GPU, at the GPU shapes.

tests/test_problem_tolerances.py calibrates each bar on the CPU, where torch's kernels are not the
GPU's: cuBLAS and cuDNN pick other orders, CUDA's cumsum carries a float32 total where the CPU adds
in float64, cuDNN rounds a convolution before adding its bias. Here the reference runs on the GPU in
its dtype, on each GPU shape (first grading seed), against a float64 oracle computed on the GPU too
(the Model and inputs upcast with ``.double()``, or the reference module's own ``oracle``): it must
pass the problem's tolerance using at most half of its relative-L2 bar, as on the CPU, so that an
honest kernel has the other half. Skipped without CUDA; run on the GPU machine.
"""

from __future__ import annotations

import gc

import pytest
import torch
from conftest import requires_cuda

from kb_env.evaluate.correctness import compare_outputs
from kb_env.problem import Interface, all_problems, import_file
from kb_env.sandbox.cases import as_output_list, make_inputs, make_reference_model

pytestmark = [requires_cuda, pytest.mark.gpu]

PROBLEMS = {name: spec for name, spec in all_problems().items() if spec.interface is Interface.forward}
HEADROOM = 0.5  # as REFERENCE_HEADROOM in test_problem_tolerances.py


def _upcast(x):
    return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def _rel_l2(got: torch.Tensor, exp: torch.Tensor) -> float:
    got, exp = got.double(), exp.double()
    return float(torch.linalg.vector_norm(got - exp) / torch.linalg.vector_norm(exp))


def _cases():
    for name, spec in sorted(PROBLEMS.items()):
        for i, shape in enumerate(spec.shapes.gpu):
            yield pytest.param(name, shape, id=f"{name}-gpu{i}")


@pytest.mark.parametrize("name,shape", list(_cases()))
def test_gpu_reference_is_within_half_the_bar_of_a_float64_oracle(name, shape):
    spec = PROBLEMS[name]
    ref = import_file(spec.reference_path, f"_gpu_cal_{name}")
    try:
        inputs = make_inputs(ref, shape, spec.seeds[0], "cuda")
        model = make_reference_model(ref, shape, param_seed=1234).to("cuda").eval()
        with torch.no_grad():
            outs = as_output_list(model(*inputs))
            if hasattr(ref, "oracle"):
                oracle = as_output_list(ref.oracle(model, inputs))
            else:
                oracle = as_output_list(model.double()(*[_upcast(x) for x in inputs]))
        for out, orc in zip(outs, oracle):
            if not out.is_floating_point():
                assert torch.equal(out, orc.to(out.dtype))
                continue
            ok, mismatch, _ = compare_outputs([out], [orc.to(out.dtype)], spec.tolerance)
            assert ok, mismatch
            err, bar = _rel_l2(out, orc), spec.tolerance[str(out.dtype).removeprefix("torch.")].max_rel_l2
            assert err <= HEADROOM * bar, f"{name} {shape}: the CUDA reference is {err:.3g} from float64, bar {bar:g}"
    finally:
        inputs = model = outs = oracle = None  # noqa: F841 (free the GPU before the next shape)
        gc.collect()
        torch.cuda.empty_cache()
