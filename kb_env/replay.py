"""Replaying a published board: its solution files re-graded on your GPU.

A manifest (YAML or JSON) lists the runs: `run_id`, `model`, `problem`, `file` (relative to
the manifest), `gpu` and `published_score` (a speedup over the baseline as the board printed
it). Each entry is one episode of the `replay` policy (task seed = the entry's index); the
replay board puts the measured speedup next to the published one, their ratio, and the
Spearman rank correlation of the two orders."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from .policies.builtin import SequenceAgent
from .problem import get_problem
from .rollout import Task, Trajectory


class ReplayEntry(BaseModel):
    run_id: str
    model: str
    problem: str
    file: str
    gpu: str | None = None
    published_score: float | None = Field(default=None, description="the board's speedup for this run")


class Manifest(BaseModel):
    entries: list[ReplayEntry] = Field(min_length=1)
    root: Path = Field(default=Path("."), exclude=True)

    @classmethod
    def load(cls, path: Path) -> "Manifest":
        path = Path(path)
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
        manifest = cls.model_validate({"entries": data} if isinstance(data, list) else data)
        manifest.root = path.resolve().parent
        for e in manifest.entries:
            get_problem(e.problem)
            if not (manifest.root / e.file).is_file():
                raise FileNotFoundError(f"{path}: entry {e.run_id!r}: no file {e.file!r} beside the manifest")
        return manifest

    def tasks(self) -> list[Task]:
        return [Task(problem=e.problem, seed=i, max_turns=1) for i, e in enumerate(self.entries)]


class ReplayPolicy:
    """Submits the manifest entry whose index is the task's seed."""

    name = "replay"

    def __init__(self, manifest: Manifest):
        self.manifest = manifest

    def start(self, problem: str, seed: int) -> SequenceAgent:
        if not 0 <= seed < len(self.manifest.entries):
            raise ValueError(f"replay: no manifest entry {seed}")
        entry = self.manifest.entries[seed]
        if entry.problem != problem:
            raise ValueError(f"replay: entry {seed} ({entry.run_id}) is for {entry.problem!r}, not {problem!r}")
        return SequenceAgent([(self.manifest.root / entry.file).read_text()])


def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on ranks, ties averaged); None under 3 pairs or no spread."""
    if len(a) != len(b) or len(a) < 3:
        return None
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / var if var else None


def replay_board(manifest: Manifest, trajs: list[Trajectory]) -> dict[str, Any]:
    """Rows of (run, published, measured, ratio) and the rank correlation over runs measured correct."""
    by_index = {t.task.seed: t for t in trajs if t.policy == ReplayPolicy.name}
    rows = []
    for i, e in enumerate(manifest.entries):
        t = by_index.get(i)
        step = t.steps[-1] if t and t.steps else None
        ok = bool(step and step.info.get("correct") and not step.info.get("flags"))
        measured = step.info.get("speedup") if ok else None
        ratio = measured / e.published_score if measured and e.published_score else None
        rows.append({"run_id": e.run_id, "model": e.model, "problem": e.problem, "published_gpu": e.gpu,
                     "published": e.published_score, "measured": measured, "ratio": ratio,
                     "outcome": "correct" if ok else (step.info.get("error") or "flagged") if step else "not run",
                     "flags": step.info.get("flags", []) if step else []})
    pairs = [(r["published"], r["measured"]) for r in rows if r["published"] is not None and r["measured"] is not None]
    return {"rows": rows, "spearman": spearman([p for p, _ in pairs], [m for _, m in pairs]), "pairs": len(pairs)}


def render_replay(board: dict[str, Any]) -> str:
    lines = ["| run | model | problem | published | measured | ratio | outcome |", "|---|---|---|---|---|---|---|"]
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    for r in board["rows"]:
        lines.append(f"| {r['run_id']} | {r['model']} | {r['problem']} | {f(r['published'])} | {f(r['measured'])} | "
                     f"{f(r['ratio'])} | {r['outcome']} |")
    lines.append(f"\nSpearman rank correlation, published vs measured: {f(board['spearman'])} over {board['pairs']} runs")
    return "\n".join(lines) + "\n"
