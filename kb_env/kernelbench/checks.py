"""The checks an imported problem must pass before it is registered, on real tensors.

Inputs and weights are made exactly as the harness makes them (`kb_env.sandbox.cases`:
``get_inputs(**{})`` under a seed, ``Model(*get_init_inputs())`` under a parameter seed), and:

- every output is a tensor of a dtype the tolerance table covers, finite on ordinary inputs;
- ``get_inputs()`` honours the seed (distinct seeds give distinct inputs) and the model keeps no
  random tensors outside its state_dict (a candidate that loads the state_dict could not match);
- two runs on the same inputs agree, the second with the random generator moved on (no dropout
  or randomness in forward);
- no degenerate answer passes, output by output: all zeros, another seed's answer (the output
  barely depends on the input: ``mean(softmax(x))`` is always 1), a constant (the output's
  mean), and the first input echoed back;
- the table's bar fits the reference: its own rounding, against a float64 oracle (the model and
  inputs upcast), is at most half the relative-L2 bar;
- each stress case (inputs scaled up, down, or made heavy-tailed) is kept only where the reference
  stays finite and within half the bar of its oracle there too.

A failed check raises `Skip` with the reason the import report shows."""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import torch
from pydantic import BaseModel

from ..evaluate.correctness import compare_outputs
from ..problem import Tolerance
from ..sandbox.cases import as_output_list, make_inputs, make_reference_model
from .tolerance import SUPPORTED, tolerance_for
from .trace import stray_tensors

SEEDS = (0, 1, 2)
PARAM_SEED = 1234
STRESS_SEED = 100
STRESS_CANDIDATES: tuple[dict[str, Any], ...] = ({"scale": 8.0}, {"scale": 0.125}, {"heavy_tail": 3})
HEADROOM = 0.5  # the reference's own rounding may use at most this share of the relative-L2 bar


class Skip(Exception):
    """The problem fails a check; the message is the reason."""


class Checked(BaseModel):
    """What the checks measured, for the problem's spec and its import record."""

    device: str
    reference_ms: float
    rms: dict[str, float]  # per floating output dtype, the largest RMS over outputs and cases
    tolerance: dict[str, Tolerance]
    oracle_rel_l2: list[float | None]  # per output (None: exact dtype, or no oracle)
    oracle_note: str | None = None
    stress: list[dict[str, Any]]
    stress_dropped: list[str]


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _rms(t: torch.Tensor) -> float:
    return float(t.double().square().mean().sqrt()) if t.numel() else 0.0


def _rel_l2(got: torch.Tensor, exp: torch.Tensor) -> float:
    exp = exp.double()
    norm = float(torch.linalg.vector_norm(exp))
    diff = float(torch.linalg.vector_norm(got.double() - exp))
    return diff / norm if norm > 0 else (0.0 if diff == 0 else float("inf"))


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class _Runner:
    def __init__(self, module: ModuleType, device: str):
        self.module, self.device = module, device

    def model(self, param_seed: int = PARAM_SEED) -> torch.nn.Module:
        return make_reference_model(self.module, {}, param_seed).to(self.device).eval()

    def inputs(self, seed: int, stress: dict[str, Any] | None = None) -> list[Any]:
        return make_inputs(self.module, {}, seed, self.device, stress)

    def run(self, model: torch.nn.Module, inputs: list[Any]) -> tuple[list[torch.Tensor], float]:
        _sync(self.device)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = as_output_list(model(*inputs))
        _sync(self.device)
        ms = (time.perf_counter() - t0) * 1e3
        for k, o in enumerate(out):
            if not isinstance(o, torch.Tensor):
                raise Skip(f"forward returns a {type(o).__name__} as output {k}, not a tensor")
            if _dtype(o) not in SUPPORTED:
                raise Skip(f"output {k} is {_dtype(o)}: the tolerance table covers {', '.join(SUPPORTED)}")
        return [o.detach() for o in out], ms


def _passes(got: torch.Tensor, exp: torch.Tensor, tol: dict[str, Tolerance]) -> tuple[bool, float]:
    ok, _, stats = compare_outputs([got], [exp], tol)
    return ok, stats.get("rel_l2_err", 0.0)


def _same_inputs(a: list[Any], b: list[Any]) -> bool:
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) else x == y
               for x, y in zip(a, b))


