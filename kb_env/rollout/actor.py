"""The Ray actor that owns one GPU (or, in CPU mode, one CPU slot) and evaluates candidates on it.

It is a plain class here; `EvaluatorPool` wraps it with `ray.remote(num_gpus=1,
max_concurrency=1)`, so Ray assigns it a GPU, sets `CUDA_VISIBLE_DEVICES` to that GPU (the
candidate and reference worker processes it starts inherit it) and runs one evaluation at a
time: two timings never share a GPU. Evaluators are kept per problem, so the trusted files
are hashed once per actor, not once per call."""

from __future__ import annotations

import os
import socket
from pydantic import BaseModel

from ..evaluate.evaluator import Evaluator
from ..evaluate.result import EvalResult
from ..problem import get_problem


class ActorInfo(BaseModel):
    """Where an evaluator actor runs: which slot of the pool, host, process and GPU."""

    slot: int
    mode: str
    host: str
    pid: int
    gpu_ids: list[str] = []
    cuda_visible_devices: str | None = None
    gpu_name: str | None = None
    gpu_uuid: str | None = None

    @property
    def where(self) -> str:
        return f"GPU {','.join(self.gpu_ids)}" if self.gpu_ids else "CPU"

    def label(self) -> str:
        return f"slot {self.slot} ({self.where} on {self.host}, pid {self.pid})"


def _gpu_identity() -> tuple[str | None, str | None]:
    """Name and UUID of the one GPU this process sees (no CUDA context is made)."""
    import torch

    if not torch.cuda.is_available():
        return None, None
    props = torch.cuda.get_device_properties(0)
    uuid = getattr(props, "uuid", None)
    return props.name, (str(uuid) if uuid is not None else None)


class EvaluatorActor:
    """Evaluates candidates for any problem in one mode; see the module docstring."""

    def __init__(self, slot: int, mode: str):
        if mode == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError(f"slot {slot}: mode 'cuda' but this actor sees no GPU "
                                   f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        self.slot = slot
        self.mode = mode
        self._evaluators: dict[tuple[str, float | None, bool], Evaluator] = {}
        self._info: ActorInfo | None = None

    def describe(self) -> ActorInfo:
        if self._info is None:
            import ray

            name, uuid = _gpu_identity() if self.mode == "cuda" else (None, None)
            gpu_ids = [str(g) for g in ray.get_gpu_ids()] if ray.is_initialized() else []
            self._info = ActorInfo(slot=self.slot, mode=self.mode, host=socket.gethostname(), pid=os.getpid(),
                                   gpu_ids=gpu_ids, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                                   gpu_name=name, gpu_uuid=uuid)
        return self._info

    def evaluate(self, problem: str, source: str, salt: int | None = None, timeout_s: float | None = None,
                 profile: bool = True) -> tuple[EvalResult, ActorInfo]:
        """One evaluation; the result and where it ran (this actor's slot, process and GPU)."""
        key = (problem, timeout_s, profile)
        if key not in self._evaluators:
            self._evaluators[key] = Evaluator(get_problem(problem), self.mode, timeout_s, profile=profile)
        result = self._evaluators[key].evaluate(source, salt)
        return result, self.describe()
