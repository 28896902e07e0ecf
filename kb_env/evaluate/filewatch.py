"""A digest of the files the harness trusts (the problem folder, the kb_env and rewards
packages), taken when an evaluator starts and compared after every evaluation: a candidate
runs as the same user and could rewrite them to corrupt later evaluations."""

from __future__ import annotations

import hashlib
from pathlib import Path

WATCHED_SUFFIXES = {".py", ".yaml", ".yml"}


def tree_digest(roots: list[Path]) -> dict[str, str]:
    """sha256 of every watched file under `roots` (caches and bytecode skipped), by path."""
    out: dict[str, str] = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.suffix in WATCHED_SUFFIXES and "__pycache__" not in path.parts and path.is_file():
                out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def changed_files(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Paths added, removed or modified between two digests."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
