"""`kb sweep` and `kb board` in CPU mode: every table, resumable after a crash, clear errors."""

from __future__ import annotations

import json

import pytest
from conftest import requires_cpu_mode

from kb_env.board import boards, render
from kb_env.cli import main
from kb_env.rollout import read_jsonl

pytestmark = [requires_cpu_mode, pytest.mark.slow]


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    assert main(["sweep", "--out", str(out), "--policies", "known-good", "reference", "--problems", "softmax",
                 "rmsnorm", "--device", "cpu", "--actors", "2", "--quiet"]) == 0
    return out


def test_sweep_writes_every_episode_and_every_board(sweep_dir, capsys):
    trajs = read_jsonl(sweep_dir / "results.jsonl")
    assert sorted((t.policy, t.task.problem) for t in trajs) == [
        ("known-good", "rmsnorm"), ("known-good", "softmax"), ("reference", "rmsnorm"), ("reference", "softmax")]
    board = json.loads((sweep_dir / "board.json").read_text())
    assert board["fast_p"]["known-good"]["fast_0"] == 1.0
    # CPU mode: no speedup-based figure is claimed (empty, not zero).
    assert board["fast_p"]["known-good"]["fast_1"] is None and board["timing_meaningful"] is False
    # The reference uses the torch ops these problems forbid: flagged, so not counted correct.
    assert board["rates"]["reference"]["flagged"] == 1.0 and board["rates"]["reference"]["correct"] == 0.0
    assert board["peak_fraction"]["known-good"]["softmax"]["correct"] == 1
    # Both problems are level 1: one row per policy in the per-level table.
    by_level = board["rates_by_level"]["known-good"]
    assert set(by_level) == {"1"} and by_level["1"]["tasks"] == 2
    assert board["mega"] == {}
    md = (sweep_dir / "board.md").read_text()
    for title in ("fast_p (KernelBench)", "rates (KernelBench-v3)", "rates by level (KernelBench-v3)",
                  "(KernelBench-Hard)", "KernelBench-Mega"):
        assert title in md


def test_rerun_skips_finished_and_redoes_a_torn_line(sweep_dir, capsys):
    path = sweep_dir / "results.jsonl"
    lines = path.read_text().splitlines()
    torn = [ln for ln in lines if '"policy":"reference"' in ln and '"problem":"rmsnorm"' in ln]
    kept = [ln for ln in lines if ln not in torn]
    path.write_text("\n".join(kept) + "\n" + torn[0][:100])  # a crash mid-write of that episode
    assert main(["sweep", "--out", str(sweep_dir), "--policies", "known-good", "reference", "--problems", "softmax",
                 "rmsnorm", "--device", "cpu", "--quiet"]) == 0
    assert "1 episode(s) run" in capsys.readouterr().out
    assert len(read_jsonl(path)) == 4
    assert main(["sweep", "--out", str(sweep_dir), "--policies", "known-good", "reference", "--problems", "softmax",
                 "rmsnorm", "--device", "cpu", "--quiet"]) == 0
    assert "0 episode(s) run" in capsys.readouterr().out


def test_board_command_and_bad_input(sweep_dir, tmp_path, capsys):
    assert main(["board", str(sweep_dir)]) == 0
    assert "fast_0" in capsys.readouterr().out
    assert main(["board", str(tmp_path)]) == 2
    assert "no results" in capsys.readouterr().err
    assert main(["sweep", "--out", str(tmp_path), "--policies", "reference", "--problems", "nope", "--device", "cpu"]) == 2
    assert "unknown problem" in capsys.readouterr().err


