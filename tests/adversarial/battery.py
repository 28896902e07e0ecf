"""The adversarial battery as data: `battery.yaml` lists attacks (classes 1..10) and honest
controls (class 0), each a candidate file in tests/candidates/ with the outcome the harness
must give it. This module loads and validates the manifest and holds what the pytest test
(test_battery.py) and the table script (benchmarks/adversarial_table.py) share: the candidate
source, the (possibly overridden) ProblemSpec, one Evaluator per configuration, the outcome
label of a result and whether it matches. It imports no pytest.

Outcome labels: ``correct`` (correct, no flags, no error), an error kind (``mismatch``,
``crash``, ``timeout``, ``runtime_error``, ``compile_error``) or ``flag:<names>``. An entry's
`expect` is one label or a list (any may match): an error kind matches ``result.error`` (flags
may come with it: they only lower the reward), ``flag:<prefix>`` matches when some flag starts
with <prefix>, ``correct`` needs a correct, unflagged result.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kb_env.evaluate.evaluator import Evaluator
from kb_env.evaluate.result import ErrorKind, EvalResult
from kb_env.problem import ProblemSpec, get_problem
from rewards import default as default_reward

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "battery.yaml"
CANDIDATES = HERE.parent / "candidates"
MODES = ("cpu", "cuda")
ERROR_LABELS = ("mismatch", "crash", "timeout", "runtime_error", "compile_error")
CLASS_NAMES = {0: "control", 1: "degenerate", 2: "no kernel", 3: "reading the answer", 4: "caching",
               5: "measurement", 6: "harness state", 7: "fitting", 8: "L2 residency", 9: "launch cap",
               10: "faults"}


class Entry(BaseModel):
    """One attack or control of the manifest."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1)
    klass: int = Field(alias="class", ge=0, le=10)
    file: str
    problem: str = "softmax"
    wrap_solution: bool = False
    modes: list[Literal["cpu", "cuda"]] = Field(default_factory=lambda: list(MODES), min_length=1)
    expect: list[str] = Field(min_length=1)
    timeout_s: float | None = Field(default=None, gt=0)
    spec: dict[str, Any] = Field(default_factory=dict)
    why: str = Field(min_length=1)

    @field_validator("expect", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("expect")
    @classmethod
    def _labels(cls, labels: list[str]) -> list[str]:
        for label in labels:
            if not (label == "correct" or label in ERROR_LABELS or (label.startswith("flag:") and len(label) > 5)):
                raise ValueError(f"expect {label!r}: not one of correct, {', '.join(ERROR_LABELS)}, flag:<prefix>")
        return labels

    @model_validator(mode="after")
    def _controls_are_correct(self) -> "Entry":
        if self.klass == 0 and self.expect != ["correct"]:
            raise ValueError(f"{self.name}: a class-0 control must expect correct")
        if "correct" in self.expect and len(self.expect) > 1:
            raise ValueError(f"{self.name}: correct cannot be one of several alternatives")
        return self

    @property
    def path(self) -> Path:
        return CANDIDATES / f"{self.file}.py"

    @property
    def is_attack(self) -> bool:
        return self.klass >= 1

    def config_key(self, mode: str) -> tuple:
        """What makes two entries share an Evaluator."""
        return self.problem, mode, json.dumps(self.spec, sort_keys=True), self.timeout_s


def load_battery(path: Path = MANIFEST) -> list[Entry]:
    """The manifest's entries, validated (unique names, files and problems that exist)."""
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, list):
        raise ValueError(f"{path}: expected a list of entries")
    entries, seen = [], set()
    for i, item in enumerate(raw):
        entry = Entry.model_validate(item)
        if entry.name in seen:
            raise ValueError(f"{path}: entry {i}: duplicate name {entry.name!r}")
        seen.add(entry.name)
        if not entry.path.is_file():
            raise ValueError(f"{path}: {entry.name}: no candidate file {entry.path}")
        get_problem(entry.problem)  # raises for an unknown problem
        spec_of(entry)  # the override must give a valid spec
        entries.append(entry)
    return entries


