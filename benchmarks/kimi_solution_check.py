"""GPU self-check of kimi_linear_decode's known-good solutions: the one-shot diagnosis for their
first run on a GPU. Needs only torch and triton (no kb_env install).

    python benchmarks/kimi_solution_check.py [--contexts 2048 8192 16384] [--race-steps 200] [--quick]
        [--tiles NUM_WARPS=16 KB_IN=64 ...]   (megakernel tile settings, to try variants)
        [--device cpu]                         (a dry run of this script: Triton's interpreter, CPU config)

For each solution (the megakernel, problems/kimi_linear_decode/solutions/triton_megakernel.py,
and the multi-kernel one, tests/candidates/kimi_multikernel.py), on the real unit's config:

1. phases: every phase (megakernel: one launch per phase, barrier compiled out; multi-kernel:
   every kernel launch) at a short context, its scratch outputs against the same quantities
   recomputed in fp32 from the reference's weights, twice: *isolated* (each phase's scratch
   inputs overwritten with the reference's first, so a wrong phase cannot hide behind or blame
   another) and *chained* (as the step runs). The first failing phase is named.
2. step: one whole step (the megakernel: its single launch) against the reference's step at
   each context, every returned tensor by cosine as the harness's checker does (the tensor, what
   the step changed, a grown cache's kept and new rows), then a second step from the state the
   solution returned (its own cache views: the append-in-place path) against the reference from
   that same state.
3. races (megakernel): the same step from the same fresh inputs `--race-steps` times: every
   output must be bitwise identical run to run and to the one-launch-per-phase run (the kernel is
   deterministic: no float atomics), and no barrier may have timed out; then chained steps
   against the multi-kernel solution (a drifting cosine is a race in the cache append path).
4. launches: kernels per steady-state step, counted by torch.profiler.
5. speed: CUDA-event ms/token (L2 flushed before each step, median over chained steps from a
   fresh state) at each context, next to the baseline's (problem's baseline.py); GB/s from the
   problem's bytes formula.

Prints a short table last; writes JSON to $OUT/kimi_solution_check.json (or --out).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "problems" / "kimi_linear_decode"
SOLUTIONS = {"megakernel": PROBLEM / "solutions" / "triton_megakernel.py",
             "multikernel": ROOT / "tests" / "candidates" / "kimi_multikernel.py"}
PHASE_BAR = 0.999  # an intermediate recomputed in fp32 agrees far closer than the step's 0.98
STEP_BAR, DELTA_BAR, PREFIX_BAR = 0.98, 0.9, 0.9999  # problem.yaml's decode bars
PARAM_SEED, INPUT_SEED = 11, 5
DEVICE = "cuda"
CPU_SHAPE = {"hidden": 256, "heads": 2, "kv_lora": 128, "experts": 8, "active": 2, "moe_inter": 128}  # problem.yaml's


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    den = float(a.norm() * b.norm())
    return float(a @ b) / den if den > 0 else (1.0 if float(a.norm()) == float(b.norm()) == 0 else 0.0)


def bytes_per_token(cfg, context: int) -> float:
    """problem.yaml's bytes formula, evaluated with the config's numbers."""
    import re
    text = (PROBLEM / "problem.yaml").read_text()
    formula = re.search(r"^bytes: >-\n((?:  .*\n)+)", text, re.M).group(1)
    names = dict(context=context, hidden=cfg.hidden, heads=cfg.kda_heads, kv_lora=cfg.kv_lora,
                 experts=cfg.n_experts, active=cfg.n_active, moe_inter=cfg.moe_inter)
    return float(eval(" ".join(formula.split()), {}, names))  # noqa: S307 (the repo's own formula)


# ===== the reference's intermediates, recomputed in fp32 =============================================
def make_inputs(refmod, cfg, context: int, seed: int):
    """The reference's hidden and state, drawn on the device."""
    with torch.device(DEVICE):
        return refmod.init_token(cfg, seed), refmod.init_state(cfg, context, seed)


