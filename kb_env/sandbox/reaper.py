"""Processes a candidate started: find them, kill them, reap them (Linux /proc).

Used on both sides. The harness (`runner`) kills a worker's whole descendant tree when the
worker ends, then every orphan marked with that worker's token that was reparented to the
harness (a child subreaper); the candidate's worker kills and reports its own live children
after each request (`kill_children`).

How a candidate's process can escape, and what catches it:

- a plain child (``subprocess.Popen``): the worker's check after each request, the tree walk
  and the process-group kill at worker end;
- a daemon that double-forks and calls ``os.setsid()``: its intermediate parent exits, so it
  is reparented to the nearest child subreaper. The worker is one (`become_subreaper` in its
  ``main``), so while the worker lives the daemon stays in its tree; once the worker has died
  it goes to the harness, also a subreaper, where the worker's token in its environment
  (``/proc/<pid>/environ``) or the worker's process group marks it as the candidate's.

Limit: a process that has left the worker's session and dropped the token (it exec'ed with a
cleared environment, or overwrote its environment block) is caught only while it is below the
worker; once the worker has died it is indistinguishable from any other orphan of the harness
and is left alone. On a system where the harness cannot be a subreaper (not Linux, or prctl
refused) an escaped process goes to init and only the process group reaches it. Processes
that are neither below a worker nor marked as one's are never touched.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterable
from typing import NamedTuple

TOKEN_VAR = "KB_SANDBOX_TOKEN"
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_subreaper: bool | None = None


def _forget_in_child() -> None:
    """The subreaper attribute is not inherited across fork: a forked copy of this process asks again."""
    global _subreaper
    _subreaper = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux only, once per process): orphaned descendants
    are reparented to it instead of init. False where it is not possible; never raises.

    The cost: an orphan of anything else this process started (a command that daemonizes) is
    reparented here too, and left alone, so it stays a zombie here once it exits."""
    global _subreaper
    if _subreaper is None:
        _subreaper = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                _subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
            except (OSError, AttributeError):
                pass
    return _subreaper


def die_with_parent(parent_pid: int) -> bool:
    """Have the kernel SIGKILL this process when its parent (the harness thread that started
    it) dies, and exit now if that already happened. A worker whose harness was killed (a Ray
    actor the candidate shot, say) then cannot keep a GPU busy under the next evaluation.
    False where it is not possible (not Linux); a candidate that clears it is still below a
    subreaper and marked with its token (see the module docstring)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        ok = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    if parent_pid and os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(70)
    return ok


# ----- reading /proc ---------------------------------------------------------------------
def _children_files_work() -> bool:
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


_HAS_CHILDREN_FILES = _children_files_work()  # CONFIG_PROC_CHILDREN; else /proc is scanned


class ProcStat(NamedTuple):
    ppid: int
    state: str  # "R", "S", "D", "T", "Z" (ended, not reaped), "X" (dead) ...
    pgid: int

    @property
    def ended(self) -> bool:
        return self.state in ("Z", "X")


def stat_of(pid: int) -> ProcStat | None:
    """Parent, state and process group of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()  # the command name may hold spaces and parens
    try:
        return ProcStat(int(fields[1]), fields[0].decode(), int(fields[2]))
    except (IndexError, ValueError):
        return None


def _all_parents() -> dict[int, int]:
    """{pid: parent pid} of every process this user can see."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := stat_of(int(name))) is not None:
            out[int(name)] = st.ppid
    return out


def children(pid: int) -> set[int]:
    """The direct children of `pid` (created by any of its threads, or reparented to it)."""
    if _HAS_CHILDREN_FILES:
        out: set[int] = set()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return out
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out.update(int(c) for c in f.read().split())
            except OSError:
                pass
        return out
    return {p for p, parent in _all_parents().items() if parent == pid}


def descendants(pid: int) -> set[int]:
    """Every process below `pid` in the process tree (not `pid` itself)."""
    if _HAS_CHILDREN_FILES:
        out: set[int] = set()
        todo = [pid]
        while todo:
            for c in children(todo.pop()) - out:
                out.add(c)
                todo.append(c)
        return out
    by_parent: dict[int, list[int]] = {}
    for p, parent in _all_parents().items():
        by_parent.setdefault(parent, []).append(p)
    out, todo = set(), [pid]
    while todo:
        for c in by_parent.get(todo.pop(), ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def has_token(pid: int, token: str) -> bool:
    """Whether the environment `pid` started with (as it stands in its memory) holds the token."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{TOKEN_VAR}={token}".encode() in f.read().split(b"\0")
    except OSError:
        return False


