"""The adversarial battery (battery.yaml): every attack gets the outcome it must get and no
more reward than a wrong answer, every honest control is correct and unflagged, and after
each one the same evaluator still grades the problem's known-good solution correct."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import requires_cpu_mode, requires_cuda

sys.path.insert(0, str(Path(__file__).parent))
from battery import (  # noqa: E402
    CLASS_NAMES, Entry, available, describe, evaluator_for, known_good, load_battery, matches, outcome_of,
    reward_ok, source_of, wrong_answer_reward,
)

from kb_env.evaluate.result import ErrorKind, EvalResult  # noqa: E402
from rewards import default as default_reward  # noqa: E402

ENTRIES = load_battery()
MODE_MARKS = {"cpu": [requires_cpu_mode], "cuda": [requires_cuda, pytest.mark.gpu]}
CASES = [pytest.param(e, m, id=f"{e.name}-{m}", marks=MODE_MARKS[m]) for e in ENTRIES for m in e.modes]


@pytest.fixture(scope="module")
def evaluators() -> dict:
    return {}


@pytest.mark.slow
@pytest.mark.parametrize("entry,mode", CASES)
def test_entry(entry: Entry, mode: str, evaluators: dict):
    evaluator = evaluator_for(entry, mode, evaluators)
    result = evaluator.evaluate(source_of(entry))
    assert matches(entry, result), describe(entry, result)
    assert reward_ok(entry, result), "reward above a wrong answer's: " + describe(entry, result)
    good = evaluator.evaluate(known_good(entry))
    assert good.correct and good.flags == [] and good.error is None, \
        f"known-good {entry.problem} after {entry.name}: {outcome_of(good)}: {good.message[:2000]}"


def test_manifest_covers_every_class():
    attacks = [e for e in ENTRIES if e.is_attack]
    controls = [e for e in ENTRIES if not e.is_attack]
    assert len(attacks) >= 30 and len(controls) >= 4
    assert {e.klass for e in attacks} == set(range(1, 11)), set(CLASS_NAMES) - {e.klass for e in ENTRIES}
    # A neutralised attack (expect: correct) must give a wrong answer if its defence were missing:
    # a canary (e.g. zeros on a cache hit) on the path the defence closes, named in its docstring.
    for e in attacks:
        if e.expect == ["correct"]:
            assert "canary" in e.path.read_text().lower(), e.name


def _result(**kw) -> EvalResult:
    return EvalResult(problem="softmax", mode="cpu", **kw)


def test_matching_rules():
    e = Entry.model_validate({"name": "x", "class": 2, "file": "torch_softmax", "why": "w",
                              "expect": ["flag:forbidden_op:aten::_softmax", "crash"]})
    flagged = _result(compiled=True, correct=True, error=ErrorKind.integrity, flags=["forbidden_op:aten::_softmax"])
    assert matches(e, flagged) and outcome_of(flagged) == "flag:forbidden_op:aten::_softmax"
    assert matches(e, _result(error=ErrorKind.crash))
    assert not matches(e, _result(compiled=True, correct=True))
    assert not matches(e, _result(compiled=True, error=ErrorKind.mismatch, flags=["forbidden_op:aten::exp"]))
    correct = Entry.model_validate({"name": "c", "class": 0, "file": "ctrl_plain", "why": "w", "expect": "correct"})
    assert matches(correct, _result(compiled=True, correct=True))
    flagged_but_correct = _result(compiled=True, correct=True, flags=["tensor_subclass"], error=ErrorKind.integrity)
    assert not matches(correct, flagged_but_correct)
    with pytest.raises(ValueError):
        Entry.model_validate({"name": "c", "class": 0, "file": "ctrl_plain", "why": "w", "expect": "mismatch"})
    with pytest.raises(ValueError):
        Entry.model_validate({"name": "c", "class": 3, "file": "ctrl_plain", "why": "w", "expect": "passes"})


def test_reward_ordering_rule():
    mismatch = wrong_answer_reward()
    assert mismatch == default_reward(_result(compiled=True, error=ErrorKind.mismatch))
    attack = next(e for e in ENTRIES if e.is_attack and e.expect != ["correct"])
    assert reward_ok(attack, _result(compiled=True, correct=True, error=ErrorKind.integrity, flags=["x"]))
    assert not reward_ok(attack, _result(compiled=True, correct=True))  # an attack that simply passed


def test_gpu_only_entries_skip_cleanly_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert not any(available(e, "cuda") for e in ENTRIES)