def source_of(entry: Entry) -> str:
    """The candidate source: the file, or the file as a header before the known-good solution."""
    text = entry.path.read_text()
    if entry.wrap_solution:
        text += "\n\n" + get_problem(entry.problem).solution_paths[0].read_text()
    return text


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# Extra override for every entry (the table script's --quick sets a short timing schedule).
GLOBAL_OVERRIDE: dict = {}


def spec_of(entry: Entry) -> ProblemSpec:
    """The problem's spec with the entry's override (and GLOBAL_OVERRIDE) deep-merged in (the folder kept)."""
    base = get_problem(entry.problem)
    if not entry.spec and not GLOBAL_OVERRIDE:
        return base
    merged = ProblemSpec.model_validate(_merge(_merge(base.model_dump(), GLOBAL_OVERRIDE), entry.spec or {}))
    return merged.model_copy(update={"folder": base.folder})


def evaluator_for(entry: Entry, mode: str, cache: dict[tuple, Evaluator]) -> Evaluator:
    """One Evaluator per (problem, mode, spec override, timeout), kept in `cache`."""
    key = entry.config_key(mode)
    if key not in cache:
        cache[key] = Evaluator(spec_of(entry), mode, entry.timeout_s)
    return cache[key]


def outcome_of(result: EvalResult) -> str:
    """The label of a result: flag:<flags> if flagged, else correct or the error kind."""
    if result.flags:
        return "flag:" + ",".join(result.flags)
    if result.correct and result.error is None:
        return "correct"
    return result.error.value if result.error is not None else "unknown"


def _matches_label(label: str, result: EvalResult) -> bool:
    if label == "correct":
        return result.correct and result.error is None and not result.flags
    if label.startswith("flag:"):
        return any(f.startswith(label[5:]) for f in result.flags)
    return result.error is not None and result.error.value == label


def matches(entry: Entry, result: EvalResult) -> bool:
    return any(_matches_label(label, result) for label in entry.expect)


def wrong_answer_reward() -> float:
    """What the default reward gives a compiled candidate with a wrong answer."""
    return default_reward(EvalResult(problem="battery", mode="cpu", compiled=True, correct=False,
                                     error=ErrorKind.mismatch))


def reward_ok(entry: Entry, result: EvalResult) -> bool:
    """An attack earns no more than a wrong answer, unless it is one the harness neutralises
    (expect: correct), which must then simply be correct and unflagged."""
    if not entry.is_attack or entry.expect == ["correct"]:
        return result.correct and not result.flags and result.error is None
    return default_reward(result) <= wrong_answer_reward()


def available(entry: Entry, mode: str) -> bool:
    """Whether the entry runs in `mode` on this machine."""
    if mode not in entry.modes:
        return False
    if mode == "cuda":
        import torch

        return torch.cuda.is_available()
    return True


def triton_version() -> tuple[int, ...]:
    import triton

    return tuple(int(p) for p in triton.__version__.split(".")[:2] if p.isdigit())


def run_entry(entry: Entry, mode: str, cache: dict[tuple, Evaluator]) -> tuple[EvalResult, float]:
    """Evaluate the entry's candidate; the result and the seconds it took."""
    evaluator = evaluator_for(entry, mode, cache)
    t0 = time.monotonic()
    result = evaluator.evaluate(source_of(entry))
    return result, time.monotonic() - t0


def known_good(entry: Entry) -> str:
    return get_problem(entry.problem).solution_paths[0].read_text()


def describe(entry: Entry, result: EvalResult) -> str:
    """A failure report: what was expected, what came, and why."""
    return (f"{entry.name} (class {entry.klass}, {entry.file}): expected {' or '.join(entry.expect)}, "
            f"got {outcome_of(result)} (error={result.error.value if result.error else None}, "
            f"correct={result.correct}, reward={default_reward(result):.2f})\n"
            f"flags: {result.flags}\nmessage: {result.message[:2000]}")
