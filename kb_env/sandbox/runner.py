"""The harness's handle on one worker process: spawn it with a private channel, send it
requests with a deadline, and kill it (and anything it started) when done or overdue.

The worker's stdout and stderr go to a log file that is shown to the agent as the candidate's
output; results only ever arrive over the channel."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kb_env

from .protocol import Channel, ChannelClosed, ChannelTimeout, ProtocolError

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


def worker_env(mode: str, workdir: Path) -> dict[str, str]:
    """The environment a worker starts with: an allow-list (no API keys or other secrets),
    the package importable, and in CPU mode Triton's interpreter on and no GPU visible."""
    env = {k: v for k, v in os.environ.items() if k in _PASS_ENV or k.startswith(_PASS_ENV_PREFIXES)}
    package_parent = str(Path(kb_env.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["TRITON_CACHE_DIR"] = str(workdir / "triton_cache")
    env["TORCH_EXTENSIONS_DIR"] = str(workdir / "torch_extensions")
    if mode == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


class WorkerProcess:
    """A spawned `kb_env.sandbox.worker` with a pipe pair only it and the harness hold."""

    def __init__(self, role: str, mode: str, workdir: Path, max_file_bytes: int | None = None):
        self.role = role
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{role}.log"
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kb_env.sandbox.worker", str(to_child_r), str(from_child_w),
                 str(max_file_bytes or 0)],
                pass_fds=(to_child_r, from_child_w),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=workdir, env=worker_env(mode, workdir), start_new_session=True,
            )
        os.close(to_child_r)
        os.close(from_child_w)
        self.channel = Channel(from_child_r, to_child_w)
        self.started = time.monotonic()

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
    def _how_it_died(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            return "closed its channel and stopped answering"
        self.kill()  # anything it started
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"killed by {name}"
        return f"exited with status {code} before answering"

    def kill(self) -> None:
        """Kill the worker's whole process group (it runs in its own session)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
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