def reference_trace(refmod, model, hidden: torch.Tensor, state: list[dict]) -> dict[str, dict[str, torch.Tensor]]:
    """Per phase name (the megakernel's `phase_names`), the quantities the phase writes, keyed by
    the solutions' scratch names ("x", "proj", ...) or state names, and the inputs it reads
    (keys "in:<scratch>"), computed from the reference model's weights exactly as reference.py does."""
    cfg = model.cfg
    hk, dk, hm = cfg.kda_heads * cfg.kda_head_dim, cfg.kda_head_dim, cfg.mla_heads
    out: dict[str, dict[str, torch.Tensor]] = {}
    x = hidden.float()
    out["prologue"] = {"x": x.clone()}
    for li, (blk, st) in enumerate(zip(model.blocks, state)):
        a = blk.attn
        xn = refmod.rmsnorm(x, blk.attn_norm)
        if cfg.pattern[li] == "K":
            ws = [p.weight() for p in (a.q_proj, a.k_proj, a.v_proj, a.g_proj)]
            proj = torch.cat([xn @ w for w in ws])
            out[f"{li}.kda_proj"] = {"in:x": x.clone(), "proj": proj, "xn": xn}
            feats, windows = [], {}
            for c, name in enumerate(("cq", "ck", "cv")):
                cur = proj[c * hk:(c + 1) * hk]
                window = torch.cat([st[name].float(), cur[None]], dim=0)
                feats.append(torch.nn.functional.silu((window * a.conv_w[c].float().t()).sum(0)))
                windows[name] = window[1:].to(st[name].dtype)
            q, k, v = (f.reshape(cfg.kda_heads, dk) for f in feats)
            q = q * dk ** -0.5
            g = -torch.nn.functional.softplus(proj[3 * hk:]).reshape(cfg.kda_heads, dk)
            beta = torch.sigmoid(xn @ a.beta_proj.weight.float().t())
            S = st["S"].float() * torch.exp(g)[:, :, None]
            pred = torch.einsum("hkv,hk->hv", S, k)
            S = S + beta[:, None, None] * k[:, :, None] * (v - pred)[:, None, :]
            o = torch.einsum("hkv,hk->hv", S, q).reshape(-1)
            out[f"{li}.kda_recur"] = {"in:proj": proj, "in:xn": xn, "attn": o, "state:S": S}
            h = x + o @ a.o_proj.weight()
            out[f"{li}.out_proj"] = {"in:attn": o, "in:x": x.clone(), "in:proj": proj, "h": h,
                                     **{f"state:{n}": w for n, w in windows.items()}}
        else:
            nope, rope_d, kvl = cfg.qk_nope, cfg.qk_rope, cfg.kv_lora
            proj = torch.cat([xn @ a.q_proj.weight(), xn @ a.kv_a.weight()])
            out[f"{li}.mla_proj"] = {"in:x": x.clone(), "proj": proj}
            pos = st["c_kv"].shape[0]
            scale = (nope + rope_d) ** -0.5
            q = proj[:hm * (nope + rope_d)].reshape(hm, nope + rope_d)
            q_nope, q_rope = q[:, :nope], refmod.rope(q[:, nope:], pos, cfg.rope_theta)
            kv = proj[hm * (nope + rope_d):]
            c_new, kr_new = kv[:kvl].to(torch.bfloat16), refmod.rope(kv[kvl:], pos, cfg.rope_theta).to(torch.bfloat16)
            wkvb = a.kv_b.weight().reshape(kvl, hm, nope + cfg.v_head)
            q_lat = torch.einsum("chd,hd->hc", wkvb[:, :, :nope], q_nope) * scale
            out[f"{li}.mla_absorb"] = {"in:proj": proj, "qlat": q_lat.reshape(-1), "qrope": (q_rope * scale).reshape(-1),
                                       "cache:c_row": c_new, "cache:r_row": kr_new}
            c_all = torch.cat([st["c_kv"], c_new[None]]).float()
            r_all = torch.cat([st["k_rope"], kr_new[None]]).float()
            # the reference's attention, in its own (non-absorbed) form
            kvb = (c_all @ a.kv_b.weight()).reshape(-1, hm, nope + cfg.v_head)
            scores = (torch.einsum("hd,thd->ht", q_nope, kvb[..., :nope]) + q_rope @ r_all.t()) * scale
            p = torch.softmax(scores, dim=-1)
            o_lat = p @ c_all  # (hm, kvl): the latent output the absorbed form keeps
            v = torch.einsum("ht,thd->hd", p, kvb[..., nope:]).reshape(-1)
            out[f"{li}.mla_attend"] = {"in:qlat": q_lat.reshape(-1), "in:qrope": (q_rope * scale).reshape(-1),
                                       "partials:olat": o_lat.reshape(-1)}
            out[f"{li}.mla_combine"] = {"olat": o_lat.reshape(-1), "attn": v}
            h = x + v @ a.o_proj.weight()
            out[f"{li}.out_proj"] = {"in:attn": v, "in:x": x.clone(), "h": h}
        m = blk.moe
        hn = refmod.rmsnorm(h, blk.moe_norm)
        logits = hn @ m.router.weight.float().t()
        shared = torch.cat([torch.nn.functional.silu(hn @ m.s_gate.weight(s)) * (hn @ m.s_up.weight(s))
                            for s in range(cfg.n_shared)])
        out[f"{li}.moe_router"] = {"in:h": h, "logits": logits, "act_shared": shared}
        probs = torch.softmax(logits, dim=-1)
        top_p, top_i = torch.topk(probs, cfg.n_active)
        weights = top_p / top_p.sum() * cfg.routed_scaling
        routed = torch.cat([torch.nn.functional.silu(hn @ m.gate.weight(int(e))) * (hn @ m.up.weight(int(e)))
                            for e in top_i])
        out[f"{li}.moe_gate_up"] = {"in:h": h, "in:logits": logits, "rid": top_i.int(), "rw": weights,
                                    "act_routed": routed}
        y = sum(w * m.expert(hn, m.gate, m.up, m.down, int(e)) for w, e in zip(weights, top_i))
        for s in range(cfg.n_shared):
            y = y + m.expert(hn, m.s_gate, m.s_up, m.s_down, s)
        x = h + y
        act = torch.cat([routed, shared])
        rid = torch.cat([top_i.int(), torch.arange(cfg.n_experts, cfg.n_experts + cfg.n_shared, device=h.device).int()])
        rw = torch.cat([weights, torch.ones(cfg.n_shared, device=h.device)])
        out[f"{li}.moe_down"] = {"in:act": act, "in:rid": rid, "in:rw": rw, "in:h": h, "x": x}
    out["final"] = {"out": x.to(hidden.dtype)}
    return out


