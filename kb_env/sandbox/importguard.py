"""Inside a candidate worker: refuse, at run time, the imports a problem forbids when the
candidate asks for them (``__import__``, ``importlib.import_module``, ``exec``'d import
statements), which the source check cannot see. Each refusal raises ImportError in the
candidate and is recorded as a ``forbidden_import:<module>`` flag.

An import counts as the candidate's when the code asking for it is the candidate's file (or
code it compiled: ``exec``, ``eval``), so the imports that torch and triton make for themselves
are untouched."""

from __future__ import annotations

import builtins
import importlib
import sys
from typing import Any

_original_import = builtins.__import__
_original_import_module = importlib.import_module


class ImportGuard:
    def __init__(self, forbidden: list[str], candidate_file: str):
        self.forbidden = [f for f in forbidden if f]
        self.candidate_file = candidate_file
        self.violations: list[str] = []

    def _hit(self, name: str) -> str | None:
        for f in self.forbidden:
            if name == f or name.startswith(f + "."):
                return f
        return None

    def _from_candidate(self) -> bool:
        """Is the caller of the import function the candidate (looking through exec'd code)?"""
        frame = sys._getframe(3)  # _from_candidate <- _check <- the guarded function <- its caller
        while frame is not None and frame.f_code.co_filename.startswith("<"):
            frame = frame.f_back
        return frame is not None and frame.f_code.co_filename == self.candidate_file

    def _check(self, name: str, fromlist: Any = None) -> None:
        names = [name] + [f"{name}.{item}" for item in (fromlist or ()) if isinstance(item, str)]
        for n in names:
            hit = self._hit(n)
            if hit and self._from_candidate():
                flag = f"forbidden_import:{hit}"
                if flag not in self.violations:
                    self.violations.append(flag)
                raise ImportError(f"importing {n!r} is forbidden in this problem")

    def install(self) -> None:
        guard = self

        def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
            if level == 0:
                guard._check(name, fromlist)
            return _original_import(name, globals, locals, fromlist, level)

        def guarded_import_module(name, package=None):
            if not name.startswith("."):
                guard._check(name)
            return _original_import_module(name, package)

        builtins.__import__ = guarded_import
        importlib.import_module = guarded_import_module
