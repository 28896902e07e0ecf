"""The importer's probe process: ``python -m kb_env.kernelbench.probe READ_FD WRITE_FD 0 PARENT_PID``.

Importing a KernelBench file runs its code, so that happens here, one file per request, and
never in the importer itself: a file that raises, exits, hangs, segfaults or eats memory costs
this process (the importer starts another), not the import. For each file: import it as the
harness does (`kb_env.problem.import_source`), measure one forward call on fake tensors
(`trace`), and where the problem is small enough for this machine run the real checks
(`checks`). Replies are JSON on the private channel; what the file prints goes to a log."""

from __future__ import annotations

import resource
import sys
import traceback
from typing import Any

import torch
from pydantic import BaseModel

from ..sandbox.protocol import Channel, ChannelClosed
from ..sandbox.reaper import die_with_parent


class Budget(BaseModel):
    """How big a problem the importer runs for real, and which ones CPU mode takes.

    The checks run on the CPU for problems up to `check_cpu_bytes` of tensors (inputs, state,
    outputs) and `check_cpu_flops`; bigger ones on a GPU when there is one, up to
    `check_cuda_bytes` (and a tenth of the card's memory) and `check_cuda_flops`; others, and
    those whose checks run out of GPU memory, are registered unchecked. CPU mode (small
    enough to grade under Triton's interpreter in seconds) takes a problem checked on the CPU with
    at most `cpu_mode_bytes`, `cpu_mode_flops`, and a reference call of `cpu_mode_reference_ms`."""

    check_cpu_bytes: int = 256 << 20
    check_cpu_flops: float = 2e10
    check_cuda_bytes: int = 8 << 30
    check_cuda_flops: float = 1e14
    cpu_mode_bytes: int = 8 << 20
    cpu_mode_flops: float = 2.5e8
    cpu_mode_reference_ms: float = 250.0
    probe_memory_mb: int = 8192
    timeout_s: float = 300.0


def _where(exc: BaseException, filename: str) -> str:
    """' (line N)' of the problem file's deepest frame in the traceback, or ''."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    return f" (line {frames[-1].lineno})" if frames else ""


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def _check_device(bytes_: int, flops: float, budget: Budget, cuda: bool) -> tuple[str | None, str]:
    """Where the checks run, or None and why they do not."""
    if bytes_ <= budget.check_cpu_bytes and flops <= budget.check_cpu_flops:
        return "cpu", ""
    size = f"{bytes_ / 2**20:.0f} MiB of tensors and {flops:.3g} FLOPs"
    if not cuda:
        return None, (f"{size} is over the CPU check budget ({budget.check_cpu_bytes >> 20} MiB, "
                      f"{budget.check_cpu_flops:.3g} FLOPs) and there is no GPU here")
    if bytes_ <= budget.check_cuda_bytes and flops <= budget.check_cuda_flops:
        return "cuda", ""
    return None, (f"{size} is over the GPU check budget ({budget.check_cuda_bytes >> 30} GiB, "
                  f"{budget.check_cuda_flops:.3g} FLOPs)")


def probe(msg: dict[str, Any]) -> dict[str, Any]:
    """One file: {"ok": False, "reason": ...} or {"ok": True, "traced": ..., "checked": ..., ...}."""
    import torch

    from ..problem import import_source
    from .checks import Skip, run_checks
    from .trace import TraceError, trace

    filename, budget = msg["filename"], Budget.model_validate(msg["budget"])
    try:
        module = import_source(msg["source"], "kb_kernelbench_problem", filename)
    except BaseException as exc:  # noqa: BLE001 (SystemExit included: the file is what failed)
        return {"ok": False, "reason": f"importing it raised {_error(exc)}{_where(exc, filename)}"}
    model_cls = getattr(module, "Model", None)
    if not (isinstance(model_cls, type) and issubclass(model_cls, torch.nn.Module)):
        return {"ok": False, "reason": "Model is not a torch.nn.Module subclass"}
    for fn in ("get_inputs", "get_init_inputs"):
        if not callable(getattr(module, fn, None)):
            return {"ok": False, "reason": f"{fn} is not a function"}
    doc = (model_cls.__doc__ or "").strip().splitlines()
    try:
        traced, fake_failed = trace(module)
    except TraceError as exc:
        return {"ok": False, "reason": str(exc)}
    except BaseException as exc:  # noqa: BLE001
        hint = " (it needs CUDA, which this machine lacks: import it on a GPU machine)" \
            if "cuda" in str(exc).lower() and not torch.cuda.is_available() else ""
        return {"ok": False, "reason": f"calling it raised {_error(exc)}{_where(exc, filename)}{hint}"}
    reply: dict[str, Any] = {"ok": True, "doc": doc[0].strip() if doc else "", "traced": traced.model_dump(),
                             "fake_failed": fake_failed, "checked": None, "unchecked": None}
    cuda = msg.get("cuda", False) and torch.cuda.is_available()
    if cuda:  # the checks keep a few copies of the tensors, and a float64 oracle: a tenth of the card
        budget = budget.model_copy(update={"check_cuda_bytes": min(
            budget.check_cuda_bytes, torch.cuda.get_device_properties(0).total_memory // 10)})
    device, why = _check_device(traced.bytes, traced.flops, budget, cuda)
    if device is None:
        reply["unchecked"] = why
        return reply
    try:
        reply["checked"] = run_checks(module, device).model_dump(mode="json")
    except Skip as exc:
        return {"ok": False, "reason": str(exc)}
    except torch.OutOfMemoryError:  # the problem is fine; this machine is too small to check it
        reply["unchecked"] = f"the checks ran out of memory on {device}"
    except BaseException as exc:  # noqa: BLE001
        return {"ok": False, "reason": f"running it for the checks raised {_error(exc)}{_where(exc, filename)}"}
    return reply


def main(argv: list[str]) -> int:
    """argv: READ_FD WRITE_FD MAX_FILE_BYTES (unused) PARENT_PID."""
    die_with_parent(int(argv[4]) if len(argv) > 4 else 0)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    channel = Channel(int(argv[1]), int(argv[2]))
    while True:
        try:
            msg = channel.recv()
        except ChannelClosed:
            return 0
        if not isinstance(msg, dict) or msg.get("op") == "exit":
            channel.send({"ok": True})
            return 0
        dtype = torch.get_default_dtype()
        try:
            channel.send(probe(msg))
        finally:  # what one file sets globally is not the next file's default
            torch.set_default_dtype(dtype)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
