"""An imported file as a problem folder: ``reference.py`` (the file, verbatim), ``problem.yaml``
(a `ProblemSpec` built from the probe's facts) and ``import.json`` (where it came from and what
the importer measured). Folders are written whole or not at all: a half-written folder would
break the registry of every process."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ..problem import ProblemSpec
from .probe import Budget
from .rules import ForbidOps, compute_dtype, forbidden, regime
from .scan import ProblemFile
from .tolerance import tolerance_for

RECORD = "import.json"
SEEDS = [0, 1, 2]


def cpu_mode(traced: dict[str, Any], checked: dict[str, Any] | None, budget: Budget, dtype: str) -> str | None:
    """None when CPU mode may grade the problem at its (only) sizes, else why it is GPU-only."""
    nbytes = traced["input_bytes"] + traced["state_bytes"] + traced["output_bytes"]
    if checked is None:
        return "not run on this machine's CPU (too big to check here)"
    if checked["device"] != "cpu":
        return f"checked on a GPU ({nbytes / 2**20:.0f} MiB of tensors)"
    if nbytes > budget.cpu_mode_bytes:
        return f"{nbytes / 2**20:.1f} MiB of tensors, over CPU mode's {budget.cpu_mode_bytes / 2**20:g} MiB"
    if traced["flops"] > budget.cpu_mode_flops:
        return f"{traced['flops']:.3g} FLOPs, over CPU mode's {budget.cpu_mode_flops:.3g}"
    if checked["reference_ms"] > budget.cpu_mode_reference_ms:
        return f"the reference takes {checked['reference_ms']:.0f} ms on this CPU, over CPU mode's {budget.cpu_mode_reference_ms:g} ms"
    if dtype == "bfloat16" and traced["flops"] > 0:
        return "bfloat16 products are wrong under Triton 3.9's CPU interpreter"
    return None


def spec_fields(pf: ProblemFile, facts: dict[str, Any], budget: Budget, forbid_ops: ForbidOps) -> dict[str, Any]:
    """The problem.yaml mapping for one probed file (validated by `ProblemSpec`)."""
    traced, checked = facts["traced"], facts["checked"]
    nbytes = traced["input_bytes"] + traced["state_bytes"] + traced["output_bytes"]
    dtype = compute_dtype(traced["dtype_bytes"])
    gpu_only = cpu_mode(traced, checked, budget, dtype)
    out_dtypes = sorted({o["dtype"] for o in traced["outputs"]})
    tolerance = (checked["tolerance"] if checked else {d: tolerance_for(d, None).model_dump() for d in out_dtypes})
    tolerance = {d: {k: v for k, v in t.items() if v is not None} for d, t in tolerance.items()}
    doc = facts.get("doc") or pf.stem.split("_", 1)[-1].replace("_", " ")
    fields = {
        "name": pf.name,
        "description": (f"{doc.rstrip('.')} (KernelBench {pf.label}).\n"
                        "Imported from a KernelBench-format file: the sizes are the file's own (get_inputs() takes "
                        "no arguments).\n"),
        "level": pf.level,
        "interface": "forward",
        "shapes": {"gpu": [{}], "cpu": [] if gpu_only else [{}]},
        "seeds": SEEDS,
        "tolerance": tolerance,
        "flops": str(traced["flops"]),
        "bytes": str(nbytes),
        "compute_dtype": dtype,
        "regime": regime(traced["flops"], nbytes, dtype),
        "forbidden": forbidden(traced["ops"], forbid_ops).model_dump(exclude_none=True),
        "baseline": "eager",
        "stress": checked["stress"] if checked else [],
    }
    ProblemSpec.model_validate(fields)  # fail here, naming nothing half-written, if the facts make no spec
    return fields


def _header(pf: ProblemFile, facts: dict[str, Any], fields: dict[str, Any], gpu_only: str | None) -> str:
    traced, checked = facts["traced"], facts["checked"]
    by_op = ", ".join(f"{op} {n}" for op, n in sorted(traced["flops_by_op"].items())) or "none counted"
    lines = [
        f"Imported from KernelBench's {pf.label} by kb_env.kernelbench (kb import); rewritten on re-import.",
        f"flops: torch's FLOP counter over one forward call, traced on {traced['on']} (matrix products, "
        f"convolutions and attention at 2 per multiply-add; elementwise work and reductions count zero): {by_op}",
        f"bytes: inputs {traced['input_bytes']} + parameters and buffers {traced['state_bytes']} + outputs "
        f"{traced['output_bytes']}, each moved once",
        "tolerance: the output-dtype table of kb_env/kernelbench/tolerance.py, atol scaled by the output's RMS "
        + (f"({', '.join(f'{d} {v:.3g}' for d, v in checked['rms'].items())})" if checked else "(not measured: assumed)"),
        ("checks: passed on " + checked["device"] + (f"; stress cases dropped: {'; '.join(checked['stress_dropped'])}"
                                                     if checked["stress_dropped"] else "")
         if checked else f"checks: NOT RUN ({facts['unchecked']})"),
        "CPU mode: " + (f"none (GPU-only: {gpu_only})" if gpu_only else "the file's sizes"),
    ]
    return "".join(f"# {line}\n" for line in lines)


def write_problem(root: Path, pf: ProblemFile, source: str, fields: dict[str, Any], facts: dict[str, Any],
                  record: dict[str, Any], gpu_only: str | None) -> Path:
    """Write the folder `root/<name>` in one step (staged beside it, then renamed into place)."""
    root.mkdir(parents=True, exist_ok=True)
    staging = root / ".staging"
    staging.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{pf.name}.", dir=staging))
    (tmp / "reference.py").write_text(source)
    (tmp / "problem.yaml").write_text(_header(pf, facts, fields, gpu_only)
                                      + yaml.safe_dump(fields, sort_keys=False, width=110))
    (tmp / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True))
    dest = root / pf.name
    remove_problem(root, pf.name)
    os.replace(tmp, dest)
    return dest


def remove_problem(root: Path, name: str) -> bool:
    """Remove `root/<name>` (moved aside first, so the registry never sees half a folder)."""
    dest = root / name
    if not dest.exists():
        return False
    staging = root / ".staging"
    staging.mkdir(parents=True, exist_ok=True)
    old = Path(tempfile.mkdtemp(prefix=f"{name}.old.", dir=staging))
    os.replace(dest, old / name)
    shutil.rmtree(old, ignore_errors=True)
    return True


def read_record(root: Path, name: str) -> dict[str, Any] | None:
    try:
        return json.loads((root / name / RECORD).read_text())
    except (OSError, ValueError):
        return None
