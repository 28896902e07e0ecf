"""Shared fixtures: candidate sources for the softmax problem (CPU mode)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

# The registry also reads the user's import cache (`kb import`) and $KB_PROBLEM_PATH; the tests
# see only the shipped problems, plus what a test imports into a cache of its own.
os.environ["KB_IMPORT_DIR"] = tempfile.mkdtemp(prefix="kb_test_imports_")
atexit.register(shutil.rmtree, os.environ["KB_IMPORT_DIR"], True)
os.environ.pop("KB_PROBLEM_PATH", None)

CANDIDATES = Path(__file__).parent / "candidates"

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _triton_version() -> tuple[int, ...]:
    import triton

    return tuple(int(p) for p in triton.__version__.split(".")[:2] if p.isdigit())


# CPU mode runs Triton's interpreter, which mis-handles masked loads with numpy 2.4 before 3.9.
requires_cpu_mode = pytest.mark.skipif(_triton_version() < (3, 9), reason="CPU mode needs triton>=3.9")


def candidate(name: str) -> str:
    """The source of tests/candidates/<name>.py."""
    return (CANDIDATES / f"{name}.py").read_text()


def tampered(header: str) -> str:
    """A correct softmax candidate (the known-good solution) behind a tampering header."""
    from kb_env import get_problem

    return candidate(header) + "\n\n" + get_problem("softmax").solution_paths[0].read_text()


@pytest.fixture(scope="session")
def softmax_solution() -> str:
    from kb_env import get_problem

    return get_problem("softmax").solution_paths[0].read_text()
