"""`register_kernelbench`: a directory of KernelBench problem files as kb_env problems.

For each ``levelN/<number>_<Name>.py``: judge its text (`scan`), probe it in a separate process
(`probe`: import, fake-tensor trace, real checks where affordable), and write a problem folder
into the import cache (`materialize`), which the registry reads in every process. Each file
ends up registered or skipped with a reason; no file can stop the import."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, Field

from ..problem import add_problem_root, import_cache_root, problem_roots, problems_root, refresh_problems
from .materialize import cpu_mode, read_record, remove_problem, spec_fields, write_problem
from .probe import Budget
from .rules import ForbidOps, compute_dtype
from .scan import ProblemFile, find_files, static_reason

IMPORTER_VERSION = 1  # bump when what the importer measures or writes changes: cached imports are redone


class Registered(BaseModel):
    """One problem the import registered."""

    env_id: str
    name: str
    file: str  # level1/23_Softmax.py
    checked_on: str | None  # where the checks ran, or None: registered unchecked
    unchecked: str | None = None  # why the checks did not run
    cpu_mode: bool
    gpu_only: str | None = None  # why CPU mode does not take it
    flops: int
    bytes: int
    compute_dtype: str
    regime: str | None
    stress: list[dict[str, Any]] = Field(default_factory=list)
    stress_dropped: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    cached: bool = False  # the folder from an earlier import of the same file was kept


class Skipped(BaseModel):
    file: str
    reason: str


class ImportReport(BaseModel):
    source: str
    cache: str
    registered: list[Registered] = Field(default_factory=list)
    skipped: list[Skipped] = Field(default_factory=list)
    seconds: float = 0.0

    def render(self) -> str:
        """The report `kb import` prints: what was registered, what was skipped and why."""
        kept = sum(r.cached for r in self.registered)
        lines = [f"registered {len(self.registered)} problem(s) from {self.source} (problem folders in {self.cache})"
                 + (f"; {kept} unchanged since an earlier import, not run again" if kept else "")]
        if self.registered:
            width = max(len(r.env_id) for r in self.registered)
            lines.append(f"  {'env id':<{width}}  checks  CPU mode  {'GFLOP':>9}  {'MiB':>9}  regime")
            for r in self.registered:
                lines.append(f"  {r.env_id:<{width}}  {r.checked_on or 'NONE':<6}  {'yes' if r.cpu_mode else 'no':<8}  "
                             f"{r.flops / 1e9:>9.3g}  {r.bytes / 2**20:>9.3g}  {r.regime or '-'}")
            for r in self.registered:
                why = [f"unchecked: {r.unchecked}"] if r.unchecked else []
                why += [f"stress case dropped: {d}" for d in r.stress_dropped] + r.notes
                lines += [f"  {r.name}: {w}" for w in why]
        lines.append(f"skipped {len(self.skipped)} file(s)" + (":" if self.skipped else ""))
        lines += [f"  {s.file}: {s.reason}" for s in self.skipped]
        return "\n".join(lines)


def _cache_key(source: str, budget: Budget, forbid_ops: str, cuda: bool) -> str:
    import torch

    blob = json.dumps({"version": IMPORTER_VERSION, "source": hashlib.sha256(source.encode()).hexdigest(),
                       "budget": budget.model_dump(), "forbid_ops": forbid_ops, "cuda": cuda,
                       "torch": torch.__version__.split("+")[0]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _resolve_cuda(device: str) -> bool:
    import torch

    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', not {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no CUDA device is visible")
    return device != "cpu" and torch.cuda.is_available()


class _Prober:
    """The probe process, started when first needed and again after a file kills it."""

    def __init__(self, cuda: bool, budget: Budget, workdir: Path):
        self.cuda, self.budget, self.workdir = cuda, budget, workdir
        self.worker = None

    def probe(self, pf: ProblemFile, source: str) -> dict[str, Any]:
        from ..sandbox.runner import ProtocolViolation, WorkerDied, WorkerProcess, WorkerTimeout

        if self.worker is None:
            self.worker = WorkerProcess("probe", "cuda" if self.cuda else "cpu", self.workdir,
                                        max_memory_bytes=self.budget.probe_memory_mb << 20,
                                        module="kb_env.kernelbench.probe")
        msg = {"op": "probe", "source": source, "filename": str(pf.path), "budget": self.budget.model_dump(),
               "cuda": self.cuda}
        try:
            reply = self.worker.request(msg, self.budget.timeout_s)
        except WorkerTimeout:
            self.close()
            return {"ok": False, "reason": f"probing it ran past {self.budget.timeout_s:g} s (the probe was killed)"}
        except WorkerDied as exc:
            self.close()
            return {"ok": False, "reason": f"it killed the probe process ({exc.how})"}
        except ProtocolViolation as exc:
            self.close()
            return {"ok": False, "reason": f"the probe process broke its protocol ({exc})"}
        return reply

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None


def _registered(pf: ProblemFile, facts: dict[str, Any], fields: dict[str, Any], budget: Budget,
                cached: bool) -> Registered:
    traced, checked = facts["traced"], facts["checked"]
    gpu_only = cpu_mode(traced, checked, budget, fields["compute_dtype"]) if fields["shapes"]["cpu"] == [] else None
    notes = []
    if facts.get("fake_failed"):
        notes.append(f"traced on real tensors (fake tensors failed: {facts['fake_failed']})")
    if traced["stray_tensors"] and not checked:
        notes.append(f"keeps tensor(s) outside its state_dict ({', '.join(traced['stray_tensors'][:4])}), "
                     "unchecked: a candidate cannot load them")
    if checked and checked.get("oracle_note"):
        notes.append(checked["oracle_note"])
    return Registered(env_id=f"KernelBench/{pf.name}-v0", name=pf.name, file=pf.label,
                      checked_on=checked["device"] if checked else None, unchecked=facts.get("unchecked"),
                      cpu_mode=bool(fields["shapes"]["cpu"]), gpu_only=gpu_only, flops=traced["flops"],
                      bytes=int(fields["bytes"]), compute_dtype=fields["compute_dtype"], regime=fields["regime"],
                      stress=fields["stress"], stress_dropped=checked["stress_dropped"] if checked else [],
                      notes=notes, cached=cached)


def register_kernelbench(path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None,
                         device: Literal["auto", "cpu", "cuda"] = "auto", force: bool = False,
                         require_checks: bool = False, forbid_ops: ForbidOps = "reference",
                         budget: Budget | None = None,
                         progress: Callable[[str], None] | None = None) -> ImportReport:
    """Register every KernelBench problem file under `path` as ``KernelBench/level<N>-<stem>-v0``.

    The files are trusted problem code: importing one executes it (in a probe process), and the
    file becomes the reference that candidates are graded against. Problem folders go to
    `cache_dir` (default: `kb_env.problem.import_cache_root()`, which every process reads; another
    folder is read by this process, and by others through $KB_PROBLEM_PATH). A file imported
    before with the same text and settings keeps its folder unless `force`. `device` says where
    checks too big for this CPU may run ("auto": a GPU if there is one). `require_checks` skips
    problems the checks could not run on; `forbid_ops` is `kb_env.kernelbench.rules.forbidden`'s
    mode. Returns what was registered and what was skipped, with a reason for each."""
    import gymnasium as gym

    import kb_env

    started = time.monotonic()
    budget = budget or Budget()
    cuda = _resolve_cuda(device)
    root = Path(path).expanduser().resolve()
    files, other = find_files(root)
    cache = Path(cache_dir).expanduser().resolve() if cache_dir is not None else import_cache_root().resolve()
    if cache_dir is not None and cache not in problem_roots():
        add_problem_root(cache)
    shipped = {p.name for p in problems_root().iterdir() if (p / "problem.yaml").is_file()} \
        if problems_root().is_dir() else set()
    report = ImportReport(source=str(root), cache=str(cache),
                          skipped=[Skipped(file=label, reason=why) for label, why in other])
    removed: list[str] = []
    seen: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="kb_import_") as tmp:
        prober = _Prober(cuda, budget, Path(tmp))
        try:
            for pf in files:
                if progress:
                    progress(pf.label)
                outcome = _import_one(pf, cache, prober, budget, forbid_ops, cuda, force, require_checks, shipped, seen)
                if isinstance(outcome, Skipped):
                    report.skipped.append(outcome)
                    if pf.name not in shipped and seen.get(pf.name) == pf.label and remove_problem(cache, pf.name):
                        removed.append(pf.name)
                else:
                    report.registered.append(outcome)
        finally:
            prober.close()
    refresh_problems()
    for name in removed:
        gym.registry.pop(f"KernelBench/{name}-v0", None)
    kb_env._register_all()
    report.seconds = time.monotonic() - started
    return report


def _import_one(pf: ProblemFile, cache: Path, prober: _Prober, budget: Budget, forbid_ops: ForbidOps, cuda: bool,
                force: bool, require_checks: bool, shipped: set[str], seen: dict[str, str]) -> Registered | Skipped:
    if pf.name in shipped:
        return Skipped(file=pf.label, reason=f"its name {pf.name!r} is a shipped problem's")
    if pf.name in seen:
        return Skipped(file=pf.label, reason=f"same problem name {pf.name!r} as {seen[pf.name]}")
    seen[pf.name] = pf.label
    try:
        source = pf.path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return Skipped(file=pf.label, reason=f"cannot be read: {exc}")
    if why := static_reason(source, str(pf.path)):
        return Skipped(file=pf.label, reason=why)
    key = _cache_key(source, budget, forbid_ops, cuda)
    record = read_record(cache, pf.name)
    if not force and record and record.get("key") == key and (cache / pf.name / "problem.yaml").is_file():
        facts, cached = record["facts"], True
    else:
        facts, cached = prober.probe(pf, source), False
        if not facts.get("ok"):
            return Skipped(file=pf.label, reason=facts.get("reason") or "the probe failed")
    if require_checks and not facts["checked"]:
        return Skipped(file=pf.label, reason=f"the checks could not run: {facts['unchecked']}")
    try:
        fields = spec_fields(pf, facts, budget, forbid_ops)
    except ValueError as exc:  # pydantic's ValidationError included
        return Skipped(file=pf.label, reason=f"its facts make no valid problem: {' '.join(str(exc).split())[:300]}")
    if not cached:
        gpu_only = cpu_mode(facts["traced"], facts["checked"], budget, compute_dtype(facts["traced"]["dtype_bytes"]))
        write_problem(cache, pf, source, fields, facts,
                      {"key": key, "importer_version": IMPORTER_VERSION, "file": str(pf.path), "label": pf.label,
                       "sha256": hashlib.sha256(source.encode()).hexdigest(), "facts": facts,
                       "imported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
                      None if fields["shapes"]["cpu"] else gpu_only)
    return _registered(pf, facts, fields, budget, cached)
