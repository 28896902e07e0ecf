"""How much of a candidate's compile stage is Triton's own work: a known-good solution's first call
per GPU shape in fresh interpreters (CUDA context made first, as a spare's is) with (a) an empty
Triton cache, (b) that cache minus the compiled kernels (the gcc-built driver and launcher modules
kept), (c) all of it. CUDA only.

    python benchmarks/compile_probe.py --problem cross_entropy
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time, torch
torch.zeros(1, device="cuda")
from kb_env import get_problem
from kb_env.problem import import_file
from kb_env.sandbox.cases import make_inputs
spec = get_problem(sys.argv[1])
ref = import_file(spec.reference_path, "kb_probe_reference")
mod = import_file(spec.solution_paths[0], "kb_probe_candidate")
calls = []
for shape in spec.shapes.gpu:
    inputs = make_inputs(ref, shape, 0, "cuda")
    model = mod.ModelNew(*ref.get_init_inputs(**shape)).cuda()
    torch.cuda.synchronize(); t = time.monotonic()
    with torch.no_grad():
        model(*inputs)
    torch.cuda.synchronize()
    calls.append(time.monotonic() - t)
print(json.dumps(calls))
"""


def first_calls(problem: str, cache: Path) -> list[float]:
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", CHILD, problem], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problem", default="cross_entropy")
    args = ap.parse_args()
    import torch

    from kb_env import get_problem
    from kb_env.problem import ProblemError

    try:
        spec = get_problem(args.problem)
    except ProblemError as exc:  # an unknown name: the known ones are listed
        ap.error(str(exc))
    if not spec.solution_paths or not spec.shapes.gpu:
        ap.error(f"{args.problem} has no known-good solution or no GPU shapes")
    if not torch.cuda.is_available():
        ap.error("this probe times Triton compilation on a GPU: no CUDA device here")
    root = Path(tempfile.mkdtemp(prefix="kb_compile_probe_"))
    try:
        t = time.monotonic()
        empty = first_calls(args.problem, root / "full")
        kept = root / "launchers"
        shutil.copytree(root / "full", kept)
        for d in kept.iterdir():
            if any(f.suffix == ".cubin" for f in d.iterdir()):
                shutil.rmtree(d)
        launchers = first_calls(args.problem, kept)
        cached = first_calls(args.problem, root / "full")
        print(f"{args.problem}: first call per GPU shape, seconds ({time.monotonic() - t:.1f} s in all)")
        for name, calls in (("empty cache", empty), ("driver + launchers cached", launchers), ("all cached", cached)):
            print(f"  {name:26s} " + "  ".join(f"{c:.3f}" for c in calls))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
