"""Finding KernelBench problem files and judging them from their text alone (nothing runs here).

A KernelBench directory holds ``level1/`` ... ``level4/``, each with files named
``<number>_<Name>.py`` that define ``Model``, ``get_inputs()`` and ``get_init_inputs()`` at
module level. Before any file is executed, this module rejects what would fail or reach out:
a syntax error, a missing definition, and code that needs the network (KernelBench level 4
builds its models with Hugging Face's ``from_pretrained``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict

LEVEL_DIR = re.compile(r"^level(\d+)$")
PROBLEM_FILE = re.compile(r"^(\d+)_(.+)\.py$")
LEVELS = range(1, 5)

# Modules whose use means model weights or configs come from a hub, or that open connections.
NETWORK_MODULES = {
    "transformers": "a model hub library",
    "diffusers": "a model hub library",
    "huggingface_hub": "the Hugging Face hub client",
    "datasets": "a dataset hub library",
    "sentence_transformers": "a model hub library",
    "open_clip": "a model hub library",
    "requests": "an HTTP client",
    "httpx": "an HTTP client",
    "aiohttp": "an HTTP client",
    "urllib3": "an HTTP client",
    "urllib.request": "an HTTP client",
    "http.client": "an HTTP client",
    "socket": "raw network sockets",
}
# Calls that download: f(...) or x.f(...).
NETWORK_CALLS = {"from_pretrained", "hf_hub_download", "snapshot_download", "load_state_dict_from_url",
                 "download_url_to_file", "urlopen", "urlretrieve"}
REQUIRED = ("Model", "get_inputs", "get_init_inputs")


class ProblemFile(BaseModel):
    """One candidate file: where it is, its level and the registry name it would get."""

    model_config = ConfigDict(frozen=True)
    path: Path
    level: int
    stem: str  # the file name without .py, e.g. 23_Softmax

    @property
    def label(self) -> str:
        """How reports name it: level1/23_Softmax.py."""
        return f"level{self.level}/{self.path.name}"

    @property
    def name(self) -> str:
        """The problem name (folder and env id): level1-23_Softmax."""
        return f"level{self.level}-" + re.sub(r"[^A-Za-z0-9_]", "_", self.stem)


def level_dirs(root: Path) -> list[tuple[int, Path]]:
    """The level folders of a KernelBench directory: `root` itself when it is one (``level1``),
    else its ``levelN`` children, else those of ``root/KernelBench`` (the repository's root)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such directory")
    if m := LEVEL_DIR.match(root.name):
        return [(int(m.group(1)), root)]
    for base in (root, root / "KernelBench"):
        found = sorted((int(m.group(1)), p) for p in base.iterdir() if p.is_dir() and (m := LEVEL_DIR.match(p.name))) \
            if base.is_dir() else []
        if found:
            return found
    raise FileNotFoundError(f"{root}: no level1 ... level4 folders here (nor under {root / 'KernelBench'})")


def find_files(root: Path) -> tuple[list[ProblemFile], list[tuple[str, str]]]:
    """(problem files by level and number, [(file, why it is not one)] for the other .py files)."""
    files, other = [], []
    for level, folder in level_dirs(root):
        for path in sorted(folder.glob("*.py")):
            label = f"{folder.name}/{path.name}"
            m = PROBLEM_FILE.match(path.name)
            if level not in LEVELS:
                other.append((label, f"level {level} is not one of KernelBench's levels 1-4"))
            elif not m:
                other.append((label, "not named like a KernelBench problem (<number>_<Name>.py)"))
            else:
                files.append(ProblemFile(path=path.resolve(), level=level, stem=path.stem))
    files.sort(key=lambda f: (f.level, int(PROBLEM_FILE.match(f.path.name).group(1)), f.stem))
    return files, other


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _network_use(tree: ast.Module) -> str | None:
    """Why this code needs the network, or None: an import of a hub library or network client,
    or a call that downloads (``from_pretrained``, ``torch.hub.load``, ``pretrained=True``)."""
    for node in ast.walk(tree):
        modules = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for mod in modules:
            for net, what in NETWORK_MODULES.items():
                if mod == net or mod.startswith(net + "."):
                    return f"imports {net} ({what}, line {node.lineno})"
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            last = name.rsplit(".", 1)[-1]
            if last in NETWORK_CALLS or name.endswith("hub.load") or name.endswith("hub.load_state_dict_from_url"):
                return f"calls {name or last}() (line {node.lineno}), which downloads"
            for kw in node.keywords:
                if kw.arg == "pretrained" and isinstance(kw.value, ast.Constant) and kw.value.value is True:
                    return f"asks for pretrained weights (line {node.lineno}), which are downloaded"
    return None


def _module_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def static_reason(source: str, filename: str) -> str | None:
    """Why this file cannot be imported, judged from its text alone; None if it may be run."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        return f"syntax error at line {exc.lineno}: {exc.msg}"
    except ValueError as exc:  # e.g. null bytes
        return f"not Python source: {exc}"
    if why := _network_use(tree):
        return f"needs the network: {why}"
    defined = _module_level_names(tree)
    missing = [n for n in REQUIRED if n not in defined]
    if missing:
        what = ", ".join(f"{n}()" if n != "Model" else n for n in missing)
        return f"no {what} at module level (a KernelBench problem defines Model, get_inputs() and get_init_inputs())"
    return None
