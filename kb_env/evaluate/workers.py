"""The worker processes of one evaluator, on the trusted side: warm reference workers, spare
candidate workers, and the per-process GPU lock.

- `ReferencePool`: reference workers (trusted: they run only the problem's code) set up once for
  the problem and reused, one evaluation at a time each (several when evaluations run at once),
  keeping their models and cached reference outputs; one is replaced after `max_uses` evaluations
  and after any fault (it died, failed a request, or an evaluation stopped halfway).
- `CandidateSpares`: a candidate worker started ahead of its candidate, with its evaluation's
  folder: forked (or spawned) and, in CUDA mode, its device ready (``warm``), while no candidate
  code exists in it. A spare is used once, by one evaluation, and the next is started in the
  background when it is taken, so that its CUDA initialization overlaps the agent's think time or
  the rest of the evaluation instead of adding to it.
- Kept (idle) reference workers are capped per process and mode (`MAX_KEPT_REFERENCES`, least
  recently used closed first): each holds its problem's models, inputs and cached outputs, on the
  GPU in CUDA mode, so a sweep over many problems in one process must not keep one per problem
  (sixteen level-1 problems kept at once ran an H200 out of memory).
- `gpu_lock`: one lock per mode in this process. Evaluations hold it while they measure (see
  `Evaluator`'s `overlap`), so two timings never share the GPU.
- `measure_lock`: held only while an evaluation measures (timing, profiling), and by a spare while
  it initializes CUDA: a context being created (driver work, memory mapped on the device) never
  lands in a timed batch of this process.

An evaluator in a process forked from the one that made it (a vector environment's worker) starts
with none of these: the parent's workers are the parent's."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal

from ..sandbox.runner import ProtocolViolation, WorkerDied, WorkerProcess, WorkerTimeout

REF_MAX_USES = 64
SPARE_TIMEOUT_S = 300.0
END_TIMEOUT_S = 60.0  # "end" only forgets the last evaluation's cases: a worker slower than this is replaced

# Idle reference workers kept per process and mode; KB_MAX_KEPT_REFERENCES overrides both.
MAX_KEPT_REFERENCES = {"cuda": 2, "cpu": 8}
_kept: OrderedDict[tuple[int, int], tuple["ReferencePool", "Ref"]] = OrderedDict()  # least recently used first
_kept_lock = threading.Lock()


def _kept_cap(mode: str) -> int:
    env = os.environ.get("KB_MAX_KEPT_REFERENCES")
    return int(env) if env else MAX_KEPT_REFERENCES[mode]


def _keep(pool: "ReferencePool", ref: "Ref") -> None:
    """`ref` joins the process's kept workers; past the cap, the least recently used is closed."""
    evicted = []
    with _kept_lock:
        _kept[(id(pool), ref.index)] = (pool, ref)
        same_mode = [key for key, (p, _) in _kept.items() if p.mode == pool.mode]
        for key in same_mode[: max(0, len(same_mode) - _kept_cap(pool.mode))]:
            evicted.append(_kept.pop(key))
    for old_pool, old_ref in evicted:
        if old_pool._forget(old_ref):
            old_ref.worker.close()
            shutil.rmtree(old_pool.dir / f"ref{old_ref.index}", ignore_errors=True)


def _unkeep(pool: "ReferencePool", ref: "Ref") -> None:
    with _kept_lock:
        _kept.pop((id(pool), ref.index), None)


def kept_references(mode: str) -> int:
    """How many idle reference workers this process keeps in `mode`."""
    with _kept_lock:
        return sum(1 for p, _ in _kept.values() if p.mode == mode)


_gpu_locks = {"cuda": threading.Lock(), "cpu": threading.Lock()}
_measure_locks = {"cuda": threading.Lock(), "cpu": threading.Lock()}


def gpu_lock(mode: str) -> threading.Lock:
    """This process's lock for using the GPU in `mode` (see `Evaluator`'s `overlap`)."""
    return _gpu_locks[mode]


def measure_lock(mode: str) -> threading.Lock:
    """This process's lock for measuring in `mode` (always taken after `gpu_lock`, never before)."""
    return _measure_locks[mode]


def _new_locks() -> None:
    global _gpu_locks, _measure_locks
    global _kept, _kept_lock
    _gpu_locks = {"cuda": threading.Lock(), "cpu": threading.Lock()}
    _measure_locks = {"cuda": threading.Lock(), "cpu": threading.Lock()}
    _kept, _kept_lock = OrderedDict(), threading.Lock()  # the parent's workers are the parent's


os.register_at_fork(after_in_child=_new_locks)


class Ref:
    """One reference worker and what the pool knows of it."""

    def __init__(self, worker: WorkerProcess, index: int):
        self.worker, self.index = worker, index
        self.uses = 0
        self.set_up = False  # its setup reply has been read
        self.setup_reply: dict[str, Any] = {}


