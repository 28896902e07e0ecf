"""GPU-only: the CUDA path end to end (skipped without CUDA; run on the GPU machine).
Speeds are measured by benchmarks/foundation_gpu.py, not asserted here."""

from __future__ import annotations

import pytest
from conftest import candidate, requires_cuda, tampered

from kb_env import evaluate, get_problem

pytestmark = [requires_cuda, pytest.mark.gpu]


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "gemm_bias_gelu"])
def test_known_good_solution_is_correct_and_timed(name):
    spec = get_problem(name)
    r = evaluate(spec, spec.solution_paths[0].read_text(), mode="cuda")
    assert r.correct and r.error is None and r.flags == [], r.message
    assert r.timing_meaningful and len(r.timings) == len(spec.shapes.gpu)
    for t in r.timings:
        assert t.candidate.median_ms > 0 and t.baseline.median_ms > 0
        assert t.peak_fraction is not None and 0 < t.peak_fraction < 1.5
        assert t.regime in ("memory-bound", "compute-bound")
    assert r.device is not None and r.device.hardware_key is not None


def test_zeros_fail_on_the_wide_gpu_shape():
    spec = get_problem("softmax")
    r = evaluate(spec, candidate("softmax_zeros"), mode="cuda")
    assert not r.correct and r.error.value == "mismatch"


def test_illegal_memory_access_then_healthy_gpu():
    spec = get_problem("softmax")
    bad = evaluate(spec, candidate("illegal_memory"), mode="cuda", timeout_s=120)
    assert not bad.correct and bad.error.value in ("runtime_error", "crash"), bad.message
    good = evaluate(spec, spec.solution_paths[0].read_text(), mode="cuda")
    assert good.correct and good.error is None, good.message


def test_faults_leave_a_warm_evaluator_clean():
    """One warm evaluator: an illegal memory access and a hang, each in its own forked candidate
    process; the next evaluation still forks from the same server, keeps its reference worker and
    grades the known-good correct (a sticky CUDA error never reaches another process)."""
    from kb_env.evaluate.evaluator import Evaluator
    from kb_env.sandbox import server

    spec = get_problem("softmax")
    good = spec.solution_paths[0].read_text()
    with Evaluator(spec, "cuda", timeout_s=60) as ev:
        first = ev.evaluate(good)
        assert first.correct, first.message
        servers = {s.pid for s in server.running()}
        bad = ev.evaluate(candidate("illegal_memory"))
        assert not bad.correct and bad.error.value in ("runtime_error", "crash"), bad.message
        hang = ev.evaluate(candidate("hang"))
        assert hang.error.value == "timeout", hang.message
        after = ev.evaluate(good)
    assert after.correct and after.error is None and after.flags == [], after.message
    assert after.perf.reference_start == "warm" and after.perf.candidate_start in ("spare", "server")
    assert {s.pid for s in server.running()} == servers
    # (whether its time is unchanged is a measurement: kb bench's spread, not a timed assertion here)


def test_patched_timer_is_flagged_on_gpu():
    spec = get_problem("softmax")
    r = evaluate(spec, tampered("patch_timer"), mode="cuda")
    assert r.correct
    assert "patched:torch.cuda.Event.elapsed_time" in r.flags
    # The harness times with functions bound before the candidate loaded: real times.
    assert all(t.candidate.median_ms > 0.01 for t in r.timings)


def test_triton_compile_error_on_first_call_is_a_compile_error():
    spec = get_problem("softmax")
    r = evaluate(spec, candidate("triton_compile_error"), mode="cuda")
    assert r.error.value == "compile_error" and not r.compiled, r.message


def test_patched_harness_timer_is_flagged_and_caught_by_the_wall_clock():
    spec = get_problem("softmax")
    r = evaluate(spec, tampered("patch_harness_timer"), mode="cuda")
    assert "patched:kb_env.sandbox.timing._elapsed" in r.flags
    assert "timer_implausible" in r.flags  # the reported 1 ns per call is far under the harness's clock
    assert r.error.value == "integrity"
