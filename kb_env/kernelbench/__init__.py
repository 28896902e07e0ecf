"""KernelBench-format problem files as kb_env problems: `register_kernelbench(path)` and `kb import DIR`.

KernelBench's files (``level1/23_Softmax.py``: a ``Model``, ``get_inputs()``,
``get_init_inputs()``) become ``KernelBench/level1-23_Softmax-v0``, graded like the shipped deck:
FLOPs from torch's FLOP counter, bytes as a lower bound, tolerance from the output dtype
(`tolerance`), and the deck's correctness hardening, after checks that reject degenerate problems.
The files are trusted problem code: importing one runs it (in a probe process), and it becomes the
reference."""

from .importer import ImportReport, Registered, Skipped, register_kernelbench
from .probe import Budget

__all__ = ["Budget", "ImportReport", "Registered", "Skipped", "register_kernelbench"]
