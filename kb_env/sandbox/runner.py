"""The harness's handle on one worker process: spawn it with a private channel, send it
requests with a deadline, and kill it (and anything it started) when done or overdue.

The worker's stdout and stderr go to a log file that is shown to the agent as the candidate's
output; results only ever arrive over the channel.

A worker is forked from the warm worker server (`server`, `zygote`) where one runs here (it is
then this process's child, as a spawned one is), else spawned (``python -m kb_env.sandbox.worker``):
`start="spawn"` forces the latter. Either way it gets the same environment, working directory,
session, limits and channel.

Resources: an optional watchdog (`memwatch`) kills the worker when it and its children hold
more resident memory than allowed. When a worker ends, every process it started is killed and
reaped (`reaper`): its descendant tree, its process group, and the orphans marked with its
token that were reparented to this process (a child subreaper). `freeze` stops a worker and
everything it started (SIGSTOP) and `thaw` lets them go on."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

import kb_env

from . import launcher, reaper
from . import server as warm
from .memwatch import MemoryWatch
from .protocol import Channel, ChannelClosed, ChannelTimeout, ProtocolError, widen_pipe

_PASS_ENV_PREFIXES = ("CUDA_", "NVIDIA_", "TRITON_", "TORCH_", "LC_", "OMP_", "MKL_", "OPENBLAS_", "RAY_")
_PASS_ENV = {"PATH", "HOME", "LANG", "USER", "LOGNAME", "TMPDIR", "PYTHONPATH", "LD_LIBRARY_PATH",
             "VIRTUAL_ENV", "CONDA_PREFIX", "CC", "CXX", "CUDA_HOME", "PYTHONUNBUFFERED"}


class WorkerDied(RuntimeError):
    """The worker exited (crash, signal, os._exit) before answering."""

    def __init__(self, how: str):
        super().__init__(how)
        self.how = how


class ProtocolViolation(RuntimeError):
    """The worker sent something the protocol does not allow (the candidate wrote to the
    harness's channel, or sent malformed results); it has been killed."""


class WorkerTimeout(TimeoutError):
    """The worker did not answer before the deadline; it has been killed."""


def base_env(mode: str) -> dict[str, str]:
    """What every worker's environment holds whatever its working directory: an allow-list (no API
    keys or other secrets), the package importable, and in CPU mode Triton's interpreter on and no
    GPU visible."""
    env = {k: v for k, v in os.environ.items() if k in _PASS_ENV or k.startswith(_PASS_ENV_PREFIXES)}
    package_parent = str(Path(kb_env.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if mode == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


def worker_env(mode: str, workdir: Path) -> dict[str, str]:
    """`base_env` with every compiler cache a worker writes inside its own `workdir` (Triton's, torch
    extensions', Inductor's, the CUDA driver's JIT cache) and its temporary files there too: caches
    are never shared between workers, so no candidate can plant a compiled kernel for another."""
    env = base_env(mode)
    env["TRITON_CACHE_DIR"] = str(workdir / "triton_cache")
    env["TORCH_EXTENSIONS_DIR"] = str(workdir / "torch_extensions")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(workdir / "inductor_cache")
    env["CUDA_CACHE_PATH"] = str(workdir / "cuda_cache")
    env["TMPDIR"] = str(workdir / "tmp")
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    return env


class ForkedProcess:
    """A worker forked by the warm server and reparented to this process: the part of
    `subprocess.Popen`'s interface the runner uses (pid, returncode, poll, wait)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: as Popen does, call it 0
                self.returncode = 0
                return 0
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.001
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        return self.returncode


class WorkerProcess:
    """A `kb_env.sandbox.worker` (or another worker `module` with the same command line: READ_FD
    WRITE_FD MAX_FILE_BYTES PARENT_PID) with a pipe pair only it and the harness hold, forked from
    the warm server or spawned (`start`: "auto" tries the server first, for the default module
    only; `started_by` says which).

    `max_file_bytes` bounds each file it writes; `max_memory_bytes` the resident memory of it
    and its children together (a watchdog kills it past that, and `WorkerDied` says so). Its
    environment carries a random token (`reaper.TOKEN_VAR`) that marks the processes it starts."""

    def __init__(self, role: str, mode: str, workdir: Path, max_file_bytes: int | None = None,
                 max_memory_bytes: int | None = None, start: Literal["auto", "spawn"] = "auto",
                 module: str = "kb_env.sandbox.worker"):
        self.role = role
        self.mode = mode
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{role}.log"
        reaper.become_subreaper()  # orphans of what the worker starts come back here, to be killed
        self.token = secrets.token_hex(16)
        env = worker_env(mode, workdir) | {reaper.TOKEN_VAR: self.token}
        if role == "candidate":  # Inductor's persistent compile pool would be a leftover process
            env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        for fd in (to_child_w, from_child_w):
            widen_pipe(fd)
        self.proc: subprocess.Popen | ForkedProcess | None = None
        self.started_by = "spawn"
        with open(self.log_path, "wb") as log:
            if start == "auto" and module == "kb_env.sandbox.worker":  # the server forks only this worker
                self.proc = self._fork(mode, (to_child_r, from_child_w, log.fileno()), workdir, env, max_file_bytes)
            if self.proc is None:
                self.proc = launcher.popen(  # on the long-lived launcher thread (see `launcher`)
                    [sys.executable, "-m", module, str(to_child_r), str(from_child_w),
                     str(max_file_bytes or 0), str(os.getpid())],
                    pass_fds=(to_child_r, from_child_w),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    cwd=workdir, env=env, start_new_session=True,
                )
        os.close(to_child_r)
        os.close(from_child_w)
        self.channel = Channel(from_child_r, to_child_w)
        self.started = time.monotonic()
        self._killed: set[int] = set()  # killed, still to reap (all but the worker: Popen reaps it)
        self._died_of: str | None = None  # why the harness killed it, where that was not a timeout
        self._watch = (MemoryWatch(self.proc.pid, max_memory_bytes, self._over_memory, self._kill_all,
                                   is_done=lambda: self.proc.returncode is not None)
                       if max_memory_bytes else None)

    def _fork(self, mode: str, fds: tuple[int, int, int], workdir: Path, env: dict[str, str],
              max_file_bytes: int | None) -> ForkedProcess | None:
        """The worker forked by this mode's warm server, or None (no server here, or it failed
        twice: a fresh one is tried once)."""
        for _ in range(2):
            try:
                server = warm.server_for(mode, base_env(mode) | {reaper.TOKEN_VAR: warm.TOKEN_PLACEHOLDER})
            except warm.ServerUnavailable:
                return None
            try:
                pid = server.fork(fds, workdir, env, max_file_bytes or 0)
            except warm.ServerUnavailable as exc:
                warm.drop(server, str(exc))
                continue
            st = reaper.stat_of(pid)
            if st is None or st.ppid != os.getpid():  # not (or no longer) ours: kill what is there
                if st is not None and not st.ended:
                    reaper.reap(reaper.kill_tree(pid))
                warm.drop(server, f"forked worker {pid} is not this process's child")
                continue
            self.started_by = "server"
            return ForkedProcess(pid)
        return None

    # ----- requests ------------------------------------------------------------------
    def send(self, message: dict[str, Any]) -> None:
        try:
            self.channel.send(message)
        except ChannelClosed:
            raise WorkerDied(self._how_it_died()) from None

    def recv(self, timeout: float) -> dict[str, Any]:
        try:
            reply = self.channel.recv(timeout=max(timeout, 0.0))
        except ChannelTimeout:
            self.kill()
            raise WorkerTimeout(f"no answer within {timeout:.0f} s") from None
        except ChannelClosed:
            raise WorkerDied(self._how_it_died()) from None
        except ProtocolError as exc:
            if self._died_of:  # killed in the middle of a message
                raise WorkerDied(self._how_it_died()) from None
            self.kill()
            raise ProtocolViolation(f"malformed message: {exc}") from None
        if not isinstance(reply, dict):
            self.kill()
            raise ProtocolViolation(f"sent a {type(reply).__name__} instead of a reply")
        return reply

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.send(message)
        return self.recv(timeout)

    # ----- ending --------------------------------------------------------------------
    def _over_memory(self, rss: int) -> None:
        """The memory watchdog's verdict (on its thread): record why, then kill."""
        self._died_of = (f"exceeded its memory limit ({self._watch.limit_bytes >> 20} MiB resident, "
                         f"its child processes included; {rss >> 20} MiB seen)")
        self._kill_all()

    def _kill_all(self) -> None:
        """SIGKILL the worker and what it started: its descendant tree (walked only while the
        worker is unreaped, so its pid is nobody else's), the orphans reparented to this process
        that carry its token or sit in its process group, then that group. What is killed here
        is reaped by `kill`. Also the watchdog's answer to a worker that exited on its own: a
        process it forked may hold the channel open, which would hold up the EOF till the deadline."""
        if self.proc.returncode is None:
            self._killed |= reaper.kill_tree(self.proc.pid)
        self._killed |= reaper.kill_marked(self.token, self.proc.pid, exclude={self.proc.pid})
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _how_it_died(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            return "closed its channel and stopped answering"
        self.kill()  # anything it started
        if self._died_of:
            return self._died_of
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"killed by {name}"
        return f"exited with status {code} before answering"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def freeze(self) -> None:
        """Stop the worker and every process below it (SIGSTOP): it runs nothing until `thaw`."""
        if self.proc.poll() is None:
            self._frozen = reaper.signal_tree(self.proc.pid, signal.SIGSTOP)
            reaper.wait_stopped(self._frozen)

    def thaw(self) -> None:
        """Let a frozen worker and its processes go on (SIGCONT)."""
        frozen, self._frozen = getattr(self, "_frozen", set()), set()
        if frozen and self.proc.poll() is None:
            reaper.signal_tree(self.proc.pid, signal.SIGCONT, also=frozen)

    def kill(self) -> None:
        """Kill the worker and everything it started: its descendant tree, its process group (it
        runs in its own session), and the orphans carrying its token that were reparented to
        this process; reap them all. Safe to call more than once."""
        if self._watch is not None:
            self._watch.stop()
        self._kill_all()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        reaper.reap(self._killed, skip={self.proc.pid})
        self._killed.clear()
        self.channel.close()

    def close(self) -> None:
        """Ask politely, then kill."""
        if self.proc.poll() is None:
            try:
                self.channel.send({"op": "exit"})
                self.proc.wait(timeout=5)
            except (ChannelClosed, OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def output_tail(self, max_chars: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()[-max_chars:]
        except OSError:
            return ""
        return data.decode("utf-8", errors="replace")
