"""The HTML report in a real browser (headless Chromium through playwright): it renders offline
with every table and plot, and the transcript viewer shows the turns of the episode clicked.
Skips without playwright-python or a Chromium binary (CI has neither)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from board_results import result, shape_timing, step, trajectory

from kb_env.rollout import append_jsonl

pytest.importorskip("playwright.sync_api", reason="needs playwright-python (pip install 'kb_env[browser]')")

_spec = importlib.util.spec_from_file_location("check_report",
                                               Path(__file__).resolve().parents[1] / "scripts" / "check_report.py")
check_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_report)

pytestmark = pytest.mark.skipif(check_report.find_chromium() is None, reason="needs a Chromium binary")


def test_report_renders_and_the_viewer_shows_an_episodes_turns(tmp_path):
    usage = {"input_tokens": 1000, "output_tokens": 200, "cost_usd": 0.01}
    llm = trajectory("model-x", "softmax", 1, [
        step(1, result("softmax", correct=False, compiled=False, error="compile_error"), usage=usage,
             prompt="Problem `softmax` (triton).", reply="```python\nbroken(\n```", action="broken(\n"),
        step(2, result("softmax", correct=False), usage=usage, prompt="Feedback on attempt 1", reply="try two"),
        step(3, result("softmax", timings=[shape_timing({"rows": 8, "cols": 16}, 0.5, 0.65, 1, 0.9)]), usage=usage,
             prompt="Feedback on attempt 2", reply="```python\n# kernel\n```"),
    ])
    other = trajectory("reference", "softmax", 1, [step(1, result("softmax", flags=["forbidden_op:aten::_softmax"]))])
    mega = trajectory("model-x", "kimi_linear_decode", 4, [step(1, result("kimi_linear_decode", timings=[
        shape_timing({"context": 2048}, 2.0, 20.0, 1)]))])
    for t in (llm, other, mega):
        append_jsonl(tmp_path / "results.jsonl", t)

    out = check_report.check_report(tmp_path, tmp_path / "report.png")
    assert out["failures"] == []
    assert out["viewer"]["episode"] == "model-x / softmax / sample 0"
    assert [t.split(",")[0] for t in out["viewer"]["turns"]] == ["turn 1: reward 0.000", "turn 2: reward 0.000",
                                                                 "turn 3: reward 0.000"]
    assert "compile_error" in out["viewer"]["turns"][0] and "correct, speedup 1.30x" in out["viewer"]["turns"][2]
    assert out["viewer"]["open_text"].startswith("Problem `softmax`")  # the first turn's prompt, opened
    assert "kimi_linear_decode (KernelBench-Mega)" in out["titles"] and len(out["images"]) == 4
    png = (tmp_path / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
