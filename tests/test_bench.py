"""`kb bench` in CPU mode on one problem: every section it runs here produces its figures, the
known-good is graded correct and each broken candidate as the error it is, the cold evaluation
spawns its workers while the warm ones are forked, and the summary table comes last."""

from __future__ import annotations

import json

from conftest import requires_cpu_mode

from kb_env.bench import Bench, render
from kb_env.problem import get_problem

pytestmark = requires_cpu_mode


def test_bench_cpu_sections(tmp_path):
    bench = Bench("cpu", ["softmax"], repeats=2, concurrency=2, budget_s=300, out=tmp_path, cold=1, progress=False)
    record = bench.run(["stream", "breakdown", "overlap", "dobench", "ncu"])
    assert record["errors"] == [] and record["skipped"] == [], record
    exclusive, overlap = record["streams"]
    assert (exclusive["threads"], overlap["threads"]) == (1, 2) and overlap["overlap"]
    for s in (exclusive, overlap):
        assert s["evaluations"] == 3 and s["per_minute"] > 0
        assert (s["known_good_correct"], s["known_good"]) == (2, 2)
        assert (s["expected_errors"], s["broken"]) == (1, 1)  # softmax's broken one crashes at import
    assert exclusive["known_good_per_minute"] > 0 and exclusive["stage_median_s"]["correctness"] > 0
    warm = [r for r in exclusive["results"] if r["kind"] == "known-good"]
    assert all(r["perf"]["candidate_start"] == "server" and r["perf"]["import_s"] == 0.0 for r in warm)
    assert all(r["perf"]["reference_start"] == "warm" for r in warm)
    (cold,) = record["breakdown"]
    assert cold["correct"] and cold["perf"]["candidate_start"] == "spawn" and cold["perf"]["import_s"] > 0
    # one spread row per CPU shape, from the stream's two fresh evaluations
    assert [r["shape"] for r in record["spread"]] == get_problem("softmax").shapes.cpu
    assert all(len(r["medians_ms"]) == 2 and r["spread"] >= 0 for r in record["spread"])
    assert "do_bench" not in record and "ncu" not in record  # CUDA sections: not in CPU mode
    assert json.loads((tmp_path / "bench.json").read_text())["streams"][0]["evaluations"] == 3
    text = render(record)
    tail = text.split("\nsummary")[-1]
    assert "evaluations per minute (CPU mode), exclusive x1" in tail and "cold evaluation" in tail