def _upcast(x: Any) -> Any:
    return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def _oracle(run: _Runner, inputs: list[Any]) -> tuple[list[torch.Tensor] | None, str | None]:
    """The model (built afresh with the same weights, so code that closes over its submodules
    follows them) and the inputs in float64, or why not."""
    try:
        with torch.no_grad():
            out = as_output_list(run.model().double()(*[_upcast(x) for x in inputs]))
    except Exception as exc:  # noqa: BLE001 (a reference that cannot run in float64 has no oracle)
        return None, f"no float64 oracle: the model fails in float64 ({type(exc).__name__})"
    return out, None


def _check_stray(run: _Runner, model: torch.nn.Module) -> None:
    names = stray_tensors(model)
    if not names:
        return
    other = run.model(PARAM_SEED + 1)
    mine = dict(model.named_modules())
    theirs = dict(other.named_modules())
    differ = []
    for name in names:
        prefix, _, attr = name.rpartition(".")
        a, b = getattr(mine[prefix], attr), getattr(theirs[prefix], attr)
        if a.shape != b.shape or not torch.equal(a, b):
            differ.append(name)
    if differ:
        raise Skip(f"Model keeps random tensor(s) outside its state_dict ({', '.join(differ[:4])}): a candidate "
                   "that loads the state_dict cannot reproduce them")


def _degenerate(k: int, seed: int, outs: dict[int, list[torch.Tensor]], inputs: dict[int, list[Any]],
                tol: dict[str, Tolerance]) -> str | None:
    """Why output `k` of `seed` can be answered without computing it, or None."""
    exp = outs[seed][k]
    bar = tol[_dtype(exp)].max_rel_l2
    if _passes(torch.zeros_like(exp), exp, tol)[0]:
        return f"output {k} is all zeros: an all-zeros answer passes"
    other = SEEDS[(SEEDS.index(seed) + 1) % len(SEEDS)]
    ok, err = _passes(outs[other][k], exp, tol)
    if ok:
        return (f"output {k} barely depends on the input: the answer for seed {other} passes as the answer for "
                f"seed {seed} (relative L2 {err:.2g}, bar {bar:g}); a near-constant answer would pass")
    if exp.is_floating_point() and exp.numel() > 1:
        ok, err = _passes(torch.full_like(exp, float(exp.double().mean())), exp, tol)
        if ok:
            return f"output {k} is nearly constant: its mean everywhere passes (relative L2 {err:.2g}, bar {bar:g})"
    first = inputs[seed][0] if inputs[seed] else None
    if k == 0 and isinstance(first, torch.Tensor) and first.shape == exp.shape and first.dtype == exp.dtype:
        if _passes(first, exp, tol)[0]:
            return "output 0 equals the first input: returning the input unchanged passes"
    return None


def run_checks(module: ModuleType, device: str) -> Checked:
    """Every check in the module docstring, on `device`; raises `Skip` on the first that fails."""
    run = _Runner(module, device)
    model = run.model()
    _check_stray(run, model)
    inputs, outs, times = _grading_runs(run, model)
    model_again, inputs_again = run.model(), run.inputs(SEEDS[0])
    torch.manual_seed(PARAM_SEED + 7)  # a forward that draws random numbers now draws other ones
    again, _ = run.run(model_again, inputs_again)
    del model_again, inputs_again

    floats = any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs[SEEDS[0]])
    stresses = list(STRESS_CANDIDATES if floats else ())
    # The bar's scale covers the stress cases too (their outputs are not kept, to save memory).
    rms = _rms_by_dtype([*outs.values(), *(run.run(model, run.inputs(STRESS_SEED + i, st))[0]
                                           for i, st in enumerate(stresses))])
    tol = {_dtype(o): tolerance_for(_dtype(o), rms.get(_dtype(o))) for o in outs[SEEDS[0]]}

    ok, mismatch, _ = compare_outputs(again, outs[SEEDS[0]], tol)
    if not ok:
        raise Skip(f"the reference is not deterministic (dropout or randomness in forward?): two runs on the same "
                   f"inputs differ: {mismatch.message}")
    for seed in SEEDS:
        for k in range(len(outs[seed])):
            if why := _degenerate(k, seed, outs, inputs, tol):
                raise Skip(why)
    errs, note = _check_oracle(run, inputs[SEEDS[0]], outs[SEEDS[0]], tol)

    kept, dropped = [], []
    for i, stress in enumerate(stresses):
        x = run.inputs(STRESS_SEED + i, stress)
        if why := _stress_problem(run, x, run.run(model, x)[0], tol):
            dropped.append(f"{_describe(stress)}: {why}")
        else:
            kept.append(stress)
    return Checked(device=device, reference_ms=min(times), rms=rms, tolerance=tol, oracle_rel_l2=errs,
                   oracle_note=note, stress=kept, stress_dropped=dropped)


