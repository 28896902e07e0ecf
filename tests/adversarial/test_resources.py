"""Resources a candidate's worker takes from the host: memory past the problem's limit ends it
as a crash, and no process it starts outlives its evaluation (plain children, or daemons that
double-fork out of its session); leaving one running is flagged. Honest subprocess use is not."""

from __future__ import annotations

import os
import time

import pytest
from conftest import candidate, requires_cpu_mode

from kb_env import get_problem
from kb_env.evaluate.evaluator import Evaluator
from kb_env.evaluate.result import ErrorKind
from kb_env.sandbox import reaper
from rewards import default as default_reward
from rewards.shaped import MISMATCH

pytestmark = requires_cpu_mode

SLEEP = b"sleep\0600123\0"  # the command line the candidates' processes run


@pytest.fixture(scope="module")
def evaluator():
    return Evaluator(get_problem("softmax"), "cpu", timeout_s=60)


def _sleepers() -> set[int]:
    """Live processes running the candidates' `sleep 600123`."""
    out = set()
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if name.isdigit() and f.read() == SLEEP:
                    out.add(int(name))
        except OSError:
            pass
    return out


def _zombie_children() -> set[int]:
    """Children of this process (the harness) that ended and were never reaped."""
    return {c for c in reaper.children(os.getpid()) if (st := reaper.stat_of(c)) and st.ended}


def _in_forward(solution: str, call: str) -> str:
    src = solution.replace("        return softmax(x)", f"        {call}\n        return softmax(x)")
    assert src != solution
    return src


# A fresh interpreter (a few MiB) holding 3 GiB: only the sum over the worker's tree is over the limit.
HOG_IN_CHILD = """import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; h = [b'1' * (64 << 20) for _ in range(48)]; time.sleep(600)"])
time.sleep(60)
"""


@pytest.mark.parametrize("where", ["worker", "child"])
def test_memory_hog_is_killed_as_a_crash_and_the_next_evaluation_works(softmax_solution, where):
    spec = get_problem("softmax")
    small = spec.model_copy(update={"limits": spec.limits.model_copy(update={"max_memory_mb": 512})})
    ev = Evaluator(small, "cpu", timeout_s=60)
    result = ev.evaluate(candidate("hog_memory") if where == "worker" else HOG_IN_CHILD + softmax_solution, salt=1)
    assert result.error is ErrorKind.crash and not result.correct
    assert "memory limit (512 MiB resident" in result.message, result.message
    assert result.wall_s < 60
    good = ev.evaluate(softmax_solution, salt=1)  # the same limit leaves room for an honest kernel
    assert good.correct and good.error is None, good.message


@pytest.mark.parametrize("header, call", [("spawn_child", "_spawn()"), ("daemon_child", "_daemonize()")])
def test_started_processes_are_killed_and_flagged(evaluator, softmax_solution, header, call):
    before = _sleepers()
    result = evaluator.evaluate(_in_forward(candidate(header) + "\n" + softmax_solution, call), salt=2)
    assert _sleepers() - before == set()
    assert not _zombie_children()
    assert "leftover_process" in result.flags
    assert result.error is ErrorKind.integrity and default_reward(result) <= MISMATCH


def test_daemon_outliving_a_crashed_worker_is_killed(evaluator, softmax_solution):
    """The worker exits right after daemonizing: the daemon, reparented to the harness, holds
    the worker's end of the channel; it is found by the worker's token and killed at once."""
    before = _sleepers()
    started = time.monotonic()
    result = evaluator.evaluate(_in_forward(candidate("daemon_child") + "\n" + softmax_solution,
                                            "_daemonize(); os._exit(3)"), salt=2)
    assert result.error is ErrorKind.crash and "status 3" in result.message, result.message
    assert time.monotonic() - started < 30  # not held up until the timeout by the daemon's open pipe
    assert _sleepers() - before == set()
    assert not _zombie_children()


def test_a_finished_subprocess_is_not_a_leftover(evaluator, softmax_solution):
    honest = 'import subprocess\nsubprocess.run(["true"], check=True)\n' + softmax_solution
    result = evaluator.evaluate(honest, salt=2)
    assert result.correct and result.flags == [] and result.error is None, result.message
