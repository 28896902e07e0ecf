"""Problems: `ProblemSpec` read from `problem.yaml`, the loader, and the registry.

A problem is one folder: ``problem.yaml`` (this module's `ProblemSpec`), ``reference.py``
(a ``Model`` plus ``get_inputs(**shape)`` / ``get_init_inputs(**shape)``), an optional
``baseline.py`` and ``solutions/*.py`` (known-good candidates).
"""

from __future__ import annotations

import ast
import importlib.util
import math
import os
import threading
import warnings
from enum import Enum
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

Shape = dict[str, int]
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # LibYAML's safe loader: 8x faster, same result


class ProblemError(ValueError):
    """A problem folder or its problem.yaml is broken; the message names the file and field."""


class Interface(str, Enum):
    forward = "forward"
    decode = "decode"


class BaselineKind(str, Enum):
    eager = "eager"  # the reference Model, run eagerly
    compile = "compile"  # torch.compile of the reference Model
    file = "baseline.py"  # the folder's baseline.py (an optimized PyTorch Model)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Tolerance(_Strict):
    """Per-output-dtype bar. An output passes when every element satisfies
    ``|out - ref| <= atol + rtol * |ref|`` AND the whole tensor's relative L2 error
    ``||out - ref|| / ||ref||`` is at most `max_rel_l2` (and, if set, the cosine similarity is
    at least `min_cosine`). The norm bar is what makes an all-zeros answer fail even where
    every reference value is below atol (softmax over 16384 columns: every output ~6e-5)."""

    atol: float = Field(ge=0)
    rtol: float = Field(ge=0)
    max_rel_l2: float = Field(gt=0, lt=1)
    min_cosine: float | None = Field(default=None, gt=0, le=1)


class Forbidden(_Strict):
    """What a candidate may not use. `imports` are module names (a prefix match: ``torch.nn.functional``
    forbids its submodules too); `torch_ops` are ATen overload packets as the dispatcher names them
    (``aten::_softmax``). `allowed_torch_ops`, when given, is an allowlist: a torch compute op that is
    neither in it nor a structural op (allocation, views, copies; see `oprules`) is flagged too.
    On a GPU the profiler decides the rest: at least `min_own_share` of the call's kernel time must be
    in the candidate's own kernels (not torch's or a vendor library's), and at most `max_launches`
    kernels may run per call (CUDA-graph replays counted kernel by kernel)."""

    imports: list[str] = Field(default_factory=list)
    torch_ops: list[str] = Field(default_factory=list)
    allowed_torch_ops: list[str] | None = None
    min_own_share: float = Field(default=0.5, ge=0, le=1)
    max_launches: int | None = Field(default=None, ge=1)

    @field_validator("torch_ops", "allowed_torch_ops")
    @classmethod
    def _aten_names(cls, ops: list[str] | None) -> list[str] | None:
        for op in ops or []:
            if "::" not in op:
                raise ValueError(f"torch op {op!r} must be namespaced, e.g. 'aten::_softmax'")
        return ops


class Limits(_Strict):
    """Limits for one candidate: wall-clock seconds for loading it (imports, kernel compilation
    on first call) and for running correctness plus timing; the largest file its worker may
    write, its captured stdout included (past it, writes fail with "File too large"); the
    candidate worker's resident memory, its children included (past it, the worker is killed
    and the candidate crashed)."""

    load_s: float = Field(default=120, gt=0)
    run_s: float = Field(default=120, gt=0)
    max_file_mb: int = Field(default=2048, ge=1)
    max_memory_mb: int = Field(default=16384, ge=64)


class Timing(_Strict):
    """How a GPU time is measured: `warmup` untimed calls, then `rounds` interleaved rounds of
    `reps` timed calls each (baseline and candidate alternate), with the L2 flushed before every
    call. Every call gets freshly drawn inputs (new content, so no cache keyed on pointers,
    versions or contents can hit); the outputs of the last `input_sets` calls of a shape are
    checked against the reference."""

    warmup: int = Field(default=10, ge=1)
    reps: int = Field(default=50, ge=3)
    rounds: int = Field(default=3, ge=1)
    input_sets: int = Field(default=3, ge=1)


