"""The trusted reading of profiled kernels and of the torch ops a candidate ran (no GPU needed:
the records are what the profiling worker sends)."""

from __future__ import annotations

from kb_env.evaluate.kernels import analyze, render
from kb_env.evaluate.oprules import op_flags
from kb_env.problem import Forbidden
from kb_env.sandbox.kprofile import kernel_records

MAIN, SIDE = 7, 13


def rec(name, start, dur, when="call", stream=MAIN, lib=None):
    return {"name": name, "stream": stream, "start_us": start, "dur_us": dur, "when": when, "lib": lib}


FENCE = rec("sleep", 0, 100, when="fence")  # the call's work is ordered after t=100
MARKER = rec("fill", 500, 1, when="marker", lib="aten::fill_")


def test_own_kernel_on_the_main_stream_is_clean():
    report, flags = analyze([FENCE, rec("my_kernel", 100, 300), MARKER], Forbidden(), 1e9, 1e9, None, "float32")
    assert flags == [] and report.own_share == 1.0 and report.launches == 1
    assert report.rows[0].own and "my_kernel" in render(report)


def test_work_inside_torch_ops_or_vendor_libraries_is_library_work():
    records = [FENCE, rec("tiny_triton", 100, 10), rec("ampere_sgemm", 110, 200, lib="aten::mm"),
               rec("sm90_xmma_gemm_f16f16", 310, 150), MARKER]
    report, flags = analyze(records, Forbidden(), 1, 1, None, "float32")
    assert flags == ["library_kernels"]
    assert abs(report.own_share - 10 / 360) < 1e-9


def test_launch_cap_counts_every_kernel():
    records = [FENCE, *(rec("k", 100 + 10 * i, 10) for i in range(4)), MARKER]
    _, flags = analyze(records, Forbidden(max_launches=4), 1, 1, None, "float32")
    assert flags == []
    _, flags = analyze(records, Forbidden(max_launches=3), 1, 1, None, "float32")
    assert flags == ["too_many_launches"]


def test_side_stream_work_must_be_ordered_after_the_start_and_joined():
    joined = rec("k", 150, 300, stream=SIDE)  # began after the fence, ended before the marker
    assert analyze([FENCE, joined, MARKER], Forbidden(), 1, 1, None, "float32")[1] == []
    not_joined = rec("k", 150, 600, stream=SIDE)  # still running when the marker began
    assert analyze([FENCE, not_joined, MARKER], Forbidden(), 1, 1, None, "float32")[1] == ["unjoined_stream"]
    too_early = rec("k", 20, 50, stream=SIDE)  # ran under the fence: before the call's start
    assert analyze([FENCE, too_early, MARKER], Forbidden(), 1, 1, None, "float32")[1] == ["unjoined_stream"]


def test_kernels_launched_after_return_are_flagged():
    report, flags = analyze([FENCE, rec("k", 100, 50), MARKER, rec("k", 600, 50, when="after")],
                            Forbidden(), 1, 1, None, "float32")
    assert flags == ["work_after_return"] and report.late_kernels == 1


def test_kernel_records_from_a_chrome_trace():
    ann = [{"cat": "user_annotation", "name": n, "ph": "X", "ts": ts, "dur": d, "tid": 1}
           for n, ts, d in (("kb::fence", 0, 5), ("kb::call", 10, 50), ("kb::marker", 70, 5))]
    ops = [{"cat": "cpu_op", "name": "aten::mm", "ph": "X", "ts": 20, "dur": 10, "tid": 1}]
    launches = [{"cat": c, "name": "launch", "ph": "X", "ts": ts, "dur": 1, "tid": tid, "args": {"correlation": k}}
                for c, ts, tid, k in (("cuda_runtime", 2, 1, 1), ("cuda_driver", 15, 1, 2), ("cuda_runtime", 25, 1, 3),
                                      ("cuda_runtime", 72, 1, 4), ("cuda_driver", 90, 2, 5))]
    kernels = [{"cat": "kernel", "name": f"k{k}", "ph": "X", "ts": 100 + k, "dur": 1, "args": {"correlation": k, "stream": 7}}
               for k in range(1, 6)]
    out = kernel_records(ann + ops + launches + kernels)
    assert [(r["name"], r["when"], r["lib"]) for r in out] == [
        ("k1", "fence", None), ("k2", "call", None), ("k3", "call", "aten::mm"), ("k4", "marker", None), ("k5", "after", None)]


def test_op_rules_forbid_and_allowlist():
    rules = Forbidden(torch_ops=["aten::_softmax"], allowed_torch_ops=["aten::constant_pad_nd"])
    ran = ["aten::empty_like", "aten::view", "aten::copy_", "aten::constant_pad_nd", "aten::_softmax", "aten::sigmoid"]
    assert op_flags(ran, rules) == ["forbidden_op:aten::_softmax", "unlisted_op:aten::sigmoid"]
    assert op_flags(ran, Forbidden(torch_ops=["aten::_softmax"])) == ["forbidden_op:aten::_softmax"]  # no allowlist


def test_feedback_shows_the_kernel_table_and_the_rule_behind_each_flag():
    from kb_env.evaluate.result import ErrorKind, EvalResult, Samples, ShapeTiming
    from kb_env.feedback import render as feedback

    report, flags = analyze([FENCE, rec("my_kernel", 100, 30), rec("ampere_sgemm", 130, 270, lib="aten::mm"), MARKER],
                            Forbidden(), 1e9, 1e9, None, "float32")
    samples = Samples.of([0.3, 0.31, 0.29])
    timing = ShapeTiming(shape={"n": 8}, candidate=samples, baseline=samples, speedup=1.0, flops=1e9, bytes=1e9,
                         arithmetic_intensity=1.0, kernels=report)
    result = EvalResult(problem="softmax", mode="cuda", compiled=True, correct=True, error=ErrorKind.integrity,
                        flags=flags + ["forbidden_op:aten::mm"], timings=[timing], timing_meaningful=True)
    text = feedback(result)
    assert "## profile (n=8)" in text and "my_kernel" in text and "library" in text
    assert "- library_kernels: most of the GPU time was in torch or vendor-library kernels" in text
    assert "- forbidden_op:aten::mm: the problem forbids this torch operator" in text
    assert result.own_kernel_share == report.own_share and result.kernel_launches == 2