# ===== per-phase checks ============================================================================
class PhaseChecker:
    """Compares a solution's scratch (and state) after each phase with the reference trace;
    `isolate` first writes the trace's inputs of the phase into the scratch."""

    def __init__(self, model, trace: dict, state: list[dict], cfg, isolate: bool, state_in_place: bool):
        self.model, self.trace, self.state, self.cfg, self.isolate = model, trace, state, cfg, isolate
        self.state_in_place = state_in_place  # the megakernel's KDA state; the multi-kernel writes new tensors
        self.rows: list[dict] = []
        self.n_chunks: int | None = None

    def _layer_state(self, name: str) -> dict:
        return self.state[int(name.split(".")[0])] if "." in name else {}

    def before(self, name: str) -> None:
        if not self.isolate:
            return
        s = self.model._s
        for key, val in self.trace.get(name, {}).items():
            if key.startswith("in:"):
                buf = s[key[3:]]
                buf.view(-1)[:val.numel()].copy_(val.flatten().to(buf.dtype))

    def after(self, name: str) -> None:
        sync()
        s, cfg = self.model._s, self.cfg
        got: dict[str, torch.Tensor] = {}
        exp = self.trace.get(name, {})
        a, hm = cfg.n_active, cfg.mla_heads
        for key, val in exp.items():
            if key.startswith("in:"):
                continue
            if key.startswith("state:"):
                if not self.state_in_place:
                    continue
                got[key] = self._layer_state(name)[key[6:]]
            elif key == "cache:c_row":
                pos = self._layer_state(name)["c_kv"].shape[0]
                got[key] = self.model._cache[0][pos]
            elif key == "cache:r_row":
                pos = self._layer_state(name)["k_rope"].shape[0]
                got[key] = self.model._cache[1][pos]
            elif key == "act_shared":
                got[key] = s["act"][a * cfg.moe_inter:(a + cfg.n_shared) * cfg.moe_inter]
            elif key == "act_routed":
                got[key] = s["act"][:a * cfg.moe_inter]
            elif key in ("rid", "rw"):
                got[key] = s[key][:a]
            elif key == "partials:olat":
                nc = self.n_chunks
                pm = s["pm"][:nc * hm].view(nc, hm)
                pl = s["pl"][:nc * hm].view(nc, hm)
                pacc = s["pacc"][:nc * hm * cfg.kv_lora].view(nc, hm, cfg.kv_lora)
                w = torch.exp(pm - pm.max(0).values)
                got[key] = ((w[:, :, None] * pacc).sum(0) / (w * pl).sum(0)[:, None]).flatten()
            elif key == "out":
                continue
            else:
                got[key] = s[key].view(-1)[:val.numel()]
        row = {"phase": name, "items": {}}
        for key, g in got.items():
            e = exp[key]
            if key == "rid":
                row["items"][key] = 1.0 if torch.equal(g.cpu().int(), e.cpu().int()) else 0.0
                if row["items"][key] < 1:
                    row["rid_got"], row["rid_expected"] = g.tolist(), e.tolist()
            else:
                row["items"][key] = cosine(g.float(), e.float())
        row["min"] = min(row["items"].values()) if row["items"] else 1.0
        row["ok"] = row["min"] >= PHASE_BAR
        self.rows.append(row)

    def first_failure(self) -> dict | None:
        return next((r for r in self.rows if not r["ok"]), None)