# ----- killing -----------------------------------------------------------------------------
def _signal(pids: Iterable[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(pid: int) -> set[int]:
    """SIGKILL `pid` and all its descendants; returns their pids, `pid` included. The tree is
    frozen with SIGSTOP first, pass by pass until no new process appears, so a process that
    forks while it is being killed leaves no child behind."""
    stopped: set[int] = set()
    new = {pid}
    for _ in range(20):
        _signal(new, signal.SIGSTOP)
        stopped |= new
        if not (new := descendants(pid) - stopped):
            break
    _signal(stopped, signal.SIGKILL)
    return stopped


def signal_tree(pid: int, sig: int, also: Iterable[int] = ()) -> set[int]:
    """Send `sig` to `pid`, every process below it (pass by pass, until no new one appears) and
    `also`; returns the pids signalled. With SIGSTOP: the whole tree frozen."""
    done: set[int] = set()
    new = {pid} | set(also)
    for _ in range(20):
        _signal(new, sig)
        done |= new
        if not (new := descendants(pid) - done):
            break
    return done


def wait_stopped(pids: Iterable[int], timeout: float = 1.0) -> bool:
    """Wait (up to `timeout` s) until every process in `pids` is stopped or gone; whether they are."""
    deadline = time.monotonic() + timeout
    pending = set(pids)
    while pending:
        pending = {p for p in pending if (st := stat_of(p)) is not None and not st.ended and st.state not in ("T", "t")}
        if not pending:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def kill_marked(token: str, pgid: int, exclude: Iterable[int] = ()) -> set[int]:
    """SIGKILL, with their trees, the live children of this process that belong to a worker:
    orphans reparented here (this process being a subreaper) whose environment carries the
    worker's `token` or that are in its process group `pgid`. Returns the pids killed.
    `exclude`: children to leave alone (the worker itself: its `subprocess.Popen` reaps it)."""
    killed: set[int] = set()
    for c in children(os.getpid()) - set(exclude):
        st = stat_of(c)
        if st is not None and not st.ended and (st.pgid == pgid or has_token(c, token)):
            killed |= kill_tree(c)
    return killed


def reap(pids: Iterable[int], timeout: float = 2.0, skip: Iterable[int] = ()) -> None:
    """Wait (up to `timeout` s) until each killed process in `pids` is gone, reaping those that
    are (or become, as their killed parents die) children of this process; `skip`: killed pids
    someone else reaps (a `subprocess.Popen`'s). Never waits on a pid outside `pids`."""
    dying = set(pids) | set(skip)
    pending, me = dying - set(skip), os.getpid()
    deadline = time.monotonic() + timeout
    while pending:
        for p in list(pending):
            st = stat_of(p)
            if st is None or (st.ended and st.ppid != me and st.ppid not in dying):
                pending.discard(p)  # gone, or ended and a living parent's to reap
            elif st.ppid == me:
                try:
                    if os.waitpid(p, os.WNOHANG)[0] == p:
                        pending.discard(p)
                except ChildProcessError:
                    pending.discard(p)
        if not pending or time.monotonic() > deadline:
            return
        time.sleep(0.005)


# ----- inside the candidate's worker ---------------------------------------------------
def kill_children() -> bool:
    """Kill (with their trees) and reap this process's live children; True if there were any.
    Finished children left unreaped (zombies) are reaped first and do not count, so a compiler
    that ran and exited is not a leftover."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
    live = {c for c in children(os.getpid()) if (st := stat_of(c)) is not None and not st.ended}
    reap(set().union(*(kill_tree(c) for c in live)))
    return bool(live)