class Shapes(_Strict):
    """The sizes a problem is graded at: `gpu` in CUDA mode, `cpu` (small) in CPU mode. A problem
    with no CPU shapes is GPU-only (float8 needs a GPU): CPU mode refuses it with a clear error."""

    gpu: list[Shape] = Field(min_length=1)
    cpu: list[Shape] = Field(default_factory=list)

    @model_validator(mode="after")
    def _same_variables(self) -> "Shapes":
        names = {frozenset(s) for s in self.gpu + self.cpu}
        if len(names) != 1:
            raise ValueError("every gpu and cpu shape must name the same variables")
        for s in self.gpu + self.cpu:
            if any(v <= 0 for v in s.values()):
                raise ValueError(f"shape {s} has a non-positive size")
        return self


class DecodeCheck(_Strict):
    """Correctness of one decode step (the `decode` interface), compared tensor by tensor: the next
    hidden and every tensor of the returned state, by cosine similarity (robust to bf16 and fp8
    arithmetic, near 0 for wrong answers).

    - `min_cosine`: every returned tensor against the reference's;
    - `min_delta_cosine`: what the step changed (returned minus fed, for tensors carried through at
      the same shape): an echo of the input hidden or a stale state has no change at all, and
      where the change is small against the carried value (a residual stream, a slowly decaying
      state) the full cosine alone would pass it;
    - `min_prefix_cosine`: a cache grown along its first dimension keeps the fed rows (they are
      copies), and its new rows meet `min_cosine`."""

    min_cosine: float = Field(gt=0, lt=1)
    min_delta_cosine: float = Field(gt=0, lt=1)
    min_prefix_cosine: float = Field(gt=0, le=1)


class Stress(_Strict):
    """One extra correctness case per shape: the floating inputs of a fresh seed, transformed.
    `scale` multiplies them (a kernel fitted to randn-sized values fails: a softmax without
    max-subtraction overflows at x64, an accumulation in a narrow type loses precision at /64).
    `heavy_tail` (integer degrees of freedom, 2 or more) multiplies each element by its own
    positive factor sqrt(dof / chi2(dof)), which turns normal inputs into Student-t ones: rare
    elements far larger than the rest, so a kernel cannot sniff one friendly distribution."""

    scale: float = Field(default=1.0, gt=0)
    heavy_tail: int | None = Field(default=None, ge=2, le=64)
    relax: float = Field(
        default=1.0, ge=1.0, le=100.0,
        description="this case's rtol and relative-L2 bar times `relax`: for a transform under which the "
                    "reference's own arithmetic is noisier than on the plain inputs the bars were calibrated "
                    "on (a heavy-tailed softmax row, where one term dominates a long float32 sum). "
                    "tests/test_problem_stress.py shows a seed where the plain bar fails the float64 answer")

    def describe(self) -> str:
        parts = [f"scaled by {self.scale:g}"] if self.scale != 1.0 else []
        if self.heavy_tail is not None:
            parts.append(f"heavy-tailed (Student-t, {self.heavy_tail} degrees of freedom)")
        return "inputs " + " and ".join(parts or ["unchanged"])


Regime = Literal["memory-bound", "compute-bound"]
DType = Literal["float64", "float32", "tf32", "float16", "bfloat16", "float8", "int8"]