def phase_names(cfg) -> list[str]:
    names = ["prologue"]
    for li, kind in enumerate(cfg.pattern):
        names += [f"{li}.{n}" for n in (("kda_proj", "kda_recur", "out_proj") if kind == "K" else
                                        ("mla_proj", "mla_absorb", "mla_attend", "mla_combine", "out_proj"))]
        names += [f"{li}.{n}" for n in ("moe_router", "moe_gate_up", "moe_down")]
    return names


def run_phases_megakernel(model, hidden, state, checker: PhaseChecker) -> torch.Tensor:
    run = model.prepare_step(hidden, state)
    checker.n_chunks = run.args[run.first_index - 2]
    for ph, name in enumerate(model.phase_names):
        checker.before(name)
        run.run(ph, ph, grid_sync=False)
        checker.after(name)
    return run.out


class _Hooked:
    """A Triton kernel whose launches call the checker around them (multi-kernel phases)."""

    def __init__(self, kernel, name: str, driver):
        self.kernel, self.name, self.driver = kernel, name, driver

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.driver.launch(self.name, self.kernel, grid, args, kwargs)
        return launch


class MultiDriver:
    KERNEL_PHASES = {"_prologue_kernel": "prologue", "_proj_kernel": "proj", "_kda_kernel": "kda_recur",
                     "_out_kernel": "out_proj", "_absorb_kernel": "mla_absorb", "_attend_kernel": "mla_attend",
                     "_combine_kernel": "mla_combine", "_router_kernel": "moe_router",
                     "_gate_up_kernel": "moe_gate_up", "_down_kernel": "moe_down"}

    def __init__(self, module, checker: PhaseChecker, names: list[str]):
        self.module, self.checker, self.names, self.i = module, checker, names, 0
        self.saved = {k: getattr(module, k) for k in list(self.KERNEL_PHASES) + ["_copy_rows_kernel"]}

    def __enter__(self):
        for k, v in self.saved.items():
            setattr(self.module, k, _Hooked(v, k, self))
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            setattr(self.module, k, v)

    def launch(self, kname, kernel, grid, args, kwargs):
        if kname == "_copy_rows_kernel":  # part of the step's set-up, not a phase
            kernel[grid](*args, **kwargs)
            return
        name = self.names[self.i]
        self.i += 1
        if kname == "_attend_kernel":
            self.checker.n_chunks = grid[0]
        self.checker.before(name)
        kernel[grid](*args, **kwargs)
        self.checker.after(name)


# ===== whole steps ==================================================================================
def step_cosines(names_got, got, names_exp, exp, fed) -> dict[str, dict[str, float]]:
    """The harness's comparisons (decode_check), as cosines per returned tensor."""
    fed_by = dict(zip(names_exp, fed))
    rows = {}
    for n, g, e in zip(names_got, got, exp):
        f = fed_by.get(n)
        r = {}
        if g.shape != e.shape:
            r["shape"] = 0.0
        elif f is not None and f.shape == e.shape:
            r["tensor"] = cosine(g, e)
            if float((e.double() - f.double()).abs().max()) > 0:
                r["delta"] = cosine(g.double() - f.double(), e.double() - f.double())
        elif f is not None and e.shape[0] > f.shape[0]:
            r["kept"] = cosine(g[:f.shape[0]], f)
            r["new"] = cosine(g[f.shape[0]:], e[f.shape[0]:])
        else:
            r["tensor"] = cosine(g, e)
        rows[n] = r
    return rows


def passes(rows: dict[str, dict[str, float]]) -> bool:
    bars = {"tensor": STEP_BAR, "delta": DELTA_BAR, "kept": PREFIX_BAR, "new": STEP_BAR, "shape": 1.0}
    return all(v >= bars[k] for r in rows.values() for k, v in r.items())


def flatten(hidden, state):
    names, vals = ["hidden"], [hidden]
    for i, layer in enumerate(state):
        for k in sorted(layer):
            names.append(f"state[{i}].{k}")
            vals.append(layer[k])
    return names, vals


def clone_state(state):
    return [{k: v.clone() for k, v in layer.items()} for layer in state]


