"""The warm worker server: ``python -m kb_env.sandbox.zygote CONTROL_FD MODE HARNESS_PID``.

It imports what a worker needs (torch, triton, the worker modules) once and then forks workers
on request, so a worker starts in milliseconds instead of seconds. It never touches CUDA (a CUDA
context does not survive a fork): each worker initializes its own device after the fork. It runs
no candidate code and holds nothing secret: no seeds, no reference outputs, no problem code.

Requests arrive on a Unix seqpacket socket that only the harness holds: a JSON header and three
file descriptors (the worker's end of its two channel pipes and its log file). For each, the
server double-forks: the intermediate process exits at once, so the worker is reparented to the
harness (a child subreaper, see `reaper`) and is the harness's child like a spawned worker: the
harness waits for it, kills its tree and catches the orphans it leaves. The server answers with
the worker's pid. The server exits when the harness closes the socket (the harness died, or
recycled this server).

In the worker, before any of its own code runs: a new session, stdin from /dev/null and stdout and
stderr to the log, every other inherited descriptor closed (the control socket above all), the
working directory and environment a spawned worker would have (its token written into the
process's original environment block too, so that the processes it forks without exec carry it
in /proc/<pid>/environ), numpy's global generator reseeded, tempfile's cached folder forgotten,
and the worker loop as in `worker`."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from typing import Any

MAX_MESSAGE = 1 << 16
_REPARENT_WAIT_S = 10.0


def preload(mode: str) -> dict[str, Any]:
    """Import what workers use, never initializing CUDA; what was loaded and how long it took."""
    t0 = time.monotonic()
    import torch
    import torch.nn.functional  # noqa: F401
    # not torch.utils.cpp_extension: finding nvcc at import, it asks torch.cuda.is_available(), which
    # initializes the CUDA driver (on an H200 that left a driver thread here and no worker could be
    # forked); a CUDA worker imports it once its own device is up (`worker.init_device`)

    from ..evaluate import correctness, decode_check  # noqa: F401  (the reference worker's checker)
    from ..problem import ProblemSpec  # noqa: F401
    from . import worker  # noqa: F401  (and through it every harness module a worker binds)
    from .oprecord import OpRecorder

    with OpRecorder():  # a dispatch mode's first use imports ~800 modules (sympy, torch._subclasses): on
        torch.ones(2).add_(1)  # an H200 3 s of each candidate's first call, paid here once (CPU only)

    try:
        import triton
        import triton.language  # noqa: F401

        if mode == "cpu":
            import triton.runtime.interpreter  # noqa: F401
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    if torch.cuda.is_initialized():  # would break every forked worker's CUDA
        raise RuntimeError("importing the worker modules initialized CUDA; the server cannot fork workers")
    tasks = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else [str(os.getpid())]
    names = []
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return {"import_s": time.monotonic() - t0, "torch": torch.__version__, "triton": triton_version,
            "threads": len(tasks), "thread_names": names}


def _send(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.send(json.dumps(obj).encode())


def _other_fds(keep: set[int]) -> list[int]:
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    return [fd for fd in fds if fd not in keep]


def _stamp_token(token: str) -> None:
    """Write `token` over the placeholder of the same length in this process's original environment
    block (the server's, see `server.TOKEN_PLACEHOLDER`): what /proc/<pid>/environ shows, and what a
    child forked without exec inherits."""
    import ctypes

    from .reaper import TOKEN_VAR

    prefix = f"{TOKEN_VAR}=".encode()
    new = token.encode()
    try:
        environ = ctypes.POINTER(ctypes.c_void_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError):
        return
    i = 0
    while environ[i]:
        entry = ctypes.string_at(environ[i])
        if entry.startswith(prefix) and len(entry) - len(prefix) == len(new):
            ctypes.memmove(environ[i] + len(prefix), new, len(new))
            return
        i += 1


def _become_worker(msg: dict[str, Any], fds: list[int], harness_pid: int) -> int:
    """In the forked worker: its process state as a spawned worker's, then the worker loop."""
    to_child_r, from_child_w, log_fd = fds
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    for fd in _other_fds({0, 1, 2, to_child_r, from_child_w}):
        try:
            os.close(fd)
        except OSError:
            pass
    old_cwd = os.getcwd()
    os.chdir(msg["cwd"])
    sys.path[:] = [msg["cwd"] if p in (old_cwd, "") else p for p in sys.path]
    env = {str(k): str(v) for k, v in msg["env"].items()}
    from .reaper import TOKEN_VAR

    if TOKEN_VAR in env:
        _stamp_token(env[TOKEN_VAR])
    os.environ.clear()
    os.environ.update(env)
    if "numpy" in sys.modules:  # a forked process inherits the server's generator state
        sys.modules["numpy"].random.seed()
    import tempfile  # the server's imports may have asked for the temporary folder: that answer was
    tempfile.tempdir = None  # the server's, shared by every fork; this worker's comes from its TMPDIR
    deadline = time.monotonic() + _REPARENT_WAIT_S
    while os.getppid() != harness_pid:  # the intermediate process is exiting
        if time.monotonic() > deadline:
            return 70
        time.sleep(0.0005)
    from . import worker

    max_file = int(msg.get("max_file_bytes") or 0)
    # what a spawned worker's argv holds (its /proc/<pid>/cmdline stays the server's)
    sys.argv = [worker.__file__, str(to_child_r), str(from_child_w), str(max_file), str(harness_pid)]
    return worker.serve(to_child_r, from_child_w, max_file, harness_pid, forked=True)


def _fork_worker(msg: dict[str, Any], fds: list[int], harness_pid: int) -> int:
    """Double-fork a worker; its pid (reparented to the harness once this returns)."""
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:  # the intermediate: fork the worker, say its pid, exit
        code = 0
        try:
            os.close(r)
            pid = os.fork()
            if pid == 0:
                os.close(w)
                try:
                    code = _become_worker(msg, fds, harness_pid)
                except BaseException:  # noqa: BLE001 (the worker must never return into the server loop)
                    traceback.print_exc()
                    code = 70
                finally:
                    for stream in (sys.stdout, sys.stderr):
                        try:
                            stream.flush()
                        except Exception:  # noqa: BLE001
                            pass
                    os._exit(code)
            os.write(w, str(pid).encode())
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 64):
        data += chunk
    os.close(r)
    os.waitpid(middle, 0)  # once it is reaped the worker has been reparented
    return int(data) if data.strip().isdigit() else 0


