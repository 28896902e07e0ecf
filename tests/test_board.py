"""The boards from synthetic GPU-shaped results: KernelBench-v3 rates per level (tokens, cost) and
the KernelBench-Mega board (geomean speedup, tok/s per context, megakernel verdict), figures
checked against hand computation; the report carries every table and plot."""

from __future__ import annotations

import json
import math

import pytest
from board_results import decode_timings, result, shape_timing, step, trajectory

from kb_env.board import boards, render
from kb_env.report import write_report
from kb_env.rollout import append_jsonl

MEGA = "kimi_linear_decode"


def _v3_results():
    usage = lambda i, o, c: {"input_tokens": i, "output_tokens": o, "cost_usd": c}  # noqa: E731
    t = lambda ms, base: [shape_timing({"n": 1}, ms, base)]  # noqa: E731
    return [
        # L1: a compile error, then correct at 1.5x (beats the baseline).
        trajectory("m", "a", 1, [step(1, result("a", correct=False, compiled=False, error="compile_error"),
                                      usage=usage(100, 50, 0.01)),
                                 step(2, result("a", timings=t(2.0, 3.0)), usage=usage(200, 80, 0.02))]),
        # L1: correct but slower than the baseline.
        trajectory("m", "b", 1, [step(1, result("b", timings=t(1.25, 1.0)), usage=usage(300, 90, 0.03))]),
        # L2: compiled, wrong.
        trajectory("m", "c", 2, [step(1, result("c", correct=False), usage=usage(400, 10, 0.04))]),
        # L2: the policy failed before any turn.
        trajectory("m", "d", 2, [], error="RuntimeError: rate limited for good"),
    ]


def test_v3_rates_per_level_with_tokens_and_cost():
    b = boards(_v3_results())
    lv = b["rates_by_level"]["m"]
    assert set(lv) == {"1", "2"}
    assert lv["1"]["tasks"] == 2 and lv["1"]["compiled"] == 1.0 and lv["1"]["correct"] == 1.0
    assert lv["1"]["beat_baseline"] == 0.5
    assert (lv["1"]["input_tokens"], lv["1"]["output_tokens"]) == (600, 220)
    assert lv["1"]["cost_usd"] == pytest.approx(0.06)
    assert lv["2"]["tasks"] == 2 and lv["2"]["compiled"] == 0.5 and lv["2"]["correct"] == 0.0
    assert lv["2"]["episode_errors"] == 1 and lv["2"]["cost_usd"] == pytest.approx(0.04)
    overall = b["rates"]["m"]
    assert overall["tasks"] == 4 and overall["correct"] == 0.5 and overall["input_tokens"] == 1000
    md = render(b)
    assert "## rates by level (KernelBench-v3)" in md
    assert "| m | 1 | 2 | 1.000 | 1.000 | 0.000 | 0.500 | 600 | 220 | 0.060 | 0 |" in md


def test_cost_is_empty_when_a_turn_has_no_price():
    trajs = _v3_results()
    trajs[1].steps[0].policy_info["usage"]["cost_usd"] = None
    b = boards(trajs)
    assert b["rates_by_level"]["m"]["1"]["cost_usd"] is None and b["rates_by_level"]["m"]["2"]["cost_usd"] is not None


def _mega_results():
    base = (20.0, 25.0, 40.0)
    return [
        # Two samples of one megakernel (1 launch per decode step).
        trajectory("fused", MEGA, 4, [step(1, result(MEGA, timings=decode_timings((2.0, 2.5, 4.0), base, 1)))], seed=0),
        trajectory("fused", MEGA, 4, [step(1, result(MEGA, timings=decode_timings((2.5, 2.5, 5.0), base, 1)))], seed=1),
        # A 7-kernel pipeline under the problem's launch cap: flagged, so not correct.
        trajectory("pipeline", MEGA, 4, [step(1, result(MEGA, flags=["too_many_launches"],
                                                       timings=decode_timings((1.0, 1.0, 1.0), base, 7)))]),
        # Without a cap, a 5-kernel solution is correct but no megakernel.
        trajectory("graphs", MEGA, 4, [step(1, result(MEGA, timings=decode_timings((4.0, 5.0, 8.0), base, 5)))]),
        # A level-1 problem never enters the Mega board.
        trajectory("fused", "softmax", 1, [step(1, result("softmax", timings=[shape_timing({"n": 1}, 1.0, 2.0, 1)]))]),
    ]


def test_mega_board_speedup_tok_s_and_megakernel_verdict():
    b = boards(_mega_results())
    assert list(b["mega"]) == [MEGA]
    fused = b["mega"][MEGA]["fused"]
    assert fused["correct"] == 2 and fused["samples"] == 2
    # Geometric mean over samples of each sample's geomean speedup over contexts: 10 and (8*10*8)^(1/3).
    assert fused["speedup"] == pytest.approx(math.sqrt(10 * 640 ** (1 / 3)))
    # tok/s = 1000 / ms per decode step, geometric mean over samples.
    assert fused["tok_s"]["context=2048"] == pytest.approx(math.sqrt(500 * 400))
    assert fused["tok_s"]["context=8192"] == pytest.approx(400)
    assert fused["baseline_tok_s"]["context=16384"] == pytest.approx(25)
    assert fused["launches_per_step"] == 1 and fused["verdict"] == "megakernel (1 launch per step)"

    pipeline = b["mega"][MEGA]["pipeline"]
    assert pipeline["correct"] == 0 and pipeline["speedup"] is None and pipeline["tok_s"] == {}
    assert pipeline["launches_per_step"] == 7
    assert pipeline["verdict"] == "not a megakernel (7 launches per step; over the cap: too_many_launches)"

    graphs = b["mega"][MEGA]["graphs"]
    assert graphs["correct"] == 1 and graphs["speedup"] == pytest.approx(5.0)
    assert graphs["verdict"] == "not a megakernel (5 launches per step)"

    md = render(b)
    assert f"## {MEGA} (KernelBench-Mega)" in md
    assert ("| fused | 2/2 | 9.283 | 447.214 | 400.000 | 223.607 | 50.000 | 40.000 | 25.000 | 1 | "
            "megakernel (1 launch per step) |") in md


def test_mega_in_cpu_mode_claims_no_speed_and_no_verdict():
    cpu = trajectory("fused", MEGA, 4, [step(1, result(MEGA, mode="cpu", timings=decode_timings((2.0,) * 3, (4.0,) * 3,
                                                                                                None)))], mode="cpu")
    row = boards([cpu])["mega"][MEGA]["fused"]
    assert row["correct"] == 1 and row["speedup"] is None and row["tok_s"] == {} and row["launches_per_step"] is None
    assert row["verdict"].startswith("unknown")


def test_boards_without_mega_problems_say_so():
    md = render(boards(_v3_results()))
    assert "no level-4 (Mega) problem in these results" in md


def test_report_has_every_table_and_plot(tmp_path):
    for t in _v3_results() + _mega_results():
        append_jsonl(tmp_path / "results.jsonl", t)
    page = write_report(tmp_path).read_text()
    for title in ("fast_p (KernelBench)", "rates (KernelBench-v3)", "rates by level (KernelBench-v3)",
                  "(KernelBench-Hard)", f"{MEGA} (KernelBench-Mega)", "not a megakernel (7 launches per step"):
        assert title in page
    for png in ("fast_p", "peak_fraction", "rates_by_level", "mega_tok_s"):
        assert f'src="plots/{png}.png"' in page
        assert (tmp_path / "plots" / f"{png}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = page.split('id="episodes-data">')[1].split("</script>")[0]
    assert len(json.loads(data.replace("<\\/", "</"))) == 9
