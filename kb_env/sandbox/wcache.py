"""Inside a worker: what it keeps between requests (and, in the reference worker, between
evaluations), bounded by bytes, least recently used first out.

- `ModelCache`: built models by key (shape and parameter seed). It always keeps the newest one.
- `OutputCache`: the reference outputs of a case, by `case_key` (what they depend on: shape,
  input seed, parameter seed, stress). Only the trusted reference worker has one."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Callable

import torch


def tensor_bytes(value: Any) -> int:
    """Bytes held by the tensors in `value` (nested lists, tuples and dicts)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def module_bytes(model: torch.nn.Module) -> int:
    return sum(tensor_bytes(t) for t in [*model.parameters(), *model.buffers()])


def case_key(case: dict[str, Any]) -> str:
    """What a case's reference outputs depend on."""
    return json.dumps([sorted(case["shape"].items()), case["seed"], case["param_seed"], case.get("stress")],
                      sort_keys=True)


class _LRU:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._items: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def _lookup(self, key: Any) -> Any:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def _insert(self, key: Any, value: Any, nbytes: int, keep_newest: bool) -> None:
        if key in self._items:
            self.bytes -= self._items.pop(key)[1]
        if nbytes > self.max_bytes and not keep_newest:
            return
        self._items[key] = (value, nbytes)
        self.bytes += nbytes
        while self.bytes > self.max_bytes and len(self._items) > 1:
            _, (_, old) = self._items.popitem(last=False)
            self.bytes -= old


class ModelCache(_LRU):
    """Models by key, up to `max_bytes` of parameters and buffers; always the newest one (so
    `max_bytes=0` keeps exactly one: one shape at a time)."""

    def get(self, key: Any, build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        model = self._lookup(key)
        if model is None:
            if self.max_bytes == 0:  # free the old model before the new one is built
                self._items.clear()
                self.bytes = 0
            model = build()
            self._insert(key, model, module_bytes(model), keep_newest=True)
        return model


class OutputCache(_LRU):
    """Reference outputs by `case_key`, up to `max_bytes` (0: nothing is kept)."""

    def __init__(self, max_bytes: int):
        super().__init__(max_bytes)
        self.hits = self.misses = 0

    def get(self, key: str) -> Any:
        value = self._lookup(key)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, key: str, value: Any, nbytes: int) -> None:
        if self.max_bytes > 0:
            self._insert(key, value, nbytes, keep_newest=False)
