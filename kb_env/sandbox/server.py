"""The harness's handle on the warm worker server (`zygote`): start it, have it fork workers,
recycle it.

One server per mode per harness process (`server_for`), started on first use. It is recycled
(a new one started, the old one told to exit) after `max_forks` workers, and after a fault: it
died (a candidate may kill it: it runs as the same user), it did not answer in time, or it sent
something malformed. If a fresh server fails too, `fork` raises `ServerUnavailable` and the
caller spawns the worker the old way. No server is used where this process cannot be a child
subreaper (the forked workers must be reparented to it), nor in a process forked from the one
that started it (the server's socket belongs to that one)."""

from __future__ import annotations

import atexit
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from . import reaper

DEFAULT_MAX_FORKS = 256
TOKEN_PLACEHOLDER = "0" * 32  # in the server's environment; each worker writes its own token over it
READY_TIMEOUT_S = 300.0  # imports on a cold disk
FORK_TIMEOUT_S = 30.0


class ServerUnavailable(RuntimeError):
    """No warm server could fork the worker; spawn it instead."""


class WorkerServer:
    """One running `zygote` for `mode`, its environment `env` (the workers' base environment).

    Thread-safe: a lock serializes fork requests (each takes milliseconds)."""

    def __init__(self, mode: str, env: dict[str, str], max_forks: int = DEFAULT_MAX_FORKS):
        if not reaper.become_subreaper():
            raise ServerUnavailable("this process cannot be a child subreaper (forked workers would not be its children)")
        self.mode, self.max_forks = mode, max_forks
        self.forks = 0
        self.owner = os.getpid()
        self._lock = threading.Lock()
        self.dir = Path(tempfile.mkdtemp(prefix="kb_server_"))
        self.log_path = self.dir / "server.log"
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        # numpy's OpenBLAS starts a thread pool when it loads unless told one thread: the server
        # must stay single-threaded to fork safely (the workers' own environment is `env`)
        server_env = env | {"OPENBLAS_NUM_THREADS": "1"}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kb_env.sandbox.zygote", str(theirs.fileno()), mode, str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.dir, env=server_env, start_new_session=True)
        theirs.close()
        try:
            self.info = self._recv(READY_TIMEOUT_S)
        except ServerUnavailable:
            self.close()
            raise
        if not self.info.get("ok"):
            self.close()
            raise ServerUnavailable(f"the worker server failed to start: {self.info.get('message')}")
        if self.info.get("threads", 1) > 1:  # forking a process with other threads is not safe
            self.close()
            raise ServerUnavailable(f"the worker server runs {self.info['threads']} threads after its imports "
                                    f"({', '.join(self.info.get('thread_names', []))})")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None and self._sock.fileno() >= 0

    def _recv(self, timeout: float) -> dict[str, Any]:
        ready, _, _ = select.select([self._sock], [], [], timeout)
        if not ready:
            raise ServerUnavailable(f"the worker server did not answer within {timeout:.0f} s")
        try:
            data = self._sock.recv(1 << 16)
            reply = json.loads(data) if data else None
        except (OSError, ValueError) as exc:
            raise ServerUnavailable(f"the worker server's answer was unreadable: {exc}") from None
        if not isinstance(reply, dict):
            raise ServerUnavailable("the worker server closed its socket" if data == b"" else "malformed answer")
        return reply

    def fork(self, fds: tuple[int, int, int], cwd: Path, env: dict[str, str], max_file_bytes: int) -> int:
        """Fork a worker with these descriptors (its channel's read end, write end, its log) in `cwd`
        with `env`; its pid. ServerUnavailable if the server failed (it is then closed)."""
        msg = {"op": "fork", "cwd": str(cwd), "env": env, "max_file_bytes": max_file_bytes}
        with self._lock:
            try:
                socket.send_fds(self._sock, [json.dumps(msg).encode()], list(fds))
                reply = self._recv(FORK_TIMEOUT_S)
            except (OSError, ServerUnavailable) as exc:
                self.close()
                raise ServerUnavailable(f"the worker server failed: {exc}") from None
            self.forks += 1
        if not reply.get("ok") or not isinstance(reply.get("pid"), int):
            raise ServerUnavailable(f"the worker server could not fork: {reply.get('message')}")
        return reply["pid"]

    def close(self) -> None:
        """Tell it to exit (closing the socket does), then make sure; safe to call again."""
        try:
            self._sock.close()
        except OSError:
            pass
        if self.owner == os.getpid():
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        try:
            for p in self.dir.iterdir():
                p.unlink()
            self.dir.rmdir()
        except OSError:
            pass


# ----- one server per mode (and worker environment) per process ---------------------------------
_servers: dict[str, WorkerServer] = {}
_registry_lock = threading.Lock()
_disabled = os.environ.get("KB_NO_WARM_SERVER") == "1"
last_error: str | None = None  # why the last server could not start or fork (for reports)


def _forget_in_child() -> None:
    """A process forked from this one (a vector environment's worker) starts without servers: the
    parent's sockets are the parent's."""
    global _registry_lock
    _servers.clear()
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def server_for(mode: str, env: dict[str, str], max_forks: int = DEFAULT_MAX_FORKS) -> WorkerServer:
    """The running server for `mode` and this base environment, started (or recycled: past its
    `max_forks`, or dead) as needed. ServerUnavailable if none can run here."""
    if _disabled:
        raise ServerUnavailable("KB_NO_WARM_SERVER=1")
    key = json.dumps([mode, sorted(env.items())])
    with _registry_lock:
        server = _servers.get(key)
        if server is not None and (not server.alive() or server.forks >= server.max_forks):
            server.close()
            server = None
        if server is None:
            global last_error
            try:
                server = _servers[key] = WorkerServer(mode, env, max_forks)
            except ServerUnavailable as exc:
                last_error = str(exc)
                raise
        return server


def drop(server: WorkerServer, why: str = "") -> None:
    """Close a server that failed and forget it (the next `server_for` starts a fresh one)."""
    global last_error
    last_error = why or last_error
    with _registry_lock:
        for key, s in list(_servers.items()):
            if s is server:
                del _servers[key]
    server.close()


def running() -> list[WorkerServer]:
    """This process's servers (for reports and tests)."""
    with _registry_lock:
        return list(_servers.values())


def shutdown() -> None:
    """Close every server of this process."""
    with _registry_lock:
        servers = list(_servers.values())
        _servers.clear()
    for s in servers:
        s.close()


atexit.register(shutdown)  # each server exits when its socket closes; this waits for them
