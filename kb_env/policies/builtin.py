"""Policies that need no model: the reference itself, a problem's known-good solutions, and a
fixed script of sources (tests, demos, replaying an agent's answers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..problem import get_problem


@dataclass
class SequenceAgent:
    """Submits `sources` in order, repeating the last one when the episode runs longer."""

    sources: list[str]
    turn: int = 0

    def act(self, observation: dict[str, Any]) -> str:
        source = self.sources[min(self.turn, len(self.sources) - 1)]
        self.turn += 1
        return source


class ReferencePolicy:
    """Submits the reference as the candidate: a sanity check (correct, speedup about 1)."""

    name = "reference"

    def start(self, problem: str, seed: int) -> SequenceAgent:
        return SequenceAgent([get_problem(problem).reference_source()])


class KnownGoodPolicy:
    """Submits the problem's `solutions/*.py` files in name order, one per turn."""

    name = "known-good"

    def skip_reason(self, problem: str) -> str | None:
        """Why this policy cannot play `problem` (a sweep skips it), or None."""
        return None if get_problem(problem).solution_paths else "it has no solutions/*.py"

    def start(self, problem: str, seed: int) -> SequenceAgent:
        paths = get_problem(problem).solution_paths
        if not paths:
            raise ValueError(f"problem {problem!r} has no solutions/*.py to submit")
        return SequenceAgent([p.read_text() for p in paths])


@dataclass
class ScriptedPolicy:
    """Submits fixed sources: `script[problem]` if the problem is listed, else `default`."""

    script: dict[str, list[str]] = field(default_factory=dict)
    default: list[str] = field(default_factory=list)
    name: str = "scripted"

    def start(self, problem: str, seed: int) -> SequenceAgent:
        sources = self.script.get(problem, self.default)
        if not sources:
            raise ValueError(f"the script has no sources for problem {problem!r}")
        return SequenceAgent(list(sources))


BUILTIN = {"reference": ReferencePolicy, "known-good": KnownGoodPolicy}


def get_policy(name: str):
    """A built-in policy by name."""
    try:
        return BUILTIN[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; built-in policies: {', '.join(BUILTIN)}") from None
