"""Rosters (rosters/*.yaml) and the sweep settings they use: turn budgets per level, level
selection, a wall-clock budget per episode, GPU-only problems in CPU mode, keys from the
environment. Nothing here evaluates a kernel."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml

from kb_env.cli import main
from kb_env.policies import LLMPolicy, ModelConfig, get_policy
from kb_env.problem import ProblemError
from kb_env.rollout import LocalPool, collect
from kb_env.sweep import SweepConfig, load_config

ROSTERS = Path(__file__).resolve().parents[1] / "rosters"
ROOT = Path(__file__).resolve().parents[1] / "problems"


def test_every_roster_loads_with_keys_from_the_environment():
    names = sorted(p.stem for p in ROSTERS.glob("*.yaml"))
    assert names == ["kernelbench", "kernelbench-hard", "kernelbench-mega", "kernelbench-v3"]
    for name in names:
        cfg = load_config(ROSTERS / f"{name}.yaml")
        assert cfg.name == name and cfg.about and cfg.models and cfg.samples == 1
        for m in cfg.models:
            assert m.api_key_env and m.api_key_env.endswith("_API_KEY")
        assert "sk-" not in (ROSTERS / f"{name}.yaml").read_text()


def test_published_settings():
    kb = load_config(ROSTERS / "kernelbench.yaml")
    assert kb.max_turns == 1 and not kb.turns_by_level and kb.levels == [1, 2, 3] and kb.budget_s is None
    assert all(m.temperature == 0.0 for m in kb.models if m.reasoning_effort is None and m.name != "deepseek-r1")
    assert {m.backend for m in kb.models} == {"cuda"}
    v3 = load_config(ROSTERS / "kernelbench-v3.yaml")
    assert v3.turns_by_level == {1: 10, 2: 12, 3: 15, 4: 15} and len(v3.models) == 10
    assert v3.turns_for("softmax") == 10 and v3.turns_for("gemm_bias_gelu") == 12  # levels 1 and 2
    hard = load_config(ROSTERS / "kernelbench-hard.yaml")
    assert hard.budget_s == 45 * 60 and len(hard.models) == 7
    mega = load_config(ROSTERS / "kernelbench-mega.yaml")
    assert mega.budget_s == 3 * 3600 and mega.levels == [4]


def test_sweep_settings_refuse_typos_and_bad_budgets(tmp_path):
    with pytest.raises(ValueError, match="extra"):
        SweepConfig(policies=["reference"], max_turn=3)
    with pytest.raises(ValueError, match="extra"):
        ModelConfig(name="m", provider="openai", model="x", temprature=0.2)
    with pytest.raises(ValueError, match="levels"):
        SweepConfig(policies=["reference"], levels=[5])
    with pytest.raises(ValueError, match="turns_by_level"):
        SweepConfig(policies=["reference"], turns_by_level={1: 0})
    with pytest.raises(ValueError):
        SweepConfig(policies=["reference"], budget_s=0)
    (tmp_path / "list.yaml").write_text("- reference\n")
    with pytest.raises(ValueError, match="mapping"):
        load_config(tmp_path / "list.yaml")


def test_only_picks_a_subset_of_a_roster():
    v3 = load_config(ROSTERS / "kernelbench-v3.yaml")
    sub = v3.only(["GPT-5.4", "GLM-5"])
    assert [m.name for m in sub.models] == ["GPT-5.4", "GLM-5"] and sub.turns_by_level == v3.turns_by_level
    with pytest.raises(ValueError, match="not in this sweep: gpt-9"):
        v3.only(["gpt-9"])


def test_a_missing_key_stops_the_sweep_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(ROSTERS / "kernelbench-v3.yaml"), "--only", "GPT-5.4", "--out", str(out),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "set OPENAI_API_KEY" in err and err.count("\n") == 1
    assert not (out / "results.jsonl").exists()


def test_llm_policy_tells_each_level_its_own_budget():
    cfg = ModelConfig(name="m", provider="openai", model="x")
    policy = LLMPolicy(cfg, max_turns=3, turns_by_level={1: 10, 2: 12}, budget_s=2700)
    assert policy.start("softmax", 0).max_turns == 10 and policy.start("gemm_bias_gelu", 0).max_turns == 12
    assert LLMPolicy(cfg, max_turns=3).start("softmax", 0).max_turns == 3
    from kb_env import get_problem
    from kb_env.policies.prompts import first_prompt

    spec = get_problem("softmax")
    text = first_prompt(spec, "triton", "an H100", 10, spec.reference_source(), budget_s=2700)
    assert "You have 10 attempt(s)" in text and "wall-clock budget of 45 minute(s)" in text


@pytest.fixture
def deck(tmp_path, monkeypatch):
    """A problems root with softmax (level 1), a GPU-only copy of it and a copy without solutions."""
    root = tmp_path / "problems"
    shutil.copytree(ROOT / "softmax", root / "softmax")
    for name in ("softmax_gpu", "softmax_bare"):
        shutil.copytree(ROOT / "softmax", root / name, ignore=shutil.ignore_patterns("solutions"))
        spec = yaml.safe_load((root / name / "problem.yaml").read_text())
        spec["name"] = name
        if name == "softmax_gpu":
            spec["shapes"].pop("cpu")
            spec["level"] = 2
        (root / name / "problem.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("KB_PROBLEMS_DIR", str(root))
    return root


def test_cpu_sweeps_leave_out_gpu_only_problems_and_known_good_skips_bare_ones(deck, tmp_path, capsys):
    cfg = SweepConfig(policies=["known-good"], mode="cpu")
    assert cfg.problem_names() == ["softmax", "softmax_bare"]
    assert SweepConfig(policies=["reference"], mode="cpu", levels=[1]).problem_names() == ["softmax", "softmax_bare"]
    with pytest.raises(ProblemError, match="GPU-only"):
        SweepConfig(policies=["reference"], mode="cpu", problems=["softmax_gpu"]).problem_names()
    with pytest.raises(ProblemError, match="no problem to sweep"):
        SweepConfig(policies=["reference"], mode="cpu", levels=[2]).problem_names()
    assert get_policy("known-good").skip_reason("softmax_bare") == "it has no solutions/*.py"
    assert get_policy("known-good").skip_reason("softmax") is None
    assert main(["sweep", "--out", str(tmp_path / "o"), "--policies", "reference", "--problems", "softmax_gpu",
                 "--device", "cpu", "--quiet"]) == 2
    assert "GPU-only" in capsys.readouterr().err


class _Slow:
    """Answers a syntax error (graded in milliseconds, no worker) after `delay` seconds."""

    name = "slow"

    def __init__(self, delay: float):
        self.delay = delay

    def start(self, problem: str, seed: int):
        return self

    def act(self, observation):
        time.sleep(self.delay)
        return "def broken(:\n"


def test_no_turn_starts_after_the_wall_clock_budget():
    with LocalPool("cpu") as pool:
        spent, = collect(_Slow(0.3), ["softmax"], pool, max_turns=5, budget_s=0.2)
        full, = collect(_Slow(0.0), ["softmax"], pool, max_turns=3, budget_s=60)
    assert len(spent.steps) == 1 and spent.budget_spent and spent.error is None
    assert len(full.steps) == 3 and not full.budget_spent


def test_a_roster_runs_through_the_sdk_to_the_per_level_board(tmp_path, monkeypatch, capsys):
    """A roster file (anchors, a per-level turn budget, prices) swept against a scripted server on
    loopback: the budget reaches the model and the environment, tokens and cost reach the board."""
    from llm_server import ScriptedLLMServer

    monkeypatch.setenv("LOOPBACK_KEY", "not-a-secret")
    replies = [{"text": "Let me think about tiling first."},  # no code: graded as a compile error in ms
               {"text": "```python\ndef broken(:\n```", "input_tokens": 300, "output_tokens": 200}]
    with ScriptedLLMServer(replies) as server:
        (tmp_path / "roster.yaml").write_text(f"""