def test_fast_p_counts_every_task_in_the_denominator():
    from kb_env.rollout import StepRecord, Task, Trajectory

    def traj(correct, speedup, problem):
        info = {"correct": correct, "compiled": True, "flags": [], "speedup": speedup, "timing_meaningful": True,
                "peak_fraction": 0.5 if correct else None}
        step = StepRecord(turn=1, action="", observation={}, reward=0.0, terminated=False, truncated=True, info=info,
                          policy_s=0.0, eval_s=0.0)
        return Trajectory(task=Task(problem=problem), policy="p", mode="cuda", reset_observation={}, reset_info={},
                          steps=[step])

    b = boards([traj(True, 2.5, "a"), traj(True, 0.9, "b"), traj(False, None, "c"), traj(True, 1.2, "d")])
    fp = b["fast_p"]["p"]
    assert fp["fast_0"] == 0.75 and fp["fast_1"] == 0.5 and fp["fast_2"] == 0.25 and fp["fast_0.8"] == 0.75
    assert b["rates"]["p"]["beat_baseline"] == 0.5
    assert "| p | 0.750 |" in render(b)


def test_report_has_boards_plots_and_every_episode(sweep_dir, capsys):
    from html.parser import HTMLParser

    assert main(["report", str(sweep_dir)]) == 0
    page = (sweep_dir / "report.html").read_text()

    class Collect(HTMLParser):
        def __init__(self):
            super().__init__()
            self.imgs, self.data, self._in_data = [], "", False

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag == "img":
                self.imgs.append(attrs["src"])
            self._in_data = tag == "script" and attrs.get("id") == "episodes-data"

        def handle_data(self, data):
            if self._in_data:
                self.data += data

        def handle_endtag(self, tag):
            self._in_data = False

    c = Collect()
    c.feed(page)
    assert sorted(c.imgs) == ["plots/fast_p.png", "plots/mega_tok_s.png", "plots/peak_fraction.png",
                              "plots/rates_by_level.png"]
    for src in c.imgs:
        assert (sweep_dir / src).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    episodes = json.loads(c.data.replace("<\\/", "</"))
    assert len(episodes) == 4 and all(len(e["turns"]) == 1 for e in episodes)
    kg = next(e for e in episodes if e["policy"] == "known-good" and e["problem"] == "softmax")
    assert kg["turns"][0]["correct"] and "@triton.jit" in kg["turns"][0]["candidate"] and kg["turns"][0]["feedback"]
    for title in ("fast_p (KernelBench)", "rates (KernelBench-v3)", "rates by level (KernelBench-v3)",
                  "(KernelBench-Hard)", "no level-4 (Mega) problem in these results"):
        assert title in page


def test_bad_sweep_input_is_one_line_and_runs_nothing(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("policies: [reference\n")  # broken YAML
    (tmp_path / "dup.yaml").write_text("policies: [reference, reference]\n")
    (tmp_path / "unknown.yaml").write_text("policies: [gpt-9]\n")
    for args, message in [(["--config", str(tmp_path / "bad.yaml")], "while parsing"),
                          (["--config", str(tmp_path / "dup.yaml")], "unique"),
                          (["--config", str(tmp_path / "unknown.yaml")], "unknown policy"),
                          (["--config", str(tmp_path / "missing.yaml")], "No such file"),
                          ([], "name the policies")]:
        assert main(["sweep", "--out", str(tmp_path / "out"), *args]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_deck_sweep_check_sees_every_output_and_what_is_missing(sweep_dir, tmp_path):
    import importlib.util
    import shutil
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "deck_sweep.py"
    spec = importlib.util.spec_from_file_location("deck_sweep", path)
    deck = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(deck)
    assert main(["report", str(sweep_dir)]) == 0
    assert deck.check_outputs(sweep_dir, ["rmsnorm", "softmax"]) == []
    broken = tmp_path / "broken"
    shutil.copytree(sweep_dir, broken)
    (broken / "plots" / "mega_tok_s.png").write_bytes(b"not a png")
    md = (broken / "board.md").read_text()
    (broken / "board.md").write_text(md.replace("## rates by level (KernelBench-v3)", "## rates by level"))
    failures = deck.check_outputs(broken, ["rmsnorm", "softmax", "gemm_bias_gelu"])
    assert failures == ["no episode for known-good on gemm_bias_gelu", "no episode for reference on gemm_bias_gelu",
                        "board.md lacks the rates by level (KernelBench-v3) table",
                        "plot mega_tok_s.png is missing or not a PNG"]