class ProblemSpec(_Strict):
    """Everything the harness needs to grade one problem, as written in problem.yaml."""

    name: str
    description: str
    level: int = Field(ge=1, le=4, description="KernelBench's levels: 1 a single operator, 2 a fused chain, "
                                               "3 a whole block, 4 a whole-model or megakernel problem")
    interface: Interface = Interface.forward
    shapes: Shapes
    seeds: list[int] = Field(min_length=1, description="grading seeds, mixed with a secret per-evaluation salt")
    tolerance: dict[str, Tolerance] = Field(default_factory=dict, description="keyed by output dtype, e.g. 'float32' "
                                                                          "(forward problems)")
    decode: DecodeCheck | None = Field(default=None, description="the step's correctness bars (decode problems)")
    flops: str = Field(description="FLOPs of one forward call, an expression over the shape variables")
    bytes: str = Field(description="minimum bytes moved by one forward call, same variables")
    compute_dtype: DType = Field(description="which peak FLOP/s the flops are measured against")
    forbidden: Forbidden = Field(default_factory=Forbidden)
    baseline: BaselineKind = BaselineKind.eager
    limits: Limits = Field(default_factory=Limits)
    timing: Timing = Field(default_factory=Timing)
    stress: list[Stress] = Field(
        default_factory=list,
        description="extra correctness cases per shape: transformed inputs (scaled up or down, heavy-tailed), "
                    "which catch kernels fitted to one input distribution")
    scale_degree: int | None = Field(
        default=None, ge=1, le=4,
        description="the reference is homogeneous of this degree in its inputs: scaling every floating input by "
                    "s scales every output by s**degree (a cumulative sum 1, a product of two inputs 2). A stress "
                    "case scaled up then gets its atol scaled the same way, so a near-zero output of a sum "
                    "whose terms grew 64x is held to the plain case's relative bar, not to a floor 64x tighter "
                    "(tested against the reference)")
    regime: Regime | list[Regime] | None = Field(
        default=None, description="the roofline regime on the H100 and H200 rows of the hardware table (tested "
                                  "against the formulas): one for every GPU shape, or a list with one per GPU "
                                  "shape where they differ (a GEMM at decode and at prefill sizes); the agent is told it")

    def tolerance_for(self, stress: dict[str, Any] | None) -> dict[str, Tolerance]:
        """The per-dtype bars for a case: `tolerance`, with atol times scale**scale_degree for a stress
        case scaled up, of a homogeneous reference (see `scale_degree`), and rtol and the relative-L2
        bar times the stress's `relax`. A case scaled down keeps the plain atol: never a floor tighter
        than the one the problem was calibrated with."""
        scale = float((stress or {}).get("scale", 1.0))
        relax = float((stress or {}).get("relax", 1.0))
        atol_factor = scale ** self.scale_degree if self.scale_degree is not None and scale > 1.0 else 1.0
        if atol_factor == 1.0 and relax == 1.0:
            return self.tolerance
        return {dtype: tol.model_copy(update={"atol": tol.atol * atol_factor, "rtol": tol.rtol * relax,
                                              "max_rel_l2": tol.max_rel_l2 * relax})
                for dtype, tol in self.tolerance.items()}

    # Set by the loader, not written in the yaml.
    folder: Path = Field(default=Path("."), exclude=True)

    @field_validator("flops", "bytes")
    @classmethod
    def _formula_parses(cls, text: str) -> str:
        _compile_formula(text)
        return text

    @model_validator(mode="after")
    def _formulas_use_shape_variables(self) -> "ProblemSpec":
        variables = set(self.shapes.gpu[0])
        for field in ("flops", "bytes"):
            unknown = _formula_names(getattr(self, field)) - variables
            if unknown:
                raise ValueError(f"{field}: unknown variable(s) {sorted(unknown)}; shapes define {sorted(variables)}")
        if self.interface is Interface.forward and not self.tolerance:
            raise ValueError("tolerance: a forward problem needs at least one output dtype's tolerance")
        if self.interface is Interface.decode:
            if self.decode is None:
                raise ValueError("decode: a decode problem needs its step's correctness bars (min_cosine, ...)")
            if any(s.get("steps", 0) < 2 or "context" not in s for s in self.shapes.gpu + self.shapes.cpu):
                raise ValueError("shapes: every decode shape needs `context` and `steps` (2 or more chained steps "
                                 "per timed run)")
        for dtype in self.tolerance:
            if dtype not in {"float64", "float32", "float16", "bfloat16", "int64", "int32", "bool"}:
                raise ValueError(f"tolerance: unknown dtype {dtype!r}")
        for stress in self.stress:
            loose = [d for d, tol in self.tolerance.items() if tol.max_rel_l2 * stress.relax >= 1]
            if loose:
                raise ValueError(f"stress {stress.describe()}: relax {stress.relax:g} takes the {loose[0]} relative-L2 "
                                 "bar to 1 or more, which an all-zeros answer meets")
        if isinstance(self.regime, list):
            if len(self.regime) != len(self.shapes.gpu):
                raise ValueError(f"regime: {len(self.regime)} entries for {len(self.shapes.gpu)} GPU shapes "
                                 "(give one regime, or one per GPU shape)")
            if len(set(self.regime)) == 1:
                raise ValueError(f"regime: every GPU shape is {self.regime[0]}; write it once")
        return self

    # ----- derived facts -------------------------------------------------------------
    def shapes_for(self, mode: str) -> list[Shape]:
        return list(self.shapes.gpu if mode == "cuda" else self.shapes.cpu)

    @property
    def gpu_only(self) -> bool:
        return not self.shapes.cpu

    def regime_of(self, gpu_shape_index: int) -> Regime | None:
        """The declared regime of the GPU shape at this index."""
        return self.regime[gpu_shape_index] if isinstance(self.regime, list) else self.regime

    @property
    def regime_label(self) -> str | None:
        """The regime in one word: 'mixed' where the GPU shapes differ."""
        return "mixed" if isinstance(self.regime, list) else self.regime

    def flops_of(self, shape: Shape) -> float:
        return _eval_formula(self.flops, shape)

    def bytes_of(self, shape: Shape) -> float:
        return _eval_formula(self.bytes, shape)

    @property
    def reference_path(self) -> Path:
        return self.folder / "reference.py"

    @property
    def baseline_path(self) -> Path | None:
        path = self.folder / "baseline.py"
        return path if path.exists() else None

    @property
    def solution_paths(self) -> list[Path]:
        return sorted((self.folder / "solutions").glob("*.py"))

    def reference_source(self) -> str:
        return self.reference_path.read_text()

    def env_id(self) -> str:
        return f"KernelBench/{self.name}-v0"


