"""Run Triton modules under Triton's interpreter (TRITON_INTERPRET=1 must be set before triton is
imported, so in a subprocess) and bring their outputs back: for tests that show which
implementations pass a problem's bar and which fail it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import torch

_RUNNER = textwrap.dedent("""
    import importlib.util, os, sys
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import torch
    jobs = torch.load(sys.argv[1])
    outputs = []
    for i, job in enumerate(jobs):
        spec = importlib.util.spec_from_file_location(f"interpreted{i}", job["path"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        model = getattr(module, job.get("cls", "ModelNew"))(*job.get("init", []))
        if job.get("state") is not None:
            model.load_state_dict(job["state"], strict=True)
        with torch.no_grad():
            out = model.eval()(*job["inputs"])
        outputs.append(list(out) if isinstance(out, (tuple, list)) else [out])
    torch.save(outputs, sys.argv[2])
""")


def run_interpreted(jobs: list[dict[str, Any]], tmp: Path, timeout_s: float = 300) -> list[list[torch.Tensor]]:
    """Each job: {"path": module file, "inputs": [...], optional "init", "state", "cls"}; returns
    each job's outputs as a list, in order."""
    torch.save([{**j, "path": str(j["path"])} for j in jobs], tmp / "jobs.pt")
    (tmp / "runner.py").write_text(_RUNNER)
    proc = subprocess.run([sys.executable, str(tmp / "runner.py"), str(tmp / "jobs.pt"), str(tmp / "out.pt")],
                          env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
                          timeout=timeout_s)
    assert proc.returncode == 0, f"interpreted run failed:\n{proc.stderr[-4000:]}"
    return torch.load(tmp / "out.pt")