def serve(sock: socket.socket, harness_pid: int) -> int:
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 8)
        except (ConnectionError, OSError):
            return 0
        if not data:  # the harness closed the socket
            for fd in fds:
                os.close(fd)
            return 0
        try:
            msg = json.loads(data)
            if msg.get("op") == "exit":
                _send(sock, {"ok": True})
                return 0
            if msg.get("op") != "fork" or len(fds) != 3:
                raise ValueError(f"bad request {msg.get('op')!r} with {len(fds)} descriptors")
            pid = _fork_worker(msg, fds, harness_pid)
            reply = {"ok": pid > 0, "pid": pid} if pid > 0 else {"ok": False, "message": "the fork failed"}
        except Exception as exc:  # noqa: BLE001 (a bad request is answered, not fatal)
            reply = {"ok": False, "message": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
        try:
            _send(sock, reply)
        except OSError:
            return 0


def main(argv: list[str]) -> int:
    """argv: CONTROL_FD MODE HARNESS_PID."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sock = socket.socket(fileno=int(argv[1]))
    try:
        info = preload(argv[2])
    except BaseException as exc:  # noqa: BLE001
        _send(sock, {"ok": False, "message": f"{type(exc).__name__}: {exc}"})
        return 1
    _send(sock, {"ok": True, "pid": os.getpid(), **info})
    return serve(sock, int(argv[3]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
