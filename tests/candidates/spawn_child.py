"""Header: starts a child process (`sleep 600123`) at import; `_spawn()` starts another."""
import subprocess


def _spawn():
    subprocess.Popen(["sleep", "600123"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


_spawn()
