"""Harness side: a watchdog on a worker's host memory (Linux /proc).

``RLIMIT_AS`` cannot bound a CUDA process (the driver reserves huge virtual ranges it never
touches), so the resident set is polled instead: the summed VmRSS of the worker and every
process below it. Pages shared between those processes (a fork's copy-on-write pages) count
once per process, which errs on the side of the limit.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from .reaper import descendants, stat_of


def resident_bytes(pid: int) -> int:
    """VmRSS of one process in bytes (0 if it is gone, or a zombie with no memory left)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) << 10  # kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def tree_resident_bytes(pid: int) -> int:
    """Summed VmRSS of `pid` and all its descendants."""
    return sum(resident_bytes(p) for p in {pid} | descendants(pid))


class MemoryWatch:
    """A daemon thread that polls `tree_resident_bytes(pid)` and calls `on_exceed(rss)` once,
    then stops, when it goes over `limit_bytes`. When the process has exited it calls
    `on_exit()` (if given: e.g. to kill processes it left holding its pipes) and stops; it
    also stops when `is_done()` says so. It never raises.

    The poll interval is `interval_s`, stretched to ten times the last poll's own cost where
    /proc is slow to walk (many processes and no per-task children files), so the watch
    takes at most about a tenth of a core."""

    def __init__(self, pid: int, limit_bytes: int, on_exceed: Callable[[int], None],
                 on_exit: Callable[[], None] | None = None, is_done: Callable[[], bool] = lambda: False,
                 interval_s: float = 0.05):
        self.pid, self.limit_bytes = pid, limit_bytes
        self._on_exceed, self._on_exit, self._is_done, self._interval = on_exceed, on_exit, is_done, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"kb-memwatch-{pid}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop polling and wait (up to `timeout` s) for an on-going poll or kill to finish."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _loop(self) -> None:
        wait = self._interval
        while not self._stop.wait(wait):
            try:
                t0 = time.perf_counter()
                if self._is_done():
                    return
                st = stat_of(self.pid)
                if st is None or st.ended:
                    if self._on_exit is not None and not self._stop.is_set():
                        self._on_exit()
                    return
                rss = tree_resident_bytes(self.pid)
                if rss > self.limit_bytes and not self._stop.is_set():
                    self._on_exceed(rss)
                    return
                wait = max(self._interval, 10 * (time.perf_counter() - t0))
            except Exception:  # noqa: BLE001 (a watchdog must not die of a /proc race or a kill error)
                wait = self._interval