def check_steps(refmod, oracle, model, cfg, contexts) -> list[dict]:
    out = []
    for ctx in contexts:
        shape = {"context": ctx}
        hidden, state = make_inputs(refmod, cfg, ctx, INPUT_SEED + ctx)
        fed_names, fed = flatten(hidden, state)
        fed = [f.clone() for f in fed]
        with torch.no_grad():
            e_h, e_s = oracle.step(hidden.clone(), clone_state(state))
            g_h, g_s = model.step(hidden, state)
        sync()
        rows = step_cosines(*flatten(g_h, g_s), *flatten(e_h, e_s), fed)
        # a second step from the solution's own returned state (own cache views, appended in place)
        fed2_names, fed2 = flatten(g_h, g_s)
        fed2 = [f.clone() for f in fed2]
        with torch.no_grad():
            e2_h, e2_s = oracle.step(g_h.clone(), clone_state(g_s))
            g2_h, g2_s = model.step(g_h, g_s)
        sync()
        rows2 = step_cosines(*flatten(g2_h, g2_s), *flatten(e2_h, e2_s), fed2)
        out.append({"context": ctx, "first": rows, "first_ok": passes(rows), "own_state": rows2,
                    "own_state_ok": passes(rows2),
                    "min_cos": min(v for r in list(rows.values()) + list(rows2.values()) for v in r.values())})
        del e_s, g_s, e2_s, g2_s, state
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return out


# ===== races, launches, speed ========================================================================
def race_check(refmod, mk_model, multi_model, cfg, n: int) -> dict:
    ctx = 256 if DEVICE == "cuda" else 20
    def fresh():
        return make_inputs(refmod, cfg, ctx, 99)

    h, s = fresh()
    base_out, base_state = mk_model.step(h, s)
    base = [t.clone() for t in flatten(base_out, base_state)[1]]
    h, s = fresh()
    run = mk_model.prepare_step(h, s)
    for ph in range(mk_model.n_phases):
        run.run(ph, ph, grid_sync=False)
    per_phase = flatten(run.out, run.state)[1]
    per_phase_equal = all(torch.equal(a, b) for a, b in zip(base, per_phase))
    moved, worst = 0, 0.0
    for _ in range(n):
        h, s = fresh()
        o, st = mk_model.step(h, s)
        for a, b in zip(base, flatten(o, st)[1]):
            if not torch.equal(a, b):
                moved += 1
                worst = max(worst, float((a.double() - b.double()).abs().max()))
                break
    # chained: megakernel vs multi-kernel over many steps (own-view appends every step)
    h1, s1 = fresh()
    h2, s2 = fresh()
    chained = []
    for _ in range(min(n, 50)):
        h1, s1 = mk_model.step(h1, s1)
        h2, s2 = multi_model.step(h2, s2)
        chained.append(cosine(h1.float(), h2.float()))
    sync()
    return {"runs": n, "runs_differing": moved, "worst_abs_diff": worst, "per_phase_bitwise_equal": per_phase_equal,
            "barrier_timeouts": mk_model.barrier_timeouts(), "chained_vs_multikernel_min_cos": min(chained),
            "chained_vs_multikernel_last_cos": chained[-1]}


def sync_bisect(refmod, model, cfg) -> dict:
    """Megakernel: phases 0..p in ONE launch (with its grid barriers) against the same phases launched
    one by one, every scratch buffer and state tensor compared bitwise after phase p, for each p: the
    first phase whose result differs is where a barrier or a cross-program read is wrong."""
    ctx = 256 if DEVICE == "cuda" else 20

    def snapshot(run) -> dict[str, torch.Tensor]:
        sync()
        snap = {f"scratch.{k}": v.clone() for k, v in model._s.items() if k != "xpriv"}
        snap["out"] = run.out.clone()
        for i, layer in enumerate(run.state):
            for k, v in layer.items():
                snap[f"state[{i}].{k}"] = v.clone()
        return snap

    if DEVICE != "cuda":
        return {"first_divergent_phase": None, "skipped": "the interpreter has no fused launch"}

    def fresh_run():
        h, s = make_inputs(refmod, cfg, ctx, 123)
        run = model.prepare_step(h, s)
        for buf in model._s.values():  # poisoned: what a phase reads before it was written shows
            buf.fill_(float("nan") if buf.is_floating_point() else -1)
        return run

    run = fresh_run()
    expected = []
    for ph in range(model.n_phases):
        run.run(ph, ph, grid_sync=False)
        expected.append(snapshot(run))
    for ph in range(model.n_phases):
        run = fresh_run()
        run.run(0, ph, grid_sync=True)
        got = snapshot(run)
        diff = [k for k, v in expected[ph].items() if not
                torch.equal(torch.nan_to_num(v.float(), nan=7.0), torch.nan_to_num(got[k].float(), nan=7.0))]
        if diff:
            return {"first_divergent_phase": model.phase_names[ph], "buffers": diff,
                    "barrier_timeouts": model.barrier_timeouts()}
    return {"first_divergent_phase": None, "barrier_timeouts": model.barrier_timeouts()}


