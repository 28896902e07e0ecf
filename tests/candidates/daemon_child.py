"""Header: a daemon (`sleep 600123`) that double-forks and leaves the worker's session at
import, so its parent is gone and neither the process tree nor the group reaches it;
`_daemonize()` starts another."""
import os


def _daemonize():
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", "600123"])
        os._exit(0)
    os.waitpid(pid, 0)


_daemonize()
