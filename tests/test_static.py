"""Static checks on candidate source (kb_env.evaluate.static.check_source): what is a compile
error, what is a model, and which imports a problem's `forbidden.imports` catches."""

from __future__ import annotations

import pytest

from kb_env.evaluate.static import MAX_SOURCE_BYTES, check_source

MODEL = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
FORBIDDEN = ["cupy", "numba", "torch._inductor"]


def flags_of(extra: str, forbidden=FORBIDDEN) -> list[str]:
    report = check_source(extra + "\n" + MODEL, forbidden)
    assert report.error is None, report.error
    return report.flags


# ----- compile errors -------------------------------------------------------------------------
def test_clean_candidate_has_no_error_and_no_flags():
    report = check_source(MODEL, FORBIDDEN)
    assert report.error is None
    assert report.flags == []


def test_syntax_error_names_the_line():
    source = "import torch\n\nclass ModelNew(torch.nn.Module:\n    pass\n"
    report = check_source(source, [])
    assert report.error is not None
    assert report.error.startswith("SyntaxError")
    assert "line 3" in report.error
    assert "class ModelNew(torch.nn.Module:" in report.error  # the offending text is quoted


def test_indentation_error_is_a_compile_error_with_line():
    report = check_source("class ModelNew:\n    x = 1\n      y = 2\n", [])
    assert report.error is not None and "line 3" in report.error


@pytest.mark.parametrize("source", ["", "   \n\t\n"], ids=["empty", "whitespace"])
def test_empty_source_is_an_error(source):
    report = check_source(source, [])
    assert report.error is not None and "empty" in report.error


@pytest.mark.parametrize("action", [None, b"class ModelNew: pass", 42, ["class ModelNew: pass"]],
                         ids=["None", "bytes", "int", "list"])
def test_non_string_action_is_an_error_naming_its_type(action):
    report = check_source(action, [])
    assert report.error is not None
    assert type(action).__name__ in report.error


def test_oversize_source_is_an_error():
    source = MODEL + "#" * MAX_SOURCE_BYTES
    report = check_source(source, [])
    assert report.error is not None and "KiB" in report.error


def test_size_limit_counts_bytes_not_characters():
    # 2-byte characters: under the limit in characters, over it in UTF-8 bytes
    comment = "# " + "é" * (MAX_SOURCE_BYTES // 2 + 10) + "\n"
    assert len(comment) < MAX_SOURCE_BYTES + 100
    assert check_source(MODEL + comment, []).error is not None
    # and just under the limit is fine
    fits = "# " + "x" * (MAX_SOURCE_BYTES - len(MODEL) - 10) + "\n"
    assert check_source(MODEL + fits, []).error is None


def test_null_bytes_are_a_compile_error_not_an_exception():
    report = check_source(MODEL + "\x00\n", [])
    assert report.error is not None


def test_check_does_not_run_the_source(tmp_path):
    marker = tmp_path / "ran"
    source = f"open({str(marker)!r}, 'w').close()\n" + MODEL
    assert check_source(source, []).error is None
    assert not marker.exists()


# ----- the model class ----------------------------------------------------------------------------
@pytest.mark.parametrize("source", [
    "import torch\nclass Net(torch.nn.Module):\n    pass\n",
    "def ModelNew():\n    pass\n",
    "def make():\n    class ModelNew:\n        pass\n    return ModelNew\n",  # not at the top level
    "x = 1\n",
    "# class ModelNew: only a comment\n",
    "s = 'class ModelNew: pass'\n",
], ids=["other-name", "function", "nested", "no-class", "comment", "string"])
def test_no_model_class_is_an_error(source):
    report = check_source(source, [])
    assert report.error is not None
    assert "ModelNew" in report.error


@pytest.mark.parametrize("source", [
    "class Model:\n    pass\n",
    "class ModelNew:\n    pass\n",
    "import torch\nclass Fast(torch.nn.Module):\n    pass\nModel = Fast\n",
    "class Fast:\n    pass\nModelNew: type = Fast\n",
    "from mykernels import ModelNew\n",
    "from mykernels import Fast as Model\n",
    "import mykernels as ModelNew\n",
], ids=["Model", "ModelNew", "assign", "annassign", "from-import", "from-import-as", "import-as"])
def test_model_defined_any_usual_way_is_accepted(source):
    assert check_source(source, []).error is None


# ----- forbidden imports ---------------------------------------------------------------------------
@pytest.mark.parametrize("line", [
    "import cupy",
    "import cupy.cuda as c",
    "import os, cupy",
    "from cupy import asarray",
    "from cupy.cuda import runtime",
    "__import__('cupy')",
    "m = __import__('cupy.linalg')",
    "import importlib\nimportlib.import_module('cupy.linalg')",
    "from importlib import import_module\nimport_module('cupy')",
    "def later():\n    import cupy\n    return cupy",  # inside a function body
    "try:\n    import cupy\nexcept ImportError:\n    cupy = None",
], ids=["import", "import-sub-as", "import-list", "from", "from-sub", "dunder", "dunder-sub",
        "importlib", "import_module", "in-function", "in-try"])
def test_forbidden_import_forms_are_flagged(line):
    assert flags_of(line) == ["forbidden_import:cupy"]


@pytest.mark.parametrize("line", [
    "import torch._inductor",
    "import torch._inductor.codecache",
    "from torch._inductor.codecache import AsyncCompile",
    "from torch import _inductor",
    "importlib_like = __import__('torch._inductor.utils')",
], ids=["exact", "submodule", "from-submodule", "from-parent", "dunder"])
def test_prefix_rule_forbids_submodules(line):
    assert flags_of(line) == ["forbidden_import:torch._inductor"]


@pytest.mark.parametrize("line", [
    "import cupyx",
    "import cupy_like",
    "import torch._inductor_like",
    "from torch import _inductor_like",
    "import numbat",
    "import mycupy",
    "from . import cupy",  # a relative import is the candidate's own file, not the package
    "import triton\nimport triton.language as tl",
    "import torch.nn.functional as F",
], ids=["cupyx", "cupy_like", "inductor_like", "from-inductor_like", "numbat", "mycupy", "relative",
        "triton", "torch-nn"])
def test_lookalike_names_are_not_flagged(line):
    assert flags_of(line) == []


def test_several_violations_are_each_flagged_once_and_sorted():
    flags = flags_of("import numba\nimport cupy\nimport cupy.cuda\nfrom numba import cuda\n")
    assert flags == ["forbidden_import:cupy", "forbidden_import:numba"]


def test_nothing_forbidden_means_nothing_flagged():
    assert flags_of("import cupy\nimport numba", forbidden=[]) == []


def test_forbidden_import_does_not_hide_a_missing_model():
    report = check_source("import cupy\n", FORBIDDEN)
    assert report.error is not None and "ModelNew" in report.error