def count_launches(model, refmod, cfg) -> int | None:
    """Kernels launched by one steady-state step (two chained steps first), counted as the harness
    counts them (kb_env/sandbox/kprofile.py, loaded by path: the profiler, a fence before the call
    and a marker after it)."""
    if DEVICE != "cuda":
        return None
    kprofile = load(ROOT / "kb_env" / "sandbox" / "kprofile.py", "kimi_check_kprofile")
    h, s = make_inputs(refmod, cfg, 512, 7)
    for _ in range(2):
        h, s = model.step(h, s)
    records = kprofile.profile_call(model.step, [h, s], "cuda")
    return sum(1 for r in records if r.get("when") == "call")


def time_steps(model, refmod, cfg, ctx: int, steps: int, flush: torch.Tensor) -> dict:
    if DEVICE != "cuda":  # the dry run: host wall time, meaningless but the same code path
        h, s = make_inputs(refmod, cfg, ctx, 3)
        t0 = time.perf_counter()
        for _ in range(steps):
            h, s = model.step(h, s)
        ms = (time.perf_counter() - t0) * 1e3 / steps
        return {"median_ms": ms, "min_ms": ms, "max_ms": ms, "host_ms": ms}
    times = []
    for rep in range(2):  # the first run warms up
        h, s = make_inputs(refmod, cfg, ctx, 3 + rep)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        host = []
        for a, b in ev:
            flush.zero_()
            a.record()
            t0 = time.perf_counter()
            h, s = model.step(h, s)
            host.append(time.perf_counter() - t0)
            b.record()
        torch.cuda.synchronize()
        if rep:
            times = [a.elapsed_time(b) for a, b in ev]
        del s
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
            "host_ms": statistics.median(host) * 1e3}


def phase_times(model, refmod, cfg, ctx: int) -> dict[str, float]:
    """Megakernel: GPU ms of each phase launched alone (barrier compiled out), median of 5 steps."""
    names = model.phase_names
    per: dict[str, list[float]] = {n: [] for n in names}
    if DEVICE != "cuda":
        return {n: 0.0 for n in names}
    for rep in range(6):
        h, s = make_inputs(refmod, cfg, ctx, 40 + rep)
        run = model.prepare_step(h, s)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in names]
        for ph, (a, b) in enumerate(ev):
            a.record()
            run.run(ph, ph, grid_sync=False)
            b.record()
        torch.cuda.synchronize()
        if rep:
            for n, (a, b) in zip(names, ev):
                per[n].append(a.elapsed_time(b))
    return {n: statistics.median(v) for n, v in per.items()}


def kernel_resources(module) -> dict:
    """Registers, spills and shared memory of the compiled megakernel (where Triton exposes them)."""
    out = {}
    try:
        caches = module._decode_step_kernel.device_caches
        for dev, entry in caches.items():
            for key, k in entry[0].items():
                out[str(len(out))] = {"n_regs": getattr(k, "n_regs", None), "n_spills": getattr(k, "n_spills", None),
                                      "shared": getattr(k.metadata, "shared", None),
                                      "grid_sync": "GRID_SYNC" in str(key) and "True" in str(key)}
    except Exception as exc:  # noqa: BLE001 (diagnostics only)
        out["error"] = repr(exc)
    return out


