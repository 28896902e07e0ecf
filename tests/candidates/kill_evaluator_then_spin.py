"""Kills the Ray actor evaluating it, then keeps its own process busy forever (on a GPU it
would hold the device under whoever is timed next)."""
import os
import signal
import time

import torch


def _ray_ancestor():
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return None
        if cmd.startswith(b"ray::"):
            return pid
        pid = int(stat[stat.rfind(b")") + 2:].split()[1])
    return None


_target = _ray_ancestor()
if _target is not None:
    os.kill(_target, signal.SIGKILL)
    while True:
        time.sleep(0.05)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)
