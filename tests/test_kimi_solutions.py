"""kimi_linear_decode's known-good Triton solutions: the single-launch megakernel
(problems/kimi_linear_decode/solutions/triton_megakernel.py) and the multi-kernel one it is checked
against (tests/candidates/kimi_multikernel.py). In CPU mode both are graded by the real Evaluator
(Triton's interpreter; the megakernel runs its phases as one launch each there); the megakernel's
MLA capacity buffer is checked where the harness does not reach it (a full buffer grows). On a
GPU, the launch cap passes the megakernel (one launch, no flags) and flags the multi-kernel one
with its count (GPU-only tests skip without CUDA)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import CANDIDATES, requires_cpu_mode, requires_cuda

from kb_env import get_problem
from kb_env.evaluate.evaluator import Evaluator
from kb_env.problem import import_file
from kb_env.sandbox.cases import make_inputs, make_reference_model

SPEC = get_problem("kimi_linear_decode")
MEGAKERNEL = SPEC.folder / "solutions" / "triton_megakernel.py"
MULTIKERNEL = CANDIDATES / "kimi_multikernel.py"
# a steady-state step of the multi-kernel solution: the prologue, 3 per KDA layer (projections,
# recurrence, output), 5 for the MLA layer (projections, absorb, attention, combine, output) and
# 3 per MoE (router, gate|up, down); no cache copy (the cache fed is its own)
MULTIKERNEL_LAUNCHES = 1 + 3 * 3 + 5 + 4 * 3


def _evaluate(path: Path, mode: str, **kw):
    return Evaluator(SPEC, mode, **kw).evaluate(path.read_text(), salt=21)


def _assert_graded_clean(res) -> None:
    assert res.correct and res.error is None and not res.flags, res.message
    kinds = [c.kind for c in res.checks]
    shapes = SPEC.shapes_for(res.mode)
    assert kinds.count("grading") == len(shapes) * len(SPEC.seeds)
    for shape in shapes:  # each timed run checked keeps its first and last step: the rounds' last run,
        # and on a GPU each wall-clock estimate's batch (one to three per shape) too
        timed = sorted(c.seed_index for c in res.checks if c.kind == "timing" and c.shape == shape)
        runs = 1 if res.mode == "cpu" else len(timed) // 2
        assert timed == sorted([0, 1] * runs) and (res.mode == "cpu" or 2 <= runs <= 4), timed
    assert all(c.ok for c in res.checks)


@requires_cpu_mode
@pytest.mark.parametrize("path", [MEGAKERNEL, MULTIKERNEL], ids=["megakernel", "multikernel"])
def test_solution_is_correct_through_the_evaluator_in_cpu_mode(path):
    _assert_graded_clean(_evaluate(path, "cpu"))


_GROWTH_SCRIPT = """
import json, sys
from kb_env import get_problem
from kb_env.evaluate.decode_check import compare_step
from kb_env.problem import import_file
from kb_env.sandbox import decode
from kb_env.sandbox.cases import make_inputs, make_reference_model

spec = get_problem("kimi_linear_decode")
mk = import_file(spec.folder / "solutions" / "triton_megakernel.py", "_kimi_megakernel")
ref = import_file(spec.reference_path, "_kimi_reference")
shape = dict(spec.shapes.cpu[0])
oracle = make_reference_model(ref, shape, 3).eval()
model = mk.Model(ref.build_config(shape))
model.load_state_dict(oracle.state_dict(), strict=True)
hidden, state = make_inputs(ref, shape, 4, "cpu")
n = state[3]["c_kv"].shape[0]
model.step(hidden, [{k: v.clone() for k, v in st.items()} for st in state])  # prepares the model
# the model's own buffer, exactly full: the fed cache is a view of all of it
full = (state[3]["c_kv"].clone(), state[3]["k_rope"].clone())
model._cache = full
state[3] = {"c_kv": full[0][:n], "k_rope": full[1][:n]}
names, fed = decode.flatten(hidden, state)
fed = [t.clone() for t in fed]
exp_names, expected = decode.flatten(*oracle.step(*decode.unflatten(names, [t.clone() for t in fed])))
got_names, got = decode.flatten(*model.step(hidden, state))
grown = model._cache[0].data_ptr() != full[0].data_ptr() and model._cache[0].shape[0] > n + 1
ok, mismatch, _ = compare_step(got_names, got, exp_names, expected, fed, spec.decode)
buf = model._cache[0].data_ptr()
_, new_state = model.step(got[0], decode.unflatten(got_names, got)[1])
print(json.dumps({"grown": grown, "ok": ok, "mismatch": mismatch.message if mismatch else None,
                  "appended_in_place": new_state[3]["c_kv"].data_ptr() == buf,
                  "rows": new_state[3]["c_kv"].shape[0], "n": n}))
"""


@requires_cpu_mode
def test_a_full_capacity_buffer_grows_and_keeps_its_rows():
    """The megakernel appends the new MLA row in place when the fed cache is its own view; when that
    view fills its buffer, the rows move to a fresh buffer (copied by the kernel) and the step is
    still the reference's; the next step appends in place again. (A subprocess: Triton must be
    imported with TRITON_INTERPRET=1 already set.)"""
    proc = subprocess.run([sys.executable, "-c", _GROWTH_SCRIPT], env={**os.environ, "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["grown"] and r["ok"], r
    assert r["appended_in_place"] and r["rows"] == r["n"] + 2, r


# ----- on a GPU: the launch cap ---------------------------------------------------------------------
@requires_cuda
def test_on_a_gpu_the_megakernel_is_one_launch_correct_and_unflagged():
    res = _evaluate(MEGAKERNEL, "cuda")
    _assert_graded_clean(res)
    assert res.kernel_launches == 1 and res.max_launches == 1  # speed: benchmarks/kimi_solution_check.py


@requires_cuda
def test_on_a_gpu_the_multikernel_solution_is_flagged_with_its_count_and_clean_without_the_cap():
    capped = _evaluate(MULTIKERNEL, "cuda")
    assert capped.correct and capped.flags == ["too_many_launches"], (capped.flags, capped.message)
    assert capped.kernel_launches == MULTIKERNEL_LAUNCHES
    uncapped = _evaluate(MULTIKERNEL, "cuda", launch_cap=False)
    _assert_graded_clean(uncapped)
    assert uncapped.max_launches is None and uncapped.kernel_launches == MULTIKERNEL_LAUNCHES


@requires_cuda
def test_on_a_gpu_the_megakernel_barriers_never_time_out():
    """Chained steps on the real unit at a short context: no barrier gave up waiting (the grid was
    co-resident) and the answer does not move from one step to the next run of the same step."""
    mk = import_file(MEGAKERNEL, "_kimi_megakernel_gpu")
    ref = import_file(SPEC.reference_path, "_kimi_reference_gpu")
    shape = {**SPEC.shapes.gpu[0], "context": 64}
    model = mk.Model(ref.build_config(shape))
    model.load_state_dict(make_reference_model(ref, shape, 5, "cuda").state_dict(), strict=True)
    model = model.cuda().eval()
    outs = []
    for _ in range(3):
        hidden, state = make_inputs(ref, shape, 6, "cuda")
        out, _ = model.step(hidden, state)
        outs.append(out.clone())
    torch.cuda.synchronize()
    assert model.barrier_timeouts() == 0
    assert all(torch.equal(outs[0], o) for o in outs[1:])  # deterministic: no float atomics, no races