# ----- formulas: arithmetic over shape variables, nothing else ---------------------------
_ALLOWED_NODES = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Load, ast.Call,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Pow, ast.Mod, ast.USub, ast.UAdd,
)
_FUNCS = {"ceil": math.ceil, "floor": math.floor, "min": min, "max": max, "log2": math.log2}


def _compile_formula(text: str) -> ast.Expression:
    try:
        tree = ast.parse(str(text), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"formula {text!r} is not an expression: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise ValueError(f"formula {text!r}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _FUNCS):
            raise ValueError(f"formula {text!r}: only {sorted(_FUNCS)} may be called")
    return tree


def _formula_names(text: str) -> set[str]:
    return {n.id for n in ast.walk(_compile_formula(text)) if isinstance(n, ast.Name)} - set(_FUNCS)


@lru_cache(maxsize=None)
def _formula_code(text: str):
    with _PARSE_LOCK:  # CPython 3.11's AST builder is not safe in two threads at once
        return compile(_compile_formula(text), "<formula>", "eval")


_PARSE_LOCK = threading.Lock()


def _eval_formula(text: str, shape: Shape) -> float:
    return float(eval(_formula_code(text), {"__builtins__": {}}, {**_FUNCS, **shape}))  # noqa: S307 (checked AST)