def _grading_runs(run: _Runner, model: torch.nn.Module) -> tuple[dict, dict, list[float]]:
    """Inputs, outputs and call times for each grading seed; outputs finite, seeds honoured."""
    inputs: dict[int, list[Any]] = {}
    outs: dict[int, list[torch.Tensor]] = {}
    times = []
    for seed in SEEDS:
        inputs[seed] = run.inputs(seed)
        outs[seed], ms = run.run(model, inputs[seed])
        times.append(ms)
        for k, o in enumerate(outs[seed]):
            if o.is_floating_point() and not bool(torch.isfinite(o).all()):
                n = int((~torch.isfinite(o)).sum())
                raise Skip(f"output {k} has {n} non-finite value(s) on ordinary inputs (seed {seed}): "
                           "they could not be checked")
    if _same_inputs(inputs[SEEDS[0]], inputs[SEEDS[1]]):
        raise Skip("get_inputs() ignores the seed (it reseeds, or makes fixed data): every grading case would be the same")
    return inputs, outs, times


def _rms_by_dtype(outputs) -> dict[str, float]:
    """Per floating dtype, the largest RMS of a finite output among `outputs` (lists of tensors)."""
    rms: dict[str, float] = {}
    for out in outputs:
        for o in out:
            if o.is_floating_point() and bool(torch.isfinite(o).all()):
                rms[_dtype(o)] = max(rms.get(_dtype(o), 0.0), _rms(o))
    return rms


def _check_oracle(run: _Runner, inputs: list[Any], outs: list[torch.Tensor],
                  tol: dict[str, Tolerance]) -> tuple[list[float | None], str | None]:
    """Each output's relative L2 error against the float64 oracle, and a note where there is none;
    `Skip` when the reference's own rounding uses more than HEADROOM of its bar."""
    oracle, note = _oracle(run, inputs)
    errs = _oracle_errors(outs, oracle)
    if oracle is not None and all(e is None for e in errs) and any(
            o.is_floating_point() and o.dtype != torch.float64 for o in outs):
        note = "no float64 oracle: the model does not compute in float64 when upcast"
    for k, err in enumerate(errs):
        if err is None:
            continue
        dtype = _dtype(outs[k])
        bar = tol[dtype].max_rel_l2
        if err > HEADROOM * bar:
            raise Skip(f"the {dtype} bar is too fine for this reference: its own rounding is {err:.2g} in relative "
                       f"L2 against a float64 oracle (output {k}), over half the bar {bar:g}")
    return errs, note


def _oracle_errors(outs: list[torch.Tensor], oracle: list[torch.Tensor] | None) -> list[float | None]:
    """Relative L2 error of each floating output against the oracle (None where there is none)."""
    errs: list[float | None] = []
    for k, o in enumerate(outs):
        ref = oracle[k] if oracle is not None and k < len(oracle) else None
        usable = (o.is_floating_point() and o.dtype != torch.float64 and isinstance(ref, torch.Tensor)
                  and ref.dtype == torch.float64 and ref.shape == o.shape)
        errs.append(_rel_l2(o, ref) if usable else None)
    return errs


def _stress_problem(run: _Runner, inputs: list[Any], outs: list[torch.Tensor],
                    tol: dict[str, Tolerance]) -> str | None:
    """Why a stress case would not be fair to an honest kernel, or None."""
    for k, o in enumerate(outs):
        if o.is_floating_point() and not bool(torch.isfinite(o).all()):
            return f"the reference's output {k} is not finite there"
    oracle, _ = _oracle(run, inputs)
    for k, err in enumerate(_oracle_errors(outs, oracle)):
        if err is None:
            continue
        o = outs[k]
        bar = tol[_dtype(o)].max_rel_l2
        if err > HEADROOM * bar or not _passes(oracle[k].to(o.dtype), o, tol)[0]:
            return f"the reference's own rounding there is {err:.2g} in relative L2 (output {k}), over half the bar {bar:g}"
    return None


def _describe(stress: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in stress.items())
