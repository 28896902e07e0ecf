"""The warm path (CPU mode): workers forked from the warm server, a reference worker kept across
evaluations with its cached outputs, spare candidate workers, the GPU lock. A crashed candidate
leaves the server and the next evaluation clean; servers and reference workers are replaced after
N uses or a fault; nothing a candidate does to its process, environment or folder reaches the next
one; cached reference outputs are the fresh ones, bit for bit."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from conftest import candidate, requires_cpu_mode

from kb_env import get_problem
from kb_env.evaluate import seeds
from kb_env.evaluate.evaluator import Evaluator
from kb_env.evaluate.workers import CandidateSpares
from kb_env.problem import import_source
from kb_env.sandbox import reaper, server
from kb_env.sandbox.cases import make_inputs, make_reference_model
from kb_env.sandbox.runner import WorkerProcess, base_env

pytestmark = requires_cpu_mode


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(get_problem("softmax"), "cpu", timeout_s=120) as ev:
        yield ev


def _server_pids() -> set[int]:
    return {s.pid for s in server.running()}


def test_a_crash_leaves_the_server_and_the_next_evaluation_clean(evaluator, softmax_solution):
    first = evaluator.evaluate(softmax_solution, salt=1)
    assert first.correct and first.perf.candidate_start == "server", first.perf
    servers = _server_pids()
    crashed = evaluator.evaluate(candidate("segfault"), salt=2)
    assert crashed.error.value == "crash" and "SIGSEGV" in crashed.message
    good = evaluator.evaluate(softmax_solution, salt=3)
    assert good.correct and good.error is None and good.flags == [], good.message
    assert _server_pids() == servers and all(s.alive() for s in server.running())  # the same server
    assert good.perf.candidate_start == "server" and good.perf.reference_start == "warm"
    assert good.perf.reference_uses >= 2


def test_a_dead_reference_worker_is_replaced(evaluator, softmax_solution):
    evaluator.evaluate(softmax_solution, salt=4)
    idle = evaluator._refs._idle
    assert len(idle) == 1
    os.kill(idle[0].worker.proc.pid, signal.SIGKILL)  # a fault between evaluations
    result = evaluator.evaluate(softmax_solution, salt=5)
    assert result.correct and result.perf.reference_start == "server" and result.perf.reference_uses == 0


LEAK = '''
import os, sys, tempfile, torch
import kb_env.sandbox.worker as _w
os.environ["KB_LEAKED_ENV"] = "1"
_w.KB_LEAKED_GLOBAL = 1
torch.nn.functional.KB_LEAKED_GLOBAL = 1
sys.modules["kb_leaked_module"] = sys
open("leaked.txt", "w").write("x")
open(os.path.join(tempfile.gettempdir(), "leaked.txt"), "w").write("x")
print("FOLDERS", os.getcwd(), tempfile.gettempdir())
'''

LOOK = '''
import os, sys, tempfile, torch
import kb_env.sandbox.worker as _w
seen = {"env": "KB_LEAKED_ENV" in os.environ, "worker": hasattr(_w, "KB_LEAKED_GLOBAL"),
        "torch": hasattr(torch.nn.functional, "KB_LEAKED_GLOBAL"), "module": "kb_leaked_module" in sys.modules,
        "cwd_file": os.path.exists("leaked.txt"),
        "tmp_file": os.path.exists(os.path.join(tempfile.gettempdir(), "leaked.txt"))}
print("SEEN", sorted(k for k, v in seen.items() if v))
print("FOLDERS", os.getcwd(), tempfile.gettempdir())
'''


def _line(result, prefix: str) -> list[str]:
    return next(ln for ln in result.candidate_output.splitlines() if ln.startswith(prefix)).split()[1:]


def test_no_candidate_state_reaches_the_next_evaluation(evaluator, softmax_solution):
    leaker = evaluator.evaluate(LEAK + softmax_solution, salt=6)
    assert leaker.correct, leaker.message
    looker = evaluator.evaluate(LOOK + softmax_solution, salt=7)
    assert looker.correct, looker.message
    assert _line(looker, "SEEN") == ["[]"]
    before, after = _line(leaker, "FOLDERS"), _line(looker, "FOLDERS")
    assert before[0] != after[0] and before[1] != after[1]  # its own folder and temporary files
    assert not os.path.exists(before[0]) and not os.path.exists(before[1])  # deleted with its evaluation


def test_cached_reference_outputs_are_the_fresh_ones(evaluator, softmax_solution, monkeypatch):
    """With a pool of two seeds per shape every pooled case of a second evaluation hits the cache,
    and the known-good candidate still passes against the cached outputs."""
    monkeypatch.setattr(seeds, "SEED_POOL", 2)
    spec = evaluator.spec
    pooled_per_eval = len(spec.shapes.cpu) * (len(spec.seeds) - seeds.FRESH_GRADING)
    with Evaluator(spec, "cpu", timeout_s=120) as ev:
        first = ev.evaluate(softmax_solution, salt=8)
        second = ev.evaluate(softmax_solution, salt=9)
    assert first.correct and second.correct, second.message
    assert first.perf.reference_cache_hits == 0
    assert second.perf.reference_cache_hits == pooled_per_eval


def test_cached_outputs_equal_a_fresh_workers_bit_for_bit(tmp_path):
    """The reference worker's cached outputs against outputs computed here from the same seeds:
    every element equal, on a cache miss, a cache hit and in a worker with no cache; a slightly
    different answer is not."""
    spec = get_problem("softmax")
    shape = spec.shapes.cpu[0]
    case = {"shape": shape, "seed": 1234, "param_seed": 99, "cache": True}
    reference = import_source(spec.reference_source(), "ref_here", str(spec.reference_path))
    model = make_reference_model(reference, shape, case["param_seed"]).eval()
    with torch.no_grad():
        here = model(*make_inputs(reference, shape, case["seed"], "cpu"))
    setup = {"op": "setup", "mode": "cpu", "problem_dir": str(spec.folder), "reference_source": spec.reference_source(),
             "interface": "forward", "role": "reference", "baseline": "eager", "baseline_source": None,
             "spec": spec.model_dump(mode="json")}
    errors = []
    for cache_bytes in (1 << 20, 0):
        w = WorkerProcess("reference", "cpu", tmp_path / f"r{cache_bytes}")
        try:
            assert w.request({**setup, "cache_bytes": cache_bytes}, 120)["ok"]
            hits = [w.request({"op": "reference_outputs", "cases": [{**case, "id": cid}]}, 120)["cache_hits"]
                    for cid in ("a", "b")]
            assert hits == ([0, 1] if cache_bytes else [0, 0])
            for cid in ("a", "b"):
                for got, exact in ((here, True), (here * (1 + 1e-3), False)):
                    chk = w.request({"op": "check", "case_id": cid, "outputs": [got]}, 120)
                    errors.append((chk["max_abs_err"] == 0.0) == exact)
        finally:
            w.close()
    assert all(errors), errors


def test_the_server_is_recycled_after_n_forks_and_after_a_fault(tmp_path):
    env = base_env("cpu") | {reaper.TOKEN_VAR: server.TOKEN_PLACEHOLDER, "KB_TEST_TAG": "recycle"}

    def fork_one(i: int) -> int:
        s = server.server_for("cpu", env, max_forks=2)
        w = WorkerProcess.__new__(WorkerProcess)  # a bare worker: pipes and a log, forked by `s`
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        with open(tmp_path / f"w{i}.log", "wb") as log:
            pid = s.fork((r1, w2, log.fileno()), tmp_path, env | {reaper.TOKEN_VAR: "1" * 32}, 0)
        os.close(r1)
        os.close(w2)
        from kb_env.sandbox.protocol import Channel

        ch = Channel(r2, w1)
        ch.send({"op": "warm", "mode": "cpu"})
        assert ch.recv(timeout=60)["ok"]
        ch.send({"op": "exit"})
        ch.recv(timeout=60)
        ch.close()
        assert os.waitpid(pid, 0)[0] == pid  # the worker is this process's child
        del w
        return s.pid

    pids = [fork_one(i) for i in range(3)]
    assert pids[0] == pids[1] != pids[2]  # a new server after two forks
    assert reaper.stat_of(pids[0]) is None or reaper.stat_of(pids[0]).ended  # the old one exited
    os.kill(pids[2], signal.SIGKILL)  # a candidate may shoot the server: it is the same user
    time.sleep(0.2)
    assert fork_one(3) not in pids
    server.drop(server.server_for("cpu", env, max_forks=2))


def test_a_worker_starts_even_when_its_server_was_killed(tmp_path):
    w = WorkerProcess("candidate", "cpu", tmp_path / "a")
    w.close()
    for s in server.running():
        os.kill(s.pid, signal.SIGKILL)
    time.sleep(0.2)
    w = WorkerProcess("candidate", "cpu", tmp_path / "b")
    try:
        assert w.started_by == "server" and w.request({"op": "warm", "mode": "cpu"}, 60)["ok"]
    finally:
        w.close()


def test_freeze_stops_the_worker_and_thaw_lets_it_go_on(tmp_path):
    w = WorkerProcess("candidate", "cpu", tmp_path / "f")
    try:
        w.freeze()
        assert reaper.stat_of(w.proc.pid).state == "T"
        w.thaw()
        assert reaper.stat_of(w.proc.pid).state != "T"
        assert w.request({"op": "warm", "mode": "cpu"}, 60)["ok"]
    finally:
        w.close()


def test_a_spare_is_started_ahead_and_used_once():
    spares = CandidateSpares("cpu", 1 << 30, 4 << 30, ahead=True)
    try:
        first, ahead = spares.take()
        assert not ahead  # nothing was ready yet; the next one starts now, in the background
        second, ahead = spares.take()
        assert ahead and second.warm_reply["ok"] and second.worker is not first.worker
        assert second.folder != first.folder and second.worker.alive()
        first.discard()
        second.discard()
        assert not second.folder.exists() and not second.worker.alive()
    finally:
        spares.close()


@pytest.mark.parametrize("start", ["spawn", "auto"])
def test_a_worker_outlives_the_thread_that_started_it(tmp_path, start):
    """A worker dies with the harness (PR_SET_PDEATHSIG), which Linux ties to the thread that made
    it: a spare readied on a background thread, or a reference worker kept after the evaluation
    thread that started it ended, must still answer afterwards (spawned workers are started on one
    long-lived launcher thread; forked ones are the harness process's children)."""
    made: list[WorkerProcess] = []

    def start_and_ready() -> None:  # answered: the worker armed its signal while this thread lived
        made.append(WorkerProcess("candidate", "cpu", tmp_path / start, start=start))
        assert made[0].request({"op": "warm", "mode": "cpu"}, 60)["ok"]

    t = threading.Thread(target=start_and_ready)
    t.start()
    t.join()
    w = made[0]
    try:
        time.sleep(0.5)  # the signal, were it armed to the ended thread, has come by now
        assert w.alive() and w.request({"op": "warm", "mode": "cpu"}, 60)["ok"]
    finally:
        w.close()


def test_spares_readied_ahead_are_alive_when_taken():
    spares = CandidateSpares("cpu", 1 << 30, 4 << 30, ahead=True, start="spawn")
    try:
        first, _ = spares.take()
        for _ in range(2):
            nxt, ahead = spares.take()
            assert ahead and nxt.worker.started_by == "spawn"
            time.sleep(0.3)
            assert nxt.worker.alive() and nxt.worker.request({"op": "warm", "mode": "cpu"}, 60)["ok"]
            nxt.discard()
        first.discard()
    finally:
        spares.close()


class RecordingLock:
    """A lock that records who held it when."""

    def __init__(self):
        self._lock = threading.Lock()
        self.held: list[tuple[int, float, float]] = []

    def acquire(self, blocking: bool = True) -> bool:
        got = self._lock.acquire(blocking)
        if got:
            self._since = time.monotonic()
        return got

    def release(self) -> None:
        self.held.append((threading.get_ident(), self._since, time.monotonic()))
        self._lock.release()


def test_overlapped_evaluations_never_measure_at_once(softmax_solution, monkeypatch):
    """Two evaluations at once with `overlap`: every timing stage runs while its thread holds the
    lock, and one of them waited for it; what else they do may run at once."""
    import sys

    evaluator_module = sys.modules["kb_env.evaluate.evaluator"]  # kb_env.evaluate is also a function's name
    lock = RecordingLock()
    monkeypatch.setattr(evaluator_module, "gpu_lock", lambda mode: lock)
    marks: list[tuple[int, float, str]] = []

    def note(stage: str) -> None:
        marks.append((threading.get_ident(), time.monotonic(), stage))

    results = []

    def run(salt: int) -> None:
        with Evaluator(get_problem("softmax"), "cpu", timeout_s=300, overlap=True, progress=note) as ev:
            results.append(ev.evaluate(softmax_solution, salt=salt))

    threads = [threading.Thread(target=run, args=(salt,)) for salt in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and all(r.correct for r in results), [r.message for r in results]
    assert len(lock.held) == 2
    timing = [(who, t) for who, t, stage in marks if stage.startswith("timing")]
    assert len(timing) == 2 * len(get_problem("softmax").shapes.cpu)
    for who, t in timing:
        assert any(holder == who and t0 <= t <= t1 for holder, t0, t1 in lock.held), (who, t, lock.held)


def test_kept_reference_workers_are_capped_per_process(softmax_solution, monkeypatch):
    """Each warm evaluator keeps its reference worker (its problem's models and cached outputs);
    past the process's cap the least recently used is closed, so a sweep over many problems in one
    process does not hold one per problem (on a GPU, sixteen ran an H200 out of memory)."""
    from kb_env.evaluate import workers

    monkeypatch.setenv("KB_MAX_KEPT_REFERENCES", "1")
    first = Evaluator(get_problem("softmax"), "cpu", timeout_s=120)
    second = Evaluator(get_problem("softmax"), "cpu", timeout_s=120)
    try:
        assert first.evaluate(softmax_solution).correct
        assert workers.kept_references("cpu") == 1
        kept = first._refs._idle[0].worker
        assert second.evaluate(softmax_solution).correct
        assert workers.kept_references("cpu") == 1  # the first evaluator's worker was closed
        assert first._refs._idle == [] and not kept.alive()
        assert first.evaluate(softmax_solution).correct  # it starts a new one when needed
    finally:
        first.close()
        second.close()
    assert not [pool for pool, _ in workers._kept.values() if pool in (first._refs, second._refs)]  # close() let go


_PRELOAD_ASKING = """
import json, sys, torch
asked = []
def _count():  # what torch.cuda.is_available() and the driver's device count end in: cuInit
    asked.append(1)
    return 1
torch.cuda.is_available = lambda: bool(_count())
torch.cuda.device_count = _count
from kb_env.sandbox.zygote import preload
info = preload("cuda")
print(json.dumps({"asked": len(asked), "threads": info["threads"],
                  "cpp_extension": "torch.utils.cpp_extension" in sys.modules}))
"""


def test_the_server_never_asks_for_the_cuda_driver():
    """On a CUDA build, asking whether CUDA is available initializes the driver (a thread; no worker
    forked afterwards could use CUDA): the server's imports must not ask. torch.utils.cpp_extension
    asks at import when it finds a CUDA install, so the server leaves it to the workers."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _PRELOAD_ASKING], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"asked": 0, "threads": 1, "cpp_extension": False}
