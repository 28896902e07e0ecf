"""`kb replay`: a published board's files re-graded (CPU mode), measured next to published."""

from __future__ import annotations

import json

import pytest
from conftest import candidate, requires_cpu_mode

from kb_env import get_problem
from kb_env.cli import main
from kb_env.replay import spearman


def test_spearman_matches_hand_computed_values():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833, abs=1e-6)  # tie: ranks 1.5, 1.5, 3, 4
    assert spearman([1, 2], [2, 1]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


@requires_cpu_mode
@pytest.mark.slow
def test_replay_regrades_each_run(tmp_path, capsys):
    files = {"good.py": get_problem("softmax").solution_paths[0].read_text(),
             "ref.py": get_problem("rmsnorm").reference_source(), "zeros.py": candidate("softmax_zeros")}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    manifest = [{"run_id": "r1", "model": "m-a", "problem": "softmax", "file": "good.py", "gpu": "H100",
                 "published_score": 1.3},
                {"run_id": "r2", "model": "m-b", "problem": "rmsnorm", "file": "ref.py", "published_score": 1.0},
                {"run_id": "r3", "model": "m-c", "problem": "softmax", "file": "zeros.py", "published_score": 9.0}]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "out"
    assert main(["replay", str(tmp_path / "manifest.json"), "--out", str(out), "--device", "cpu", "--quiet"]) == 0
    board = json.loads((out / "replay.json").read_text())
    assert [r["outcome"] for r in board["rows"]] == ["correct", "integrity", "mismatch"]
    assert board["rows"][1]["flags"]  # the reference's torch ops are forbidden on rmsnorm
    # CPU mode: nothing timed, so no ratio or correlation is claimed.
    assert all(r["measured"] is None and r["ratio"] is None for r in board["rows"]) and board["spearman"] is None
    assert "Spearman" in capsys.readouterr().out
    # A rerun evaluates nothing new.
    assert main(["replay", str(tmp_path / "manifest.json"), "--out", str(out), "--device", "cpu", "--quiet"]) == 0
    assert len((out / "results.jsonl").read_text().splitlines()) == 3


def test_bad_manifest_is_one_line_error(tmp_path, capsys):
    (tmp_path / "m.json").write_text(json.dumps([{"run_id": "x", "model": "m", "problem": "softmax", "file": "missing.py"}]))
    assert main(["replay", str(tmp_path / "m.json"), "--out", str(tmp_path / "o"), "--device", "cpu"]) == 2
    assert "no file 'missing.py'" in capsys.readouterr().err
    (tmp_path / "m2.json").write_text(json.dumps([{"run_id": "x", "model": "m", "problem": "nope", "file": "a.py"}]))
    assert main(["replay", str(tmp_path / "m2.json"), "--out", str(tmp_path / "o"), "--device", "cpu"]) == 2
    assert "unknown problem" in capsys.readouterr().err


def test_the_example_manifest_loads():
    from pathlib import Path

    from kb_env.replay import Manifest

    m = Manifest.load(Path(__file__).resolve().parents[1] / "examples" / "replay" / "manifest.yaml")
    assert [e.run_id for e in m.entries] == ["run_a", "run_b", "run_c"] and [t.seed for t in m.tasks()] == [0, 1, 2]