name: loopback
problems: [softmax]
max_turns: 5
turns_by_level: {{1: 2}}
x-common: &common {{provider: openai, base_url: "{server.url}/v1", api_key_env: LOOPBACK_KEY}}
models:
  - {{<<: *common, name: scripted, model: m, price_in_per_mtok: 1.0, price_out_per_mtok: 2.0}}
""")
        assert main(["sweep", "--config", str(tmp_path / "roster.yaml"), "--device", "cpu",
                     "--out", str(tmp_path / "out"), "--quiet"]) == 0
        first = server.requests[0][1]["messages"][1]["content"]
    assert "You have 2 attempt(s)" in first and len(server.requests) == 2  # level 1: two turns, not five
    board = json.loads((tmp_path / "out" / "board.json").read_text())
    row = board["rates_by_level"]["scripted"]["1"]
    assert row["tasks"] == 1 and row["compiled"] == 0.0 and row["correct"] == 0.0
    assert (row["input_tokens"], row["output_tokens"]) == (400, 250)
    assert row["cost_usd"] == pytest.approx((400 * 1.0 + 250 * 2.0) / 1e6)
    assert "1 episode(s) run" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())["mode"] == "cpu"  # --device overrides the file


def test_the_llm_sweep_example_runs(tmp_path, monkeypatch, capsys):
    import importlib.util
    import sys

    from llm_server import ScriptedLLMServer

    path = Path(__file__).resolve().parents[1] / "examples" / "llm_sweep.py"
    spec = importlib.util.spec_from_file_location("llm_sweep_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    monkeypatch.setenv("OPENAI_API_KEY", "not-a-secret")
    with ScriptedLLMServer([{"text": "no code today"}]) as server:
        monkeypatch.setattr(sys, "argv", ["llm_sweep.py", "--provider", "openai", "--model", "m", "--base-url",
                                          server.url + "/v1", "--problems", "softmax", "--max-turns", "1",
                                          "--device", "cpu", "--out", str(tmp_path / "run")])
        example.main()
    out = capsys.readouterr().out
    assert "1 episode(s) run" in out and "rates by level (KernelBench-v3)" in out
    assert (tmp_path / "run" / "report.html").is_file()