# ===== main ===========================================================================================
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="*", default=[2048, 8192, 16384])
    ap.add_argument("--race-steps", type=int, default=200)
    ap.add_argument("--timed-steps", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="phases and one short step only")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tiles", nargs="*", default=[], help="megakernel Tiles overrides, KEY=INT")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda":
        if not torch.cuda.is_available():
            sys.exit("kimi_solution_check.py: needs a CUDA GPU (or --device cpu for a dry run)")
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = "1"
        if args.contexts == [2048, 8192, 16384]:
            args.contexts = [16, 37]
        args.race_steps = min(args.race_steps, 3)
        args.timed_steps = min(args.timed_steps, 2)
    tiles = {k: int(v) for k, v in (t.split("=", 1) for t in args.tiles)}
    import triton
    out_path = Path(args.out) if args.out else Path(os.environ.get("OUT", ".")) / "kimi_solution_check.json"
    cuda = DEVICE == "cuda"
    record: dict = {"gpu": torch.cuda.get_device_name(0) if cuda else "cpu (dry run)", "torch": torch.__version__,
                    "triton": triton.__version__, "tiles": tiles,
                    "sms": torch.cuda.get_device_properties(0).multi_processor_count if cuda else None,
                    "solutions": {}}
    print(f"GPU {record['gpu']}  torch {record['torch']}  triton {record['triton']}  SMs {record['sms']}", flush=True)

    def save():
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(record, indent=1, default=str))

    refmod = load(PROBLEM / "reference.py", "kimi_reference")
    cfg = refmod.build_config({} if cuda else CPU_SHAPE)
    torch.manual_seed(PARAM_SEED)
    with torch.device(DEVICE):
        oracle = refmod.Model(cfg).eval()
    sd = oracle.state_dict()

    def build(module_path: Path, name: str):
        module = load(module_path, name)
        model = module.Model(cfg)
        if tiles and hasattr(model, "tile_overrides"):
            model.tile_overrides.update(tiles)
        model.load_state_dict(sd, strict=True)
        return module, model.to(DEVICE).eval()

    models = {}
    for label, path in SOLUTIONS.items():
        entry: dict = {}
        record["solutions"][label] = entry
        try:
            t0 = time.time()
            module, model = build(path, f"kimi_{label}")
            models[label] = (module, model)
            # 1. phases at a short context, isolated then chained
            for mode in ("isolated", "chained"):
                ctx = 96 if cuda else 20
                hidden, state = make_inputs(refmod, cfg, ctx, 1)
                trace = reference_trace(refmod, oracle, hidden, clone_state(state))
                if label == "multikernel":  # its router launch only scores; the shared expert runs with the routed
                    for name in [n for n in trace if n.endswith(".moe_router")]:
                        trace[name.replace("moe_router", "moe_gate_up")]["act_shared"] = trace[name].pop("act_shared")
                checker = PhaseChecker(model, trace, state, cfg, isolate=(mode == "isolated"),
                                       state_in_place=(label == "megakernel"))
                with torch.no_grad():
                    if label == "megakernel":
                        run_phases_megakernel(model, hidden, state, checker)
                    else:
                        with MultiDriver(module, checker, phase_names(cfg)):
                            model.step(hidden, state)
                entry[f"phases_{mode}"] = checker.rows
                bad = checker.first_failure()
                worst = min(checker.rows, key=lambda r: r["min"])
                print(f"[{label}] phases ({mode}): {sum(r['ok'] for r in checker.rows)}/{len(checker.rows)} ok; "
                      f"worst {worst['phase']} {worst['min']:.6f}"
                      + (f"; FIRST FAILING PHASE: {bad['phase']} {bad['items']}" if bad else ""), flush=True)
                if bad and "rid_got" in bad:
                    print(f"    routing: got {bad['rid_got']} expected {bad['rid_expected']}", flush=True)
            entry["compile_and_phases_s"] = time.time() - t0
            save()
            # 2. whole steps against the reference
            contexts = [96 if cuda else 20] + ([] if args.quick else args.contexts)
            entry["steps"] = check_steps(refmod, oracle, model, cfg, contexts)
            for r in entry["steps"]:
                worst = min(((n, k, v) for n, d in list(r["first"].items()) + list(r["own_state"].items())
                             for k, v in d.items()), key=lambda t: t[2])
                print(f"[{label}] step ctx={r['context']}: fresh {'ok' if r['first_ok'] else 'FAIL'}, "
                      f"from own state {'ok' if r['own_state_ok'] else 'FAIL'}; worst {worst[0]} {worst[1]} "
                      f"{worst[2]:.5f}", flush=True)
            if label == "megakernel":
                entry["kernel"] = kernel_resources(module)
                entry["barrier_timeouts_after_steps"] = model.barrier_timeouts()
                print(f"[{label}] compiled: {entry['kernel']}; barrier timeouts so far: "
                      f"{entry['barrier_timeouts_after_steps']}", flush=True)
            save()
        except Exception as exc:  # noqa: BLE001 (report and go on to the next solution)
            entry["error"] = traceback.format_exc()
            print(f"[{label}] ERROR: {exc!r}\n{entry['error']}", flush=True)
            save()

    if "megakernel" in models and "multikernel" in models and not args.quick:
        try:
            r = race_check(refmod, models["megakernel"][1], models["multikernel"][1], cfg, args.race_steps)
            record["solutions"]["megakernel"]["races"] = r
            print(f"[megakernel] races: {r}", flush=True)
            b = sync_bisect(refmod, models["megakernel"][1], cfg)
            record["solutions"]["megakernel"]["sync_bisect"] = b
            print(f"[megakernel] one launch vs phase by phase, bitwise: "
                  + (b["skipped"] if "skipped" in b else "identical after every phase"
                     if b["first_divergent_phase"] is None else
                     f"FIRST DIVERGES AFTER {b['first_divergent_phase']} in {b['buffers']}")
                  + f" (barrier timeouts {b.get('barrier_timeouts', '-')})", flush=True)
        except Exception as exc:  # noqa: BLE001
            record["solutions"]["megakernel"]["races"] = {"error": traceback.format_exc()}
            print(f"[megakernel] race check ERROR: {exc!r}", flush=True)
        save()

    # 4-5. launches and speed, next to the baseline
    timing_contexts = [] if args.quick else args.contexts
    base_mod = load(PROBLEM / "baseline.py", "kimi_baseline")
    baseline = base_mod.Model(cfg)
    baseline.load_state_dict(sd, strict=True)
    baseline = baseline.to(DEVICE).eval()
    flush = torch.empty(512 * 2**20 if cuda else 1, dtype=torch.uint8, device=DEVICE)
    runners = {"baseline": baseline, **{k: m for k, (_, m) in models.items()}}
    for label, model in runners.items():
        entry = record["solutions"].setdefault(label, {})
        try:
            with torch.no_grad():
                entry["launches"] = count_launches(model, refmod, cfg)
                entry["timing"] = {}
                for ctx in timing_contexts:
                    t = time_steps(model, refmod, cfg, ctx, args.timed_steps, flush)
                    t["gbps"] = bytes_per_token(cfg, ctx) / (t["median_ms"] * 1e-3) / 1e9
                    entry["timing"][str(ctx)] = t
                    print(f"[{label}] ctx={ctx}: {t['median_ms']:.3f} ms/token (min {t['min_ms']:.3f}, max "
                          f"{t['max_ms']:.3f}, host {t['host_ms']:.3f}), {t['gbps']:.0f} GB/s", flush=True)
                    if label == "megakernel":
                        pt = phase_times(model, refmod, cfg, ctx)
                        t["phase_ms"] = pt
                        kinds: dict[str, float] = {}
                        for n, v in pt.items():
                            kinds[n.split(".")[-1]] = kinds.get(n.split(".")[-1], 0.0) + v
                        print("    phases alone (ms, summed over layers): " +
                              ", ".join(f"{k} {v:.3f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])),
                              flush=True)
        except Exception as exc:  # noqa: BLE001
            entry["timing_error"] = traceback.format_exc()
            print(f"[{label}] timing ERROR: {exc!r}", flush=True)
        save()
    if "megakernel" in models:
        record["solutions"]["megakernel"]["barrier_timeouts_total"] = models["megakernel"][1].barrier_timeouts()
    save()

    # the table
    print("\nsolution     phases iso chain   steps  races            launches  " +
          "  ".join(f"ms@{c:<6}" for c in timing_contexts) + "  speedup")
    base_t = record["solutions"].get("baseline", {}).get("timing", {})
    for label, e in record["solutions"].items():
        ph = " ".join(f"{sum(r['ok'] for r in e[k])}/{len(e[k])}" if k in e else "-"
                      for k in ("phases_isolated", "phases_chained"))
        steps = "-" if "steps" not in e else ("ok" if all(r["first_ok"] and r["own_state_ok"] for r in e["steps"])
                                              else "FAIL")
        races = e.get("races", {})
        bis = e.get("sync_bisect", {})
        race = "-" if not races or "error" in races else (
            "ok" if races["runs_differing"] == 0 and races["per_phase_bitwise_equal"] and races["barrier_timeouts"] == 0
            and bis.get("first_divergent_phase") is None
            else f"RACE {races['runs_differing']}/{races['runs']} eq={races['per_phase_bitwise_equal']} "
                 f"to={races['barrier_timeouts']}")
        ms = [e.get("timing", {}).get(str(c), {}).get("median_ms") for c in timing_contexts]
        sp = [base_t[str(c)]["median_ms"] / m for c, m in zip(timing_contexts, ms) if m and str(c) in base_t]
        speed = math.exp(sum(math.log(x) for x in sp) / len(sp)) if sp else None
        print(f"{label:12s} {ph:18s} {steps:6s} {race:16s} {str(e.get('launches', '-')):9s} " +
              "  ".join(f"{m:9.3f}" if m else f"{'-':>9s}" for m in ms) +
              (f"  {speed:.2f}x" if speed else "  -") + ("  ERROR" if "error" in e else ""))
    print(f"JSON: {out_path}")


if __name__ == "__main__":
    main()