class ReferencePool:
    """Warm reference workers of one evaluator (see the module docstring). `setup` is the setup
    message every new one gets; `start` how its processes start ("auto": forked from the warm
    server where one runs; "spawn": a fresh interpreter, as a cold evaluator does)."""

    def __init__(self, mode: str, setup: dict[str, Any], max_uses: int = REF_MAX_USES,
                 start: Literal["auto", "spawn"] = "auto"):
        self.mode, self.setup, self.max_uses, self.start = mode, setup, max_uses, start
        self.dir = Path(tempfile.mkdtemp(prefix="kb_ref_"))
        self.owner = os.getpid()
        self._idle: list[Ref] = []
        self._lock = threading.Lock()
        self._count = 0
        self.started = 0

    def acquire(self, fresh: bool = False) -> tuple[Ref, bool]:
        """An idle live worker (unless `fresh`), or a new one (its setup sent, not yet answered); and
        whether it is new."""
        with self._lock:
            self._own()
            while self._idle and not fresh:
                ref = self._idle.pop()
                _unkeep(self, ref)
                if ref.worker.alive() and ref.uses < self.max_uses:
                    return ref, False
                ref.worker.close()
            self._count += 1
            index = self._count
        worker = WorkerProcess("reference", self.mode, self.dir / f"ref{index}", start=self.start)
        self.started += 1
        ref = Ref(worker, index)
        worker.send(self.setup)
        return ref, True

    def release(self, ref: Ref, healthy: bool) -> None:
        """Back to the idle list after an evaluation that went through (its cases forgotten, the
        cache kept); else closed."""
        ref.uses += 1
        if healthy and ref.uses < self.max_uses and self.owner == os.getpid() and ref.worker.alive():
            try:
                healthy = bool(ref.worker.request({"op": "end"}, END_TIMEOUT_S).get("ok"))
            except (WorkerDied, WorkerTimeout, ProtocolViolation):
                healthy = False
            if healthy:
                with self._lock:
                    self._idle.append(ref)
                _keep(self, ref)
                return
        ref.worker.close()
        shutil.rmtree(self.dir / f"ref{ref.index}", ignore_errors=True)

    def _forget(self, ref: Ref) -> bool:
        """Drop `ref` from the idle list (evicted by the cap); False if it was taken meanwhile."""
        with self._lock:
            if ref in self._idle:
                self._idle.remove(ref)
                return True
            return False

    def _own(self) -> None:
        if self.owner != os.getpid():  # a forked copy: the workers are the parent's
            self._idle = []
            self.owner = os.getpid()
            self.dir = Path(tempfile.mkdtemp(prefix="kb_ref_"))

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for ref in idle:
            _unkeep(self, ref)
        if self.owner != os.getpid():
            return
        for ref in idle:
            ref.worker.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Spare:
    """A candidate worker started ahead of its candidate, and its evaluation's folder."""

    def __init__(self, worker: WorkerProcess, folder: Path, warm_reply: dict[str, Any] | None):
        self.worker, self.folder, self.warm_reply = worker, folder, warm_reply

    def discard(self) -> None:
        self.worker.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class CandidateSpares:
    """Starts candidate workers (see the module docstring); with `ahead`, keeps one spare ready."""

    def __init__(self, mode: str, max_file_bytes: int, max_memory_bytes: int, ahead: bool,
                 start: Literal["auto", "spawn"] = "auto"):
        self.mode, self.ahead, self.start = mode, ahead, start
        self.max_file_bytes, self.max_memory_bytes = max_file_bytes, max_memory_bytes
        self.owner = os.getpid()
        self._lock = threading.Lock()
        self._next: threading.Thread | None = None
        self._ready: Spare | None = None
        self.error: BaseException | None = None  # why the last spare could not start
        self._closed = False

    def new(self, warm: bool) -> Spare:
        """A candidate worker and its folder, started now (its device readied with `warm`)."""
        folder = Path(tempfile.mkdtemp(prefix="kb_eval_"))
        try:
            worker = WorkerProcess("candidate", self.mode, folder / "candidate", max_file_bytes=self.max_file_bytes,
                                   max_memory_bytes=self.max_memory_bytes, start=self.start)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        spare = Spare(worker, folder, None)
        if warm:
            try:
                with measure_lock(self.mode):  # its CUDA context is not made while another evaluation measures
                    spare.warm_reply = worker.request({"op": "warm", "mode": self.mode}, SPARE_TIMEOUT_S)
            except (WorkerDied, WorkerTimeout, ProtocolViolation):
                spare.warm_reply = None  # it failed before any candidate: the evaluation sees it dead
        return spare

    def take(self) -> tuple[Spare, bool]:
        """The spare made ahead (waiting for it if it is still starting) or a new worker; whether it
        was made ahead. With `ahead`, the next spare starts in the background."""
        with self._lock:
            if self.owner != os.getpid():  # a forked copy: the spare is the parent's
                self.owner, self._next, self._ready = os.getpid(), None, None
            thread = self._next
        if thread is not None:
            thread.join()
        with self._lock:
            spare, self._ready = self._ready, None
            if thread is not None and self._next is thread:
                self._next = None
        if spare is not None and not (spare.worker.alive() and spare.warm_reply and spare.warm_reply.get("ok")):
            spare.discard()
            spare = None
        ahead = spare is not None
        if spare is None:
            spare = self.new(warm=False)
        if self.ahead:
            self._refill()
        return spare, ahead

    def _refill(self) -> None:
        """Start the next spare in the background, unless one is ready or on its way."""
        def make() -> None:
            try:
                spare = self.new(warm=True)
            except BaseException as exc:  # noqa: BLE001 (the next take starts one itself)
                self.error = exc
                return
            with self._lock:
                if self._closed:
                    spare.discard()
                else:
                    self._ready = spare

        with self._lock:
            if self._closed or self._ready is not None or (self._next is not None and self._next.is_alive()):
                return
            self._next = threading.Thread(target=make, name="kb-spare", daemon=True)
            self._next.start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            thread, ready, self._ready = self._next, self._ready, None
        if self.owner != os.getpid():
            return
        if thread is not None:
            thread.join(timeout=SPARE_TIMEOUT_S)
            with self._lock:
                ready, self._ready = ready or self._ready, None
        if ready is not None:
            ready.discard()
