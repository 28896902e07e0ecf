"""Reaching a forbidden module at run time, past the source check: each attempt fails in the
candidate and is flagged; honest imports are not (false positives are defects too)."""

from __future__ import annotations

import pytest
from conftest import requires_cpu_mode

from kb_env import get_problem
from kb_env.evaluate.evaluator import Evaluator
from rewards import default as default_reward
from rewards.shaped import MISMATCH

pytestmark = requires_cpu_mode

# softmax forbids ctypes; every header below reaches it without an `import ctypes` statement.
ATTACKS = {
    "__import__ with a computed name": "m = __import__('c' + 'types')\n",
    "importlib.import_module": "import importlib\nm = importlib.import_module('ctyp' + 'es')\n",
    "exec of an import statement": "exec('import ' + 'ctypes')\n",
    "__import__ fetched with getattr": "import builtins\nm = getattr(builtins, '__imp' + 'ort__')('ctypes')\n",
    "submodule of a forbidden package": "m = __import__('ctypes' + '.util')\n",
    "import inside forward": None,
}

HONEST = {
    "a comment naming a forbidden module": "# not using ctypes or torch._inductor here\n",
    "ordinary helper modules": "import math, functools, importlib\nm = importlib.import_module('colle' + 'ctions')\n",
    "torch's own lazy imports": "import torch._dynamo\n",
}


@pytest.fixture(scope="module")
def evaluator():
    return Evaluator(get_problem("softmax"), "cpu")


def _in_forward(solution: str) -> str:
    src = solution.replace("        return softmax(x)", "        __import__('ct' + 'ypes')\n        return softmax(x)")
    assert src != solution
    return src


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_runtime_import_of_forbidden_module_is_refused_and_flagged(evaluator, softmax_solution, attack):
    header = ATTACKS[attack]
    source = _in_forward(softmax_solution) if header is None else header + softmax_solution
    result = evaluator.evaluate(source, salt=3)
    assert "forbidden_import:ctypes" in result.flags
    assert not result.correct or result.error is not None
    assert "forbidden in this problem" in result.message
    assert default_reward(result) <= MISMATCH  # no more than a wrong answer


@pytest.mark.parametrize("control", list(HONEST))
def test_honest_imports_are_not_flagged(evaluator, softmax_solution, control):
    result = evaluator.evaluate(HONEST[control] + softmax_solution, salt=3)
    assert result.correct and result.flags == [] and result.error is None, result.message


def test_replacing_the_import_guard_is_flagged(evaluator, softmax_solution):
    header = "import builtins, importlib\nbuiltins.__import__ = importlib.__import__\n"
    result = evaluator.evaluate(header + softmax_solution, salt=3)
    assert "patched:builtins.__import__" in result.flags and result.error.value == "integrity"
