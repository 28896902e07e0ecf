"""Inside a worker: the `decode` interface. A decode problem's model has
``step(hidden, state) -> (hidden, state)``: its inputs are ``[hidden, state]`` with `state` a
list of dicts of tensors (one per layer), and what a step returns is flattened into named
tensors (``hidden``, ``state[0].S``, ...) that travel to the trusted side like a forward's
outputs. The names let the checker match each returned tensor with the one that was fed."""

from __future__ import annotations

from typing import Any

import torch

_clone = torch.Tensor.clone  # bound before any candidate code exists
_detach = torch.Tensor.detach

HIDDEN = "hidden"


class StepShapeError(ValueError):
    """What a step returned is not (hidden tensor, list of dicts of tensors)."""


def state_name(layer: int, key: str) -> str:
    return f"state[{layer}].{key}"


def flatten(hidden: Any, state: Any) -> tuple[list[str], list[Any]]:
    """Names and values of a (hidden, state) pair, in a fixed order (layers in order, keys sorted);
    StepShapeError naming what is wrong when the structure is not (tensor, list of dicts)."""
    if not isinstance(hidden, torch.Tensor):
        raise StepShapeError(f"step returned a {type(hidden).__name__} as the hidden, not a torch.Tensor")
    if not isinstance(state, (list, tuple)):
        raise StepShapeError(f"step returned a {type(state).__name__} as the state, not a list of dicts")
    names, values = [HIDDEN], [hidden]
    for i, layer in enumerate(state):
        if not isinstance(layer, dict) or not all(isinstance(k, str) for k in layer):
            raise StepShapeError(f"state[{i}] is a {type(layer).__name__}, not a dict of named tensors")
        for key in sorted(layer):
            names.append(state_name(i, key))
            values.append(layer[key])
    return names, values


def flatten_step(out: Any) -> tuple[list[str], list[Any]]:
    """`flatten` of what `step` returned, which must be a (hidden, state) pair."""
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise StepShapeError(f"step must return (hidden, state), not a {type(out).__name__}"
                             + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""))
    return flatten(out[0], out[1])


def unflatten(names: list[str], values: list[torch.Tensor]) -> list[Any]:
    """[hidden, state] back from `flatten`'s names and values."""
    hidden = None
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in zip(names, values):
        if name == HIDDEN:
            hidden = value
            continue
        head, key = name.split(".", 1)
        layers.setdefault(int(head[len("state["):-1]), {})[key] = value
    if hidden is None or sorted(layers) != list(range(len(layers))):
        raise StepShapeError(f"names {names[:4]}... are not a flattened (hidden, state)")
    return [hidden, [layers[i] for i in range(len(layers))]]


def snapshot(out: Any) -> tuple[list[str], list[torch.Tensor]] | None:
    """Detached copies of a step's returned tensors (None if it returned something else): the
    harness keeps these, since a later step may update the returned tensors in place."""
    try:
        names, values = flatten_step(out)
    except StepShapeError:
        return None
    return names, [_clone(_detach(v)) if isinstance(v, torch.Tensor) else v for v in values]
