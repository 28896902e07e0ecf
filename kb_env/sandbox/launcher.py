"""Spawning workers from one long-lived thread.

A worker asks the kernel to SIGKILL it when the harness goes (`reaper.die_with_parent`,
PR_SET_PDEATHSIG). Linux ties that signal to the *thread* that created the child, not to its
process: a worker spawned by a short-lived thread (the spare a background thread readies for the
next evaluation, an evaluation run on a thread pool, a kept reference worker started by one) is
killed the moment that thread ends, mid-evaluation. On an H200 that reported a hung candidate as
a crash ("killed by SIGKILL"). Every spawn therefore runs on this module's launcher thread, which
lives as long as the process: the signal still comes when the harness dies, and only then.

(Workers forked by the warm server are reparented to the harness process and tied to a live thread
of it by the kernel; they do not need this.)"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from concurrent.futures import Future
from typing import Any

_lock = threading.Lock()
_jobs: queue.SimpleQueue | None = None
_owner = 0  # the pid whose launcher thread `_jobs` feeds (a forked copy starts its own)


def _serve(jobs: queue.SimpleQueue) -> None:
    while True:
        fut, args, kwargs = jobs.get()
        if fut.set_running_or_notify_cancel():
            try:
                fut.set_result(subprocess.Popen(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 (the caller re-raises it on its own thread)
                fut.set_exception(exc)


def _queue() -> queue.SimpleQueue:
    global _jobs, _owner
    with _lock:
        if _jobs is None or _owner != os.getpid():
            _jobs, _owner = queue.SimpleQueue(), os.getpid()
            threading.Thread(target=_serve, args=(_jobs,), name="kb-launcher", daemon=True).start()
        return _jobs


def popen(*args: Any, **kwargs: Any) -> subprocess.Popen:
    """`subprocess.Popen(*args, **kwargs)`, created on the launcher thread (exceptions re-raised here)."""
    if threading.current_thread().name == "kb-launcher":
        return subprocess.Popen(*args, **kwargs)
    fut: Future = Future()
    _queue().put((fut, args, kwargs))
    return fut.result()