# ----- loading -------------------------------------------------------------------------
def _fmt_loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def load_problem(folder: str | os.PathLike) -> ProblemSpec:
    """Read and validate ``folder/problem.yaml``; errors name the file and the field."""
    folder = Path(folder).resolve()
    path = folder / "problem.yaml"
    if not path.is_file():
        raise ProblemError(f"{path}: no such file (a problem folder needs problem.yaml)")
    try:
        raw = yaml.load(path.read_text(), Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        raise ProblemError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ProblemError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    raw.setdefault("name", folder.name)
    try:
        spec = ProblemSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ProblemError(f"{path}: field {_fmt_loc(first['loc'])}: {first['msg']}{more}") from None
    if spec.name != folder.name:
        raise ProblemError(f"{path}: field name: {spec.name!r} differs from the folder name {folder.name!r}")
    if not (folder / "reference.py").is_file():
        raise ProblemError(f"{folder / 'reference.py'}: no such file")
    if spec.baseline is BaselineKind.file and not (folder / "baseline.py").is_file():
        raise ProblemError(f"{path}: field baseline: 'baseline.py' named but {folder / 'baseline.py'} is missing")
    return spec.model_copy(update={"folder": folder})


def problems_root() -> Path:
    """Where the shipped problem folders live: $KB_PROBLEMS_DIR, else the installed data, else the source tree."""
    if env := os.environ.get("KB_PROBLEMS_DIR"):
        return Path(env)
    spec = importlib.util.find_spec("kb_env.problems")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            if Path(loc).is_dir():
                return Path(loc)
    return Path(__file__).resolve().parents[1] / "problems"


def import_cache_root() -> Path:
    """Where imported problems are materialized (`kb import`, `kb_env.register_kernelbench`):
    $KB_IMPORT_DIR, else $XDG_CACHE_HOME/kb_env/imported, else ~/.cache/kb_env/imported. The
    registry reads it in every process, so an import made once is seen by later ones."""
    if env := os.environ.get("KB_IMPORT_DIR"):
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "kb_env" / "imported"


_EXTRA_ROOTS: list[Path] = []  # added in this process by add_problem_root


def add_problem_root(root: str | os.PathLike) -> None:
    """Also read problem folders from `root`, in this process (other processes: $KB_PROBLEM_PATH)."""
    root = Path(root).resolve()
    if root not in _EXTRA_ROOTS:
        _EXTRA_ROOTS.append(root)


def problem_roots() -> list[Path]:
    """Every folder the registry reads, in order: the shipped problems (`problems_root()`), each
    folder in $KB_PROBLEM_PATH (os.pathsep-separated), those added by `add_problem_root`, and the
    import cache (`import_cache_root()`). Folders that do not exist are left out."""
    extra = [Path(p) for p in os.environ.get("KB_PROBLEM_PATH", "").split(os.pathsep) if p]
    roots: list[Path] = []
    for root in [problems_root(), *extra, *_EXTRA_ROOTS, import_cache_root()]:
        root = root.resolve()
        if root not in roots and (root == problems_root().resolve() or root.is_dir()):
            roots.append(root)
    return roots


@lru_cache(maxsize=None)
def _registry(root: Path, strict: bool = True) -> dict[str, ProblemSpec]:
    """The problems in `root`. A broken folder is an error in a `strict` root (the shipped
    problems); elsewhere (imports, perhaps written by another kb_env version) it is left out
    with a warning, so that one stale import cannot stop `import kb_env`."""
    out = {}
    for folder in sorted(p for p in root.iterdir() if (p / "problem.yaml").is_file()):
        try:
            out[folder.name] = load_problem(folder)
        except ProblemError as exc:
            if strict:
                raise
            warnings.warn(f"left out a broken imported problem: {exc} (import it again)", stacklevel=2)
    return out


def refresh_problems() -> None:
    """Forget what the registry read, so folders written since (an import) are seen."""
    _registry.cache_clear()


def all_problems() -> dict[str, ProblemSpec]:
    """Every problem under `problem_roots()`, by name; a name in two roots is an error."""
    out: dict[str, ProblemSpec] = {}
    shipped = problems_root().resolve()
    for root in problem_roots():
        for name, spec in _registry(root, strict=root == shipped).items():
            if name in out:
                raise ProblemError(f"problem {name!r} is defined twice: in {out[name].folder} and in {spec.folder}")
            out[name] = spec
    return out


def problem_names() -> list[str]:
    """The names of the problem folders under `problem_roots()`, without reading them (cheap:
    what `import kb_env` registers; `get_problem` validates a problem when it is used)."""
    names = {p.name for root in problem_roots() for p in root.iterdir() if (p / "problem.yaml").is_file()}
    return sorted(names)


def get_problem(name: str) -> ProblemSpec:
    problems = all_problems()
    if name not in problems:  # imported since this process read the registry?
        refresh_problems()
        problems = all_problems()
    if name not in problems:
        raise ProblemError(f"unknown problem {name!r}; known: {', '.join(sorted(problems)) or 'none'}")
    return problems[name]


def import_file(path: Path, module_name: str) -> ModuleType:
    """Import a Python file as a fresh module. It is in sys.modules while it executes, as in a
    plain import (a dataclass under postponed annotations looks its module up there), and taken
    out again afterwards."""
    import sys

    spec = importlib.util.spec_from_file_location(module_name, str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    previous = sys.modules.get(module_name)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        if previous is None:
            sys.modules.pop(module_name, None)
        else:
            sys.modules[module_name] = previous
    return module


def import_source(source: str, module_name: str, filename: str) -> ModuleType:
    """Execute Python source text as a fresh module (not added to sys.modules). The harness
    sends problem code to its workers as text read once, so a file rewritten on disk during an
    evaluation changes nothing."""
    module = ModuleType(module_name)
    module.__file__ = filename
    # dont_inherit: the problem's code gets its own __future__ flags, not this module's (postponed
    # annotations would leave a dataclass in it unable to resolve them outside sys.modules)
    exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)  # noqa: S102 (trusted problem code)
    return module
