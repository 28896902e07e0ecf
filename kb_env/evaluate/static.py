"""Checks made on the candidate's source text before anything runs: it parses, it defines
the model class, and it imports nothing the problem forbids (``import x``, ``from x import``,
``__import__("x")``, ``importlib.import_module("x")``)."""

from __future__ import annotations

import ast
import threading
from dataclasses import dataclass, field

MAX_SOURCE_BYTES = 1 << 20
MODEL_NAMES = ("ModelNew", "Model")


@dataclass
class StaticReport:
    error: str | None = None  # a compile_error message, if the source cannot be a candidate
    flags: list[str] = field(default_factory=list)  # integrity violations


def _is_forbidden(module: str, forbidden: list[str]) -> str | None:
    for f in forbidden:
        if module == f or module.startswith(f + "."):
            return f
    return None


def imported_modules(tree: ast.AST) -> list[str]:
    """Every module the source names in an import statement or a constant-string import call."""
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
            if name in {"__import__", "import_module"}:
                out.append(node.args[0].value)
    return out


def _defines_model(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in MODEL_NAMES:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id in MODEL_NAMES for t in targets):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name) in MODEL_NAMES for a in node.names):
                return True
    return False


# CPython 3.11's AST builder keeps its recursion depth in shared state: two threads parsing at once
# (evaluations running in parallel) raised "SystemError: AST constructor recursion depth mismatch".
_PARSE_LOCK = threading.Lock()


def check_source(source: str, forbidden_imports: list[str]) -> StaticReport:
    if not isinstance(source, str):
        return StaticReport(error=f"the action must be Python source text, got {type(source).__name__}")
    if len(source.encode("utf-8", errors="replace")) > MAX_SOURCE_BYTES:
        return StaticReport(error=f"the source is over {MAX_SOURCE_BYTES // 1024} KiB")
    if not source.strip():
        return StaticReport(error="the source is empty")
    try:
        with _PARSE_LOCK:
            tree = ast.parse(source.removeprefix("\ufeff"), filename="candidate.py")  # a UTF-8 BOM is legal Python
    except SyntaxError as exc:
        where = f"line {exc.lineno}" + (f", column {exc.offset}" if exc.offset else "")
        text = f"\n    {exc.text.rstrip()}" if exc.text else ""
        return StaticReport(error=f"SyntaxError: {exc.msg} (candidate.py, {where}){text}")
    except (ValueError, RecursionError) as exc:
        return StaticReport(error=f"the source cannot be parsed: {exc}")
    if not _defines_model(tree):
        return StaticReport(error="the source defines no ModelNew (or Model) class at the top level")
    flags = sorted({f"forbidden_import:{hit}" for m in imported_modules(tree)
                    if (hit := _is_forbidden(m, forbidden_imports))})
    return StaticReport(flags=flags)
