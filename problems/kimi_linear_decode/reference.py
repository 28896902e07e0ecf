"""Batch-1 decode of one repeating unit of Kimi-Linear-48B-A3B with W4A16 weights (reference).

The unit is four layers in the pattern [KDA, KDA, KDA, MLA], each followed by a
mixture-of-experts FFN, with pre-norms and residuals:

    h   = x + attn(rmsnorm(x, attn_norm))
    out = h + moe(rmsnorm(h, moe_norm))

`Model(cfg).step(hidden, state) -> (hidden, state)` decodes one token: `hidden` is a bf16
vector of `cfg.hidden`; `state` is a list of one dict per layer, KDA {"S", "cq", "ck", "cv"}
and MLA {"c_kv", "k_rope"}. This reference is the correctness oracle: it dequantizes every
weight it uses and computes in float32, casting only what it returns (the next hidden in bf16,
the states in their own dtypes).

W4A16 linear (every large projection and every expert matrix): an (in, out) weight quantized
along `in` in asymmetric groups of `cfg.group`: `w_q` uint8 (in/2, out) holds two 4-bit values
per byte along `in` (even index in the low nibble, odd in the high), `scales` and `zeros` bf16
(in/group, out); w[k, n] = (q[k, n] - zeros[k // group, n]) * scales[k // group, n]; y = x @ w.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-6  # RMSNorm epsilon, computed in float32


@dataclass
class Config:
    """The unit's configuration; a solution's `Model(cfg)` receives this object. (No
    `from __future__ import annotations` in this file: the harness runs it as a module that is not
    in sys.modules, where a dataclass cannot resolve string annotations.)"""

    hidden: int = 2304
    kda_heads: int = 32
    kda_head_dim: int = 128
    short_conv: int = 4
    mla_heads: int = 32
    kv_lora: int = 512
    qk_nope: int = 128
    qk_rope: int = 64
    v_head: int = 128
    rope_theta: float = 10000.0
    n_experts: int = 64
    n_active: int = 8
    n_shared: int = 1
    moe_inter: int = 1024
    routed_scaling: float = 2.446
    group: int = 128
    pattern: tuple[str, ...] = ("K", "K", "K", "M")
    dtype: torch.dtype = torch.bfloat16


def build_config(shape: dict[str, int]) -> Config:
    """The configuration of one graded shape (the GPU shapes are the real unit; the CPU shapes
    shrink widths, heads and experts so CI runs the same math under Triton's interpreter)."""
    return Config(hidden=shape.get("hidden", 2304), kda_heads=shape.get("heads", 32), mla_heads=shape.get("heads", 32),
                  kv_lora=shape.get("kv_lora", 512), n_experts=shape.get("experts", 64),
                  n_active=shape.get("active", 8), moe_inter=shape.get("moe_inter", 1024))


# ----- W4A16 weights -------------------------------------------------------------------------------
def quantize_w4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(w_q, scales, zeros) of an (in, out) weight: per-group min/max, scale = (max - min) / 15,
    zero = round(-min / scale) clamped to 0..15, q = round(w / scale + zero) clamped to 0..15."""
    n_in, n_out = w.shape
    wg = w.float().reshape(n_in // group, group, n_out)
    lo, hi = wg.amin(dim=1), wg.amax(dim=1)
    scale = ((hi - lo) / 15).clamp_min(1e-8)
    zero = torch.round(-lo / scale).clamp(0, 15)
    q = torch.round(wg / scale[:, None, :] + zero[:, None, :]).clamp(0, 15).to(torch.uint8).reshape(n_in, n_out)
    w_q = q[0::2] | (q[1::2] << 4)
    return w_q, scale.to(torch.bfloat16), zero.to(torch.bfloat16)


def unpack_w4(w_q: torch.Tensor) -> torch.Tensor:
    """uint8 (..., in/2, out) -> the 4-bit values (..., in, out) as uint8."""
    low, high = w_q & 0xF, w_q >> 4
    return torch.stack([low, high], dim=-2).reshape(*w_q.shape[:-2], 2 * w_q.shape[-2], w_q.shape[-1])


def dequant_w4(w_q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """The float32 weight (..., in, out)."""
    group = 2 * w_q.shape[-2] // scales.shape[-2]
    q = unpack_w4(w_q).float()
    return (q - zeros.float().repeat_interleave(group, dim=-2)) * scales.float().repeat_interleave(group, dim=-2)


class W4Linear(nn.Module):
    """An (in, out) W4A16 weight, `experts` of them stacked on a leading dimension if given."""

    def __init__(self, n_in: int, n_out: int, group: int, experts: int | None = None, std: float = 0.02):
        super().__init__()
        packs = [quantize_w4(torch.randn(n_in, n_out) * std, group) for _ in range(experts or 1)]
        stack = (lambda i: torch.stack([p[i] for p in packs])) if experts else (lambda i: packs[0][i])
        self.register_buffer("w_q", stack(0))
        self.register_buffer("scales", stack(1))
        self.register_buffer("zeros", stack(2))

    def weight(self, expert: int | None = None) -> torch.Tensor:
        if expert is None:
            return dequant_w4(self.w_q, self.scales, self.zeros)
        return dequant_w4(self.w_q[expert], self.scales[expert], self.zeros[expert])


def rmsnorm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS) * weight.float()


def rope(x: torch.Tensor, pos: int, theta: float) -> torch.Tensor:
    """Rotary embedding on interleaved pairs (2i, 2i+1) of the last dimension, at position `pos`."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    ang = pos * inv
    cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)


# ----- layers ---------------------------------------------------------------------------------
class KDA(nn.Module):
    """Kimi Delta Attention, one token: gated delta rule with a per-channel decay."""

    def __init__(self, cfg: Config):
        super().__init__()
        d, hk = cfg.hidden, cfg.kda_heads * cfg.kda_head_dim
        self.cfg = cfg
        self.q_proj, self.k_proj, self.v_proj, self.g_proj = (W4Linear(d, hk, cfg.group) for _ in range(4))
        self.o_proj = W4Linear(hk, d, cfg.group)
        self.beta_proj = nn.Linear(d, cfg.kda_heads, bias=False, dtype=torch.bfloat16)
        nn.init.normal_(self.beta_proj.weight, std=0.02)
        self.conv_w = nn.Parameter((torch.randn(3, hk, cfg.short_conv) * 0.15).to(torch.bfloat16))

    def forward(self, x: torch.Tensor, st: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg = self.cfg
        h, dk = cfg.kda_heads, cfg.kda_head_dim
        new: dict[str, torch.Tensor] = {}
        feats = []
        for c, (name, proj) in enumerate((("cq", self.q_proj), ("ck", self.k_proj), ("cv", self.v_proj))):
            cur = x @ proj.weight()  # (h*dk,)
            window = torch.cat([st[name].float(), cur[None]], dim=0)  # [3 previous values, current]
            feats.append(F.silu((window * self.conv_w[c].float().t()).sum(0)))
            new[name] = window[1:].to(st[name].dtype)
        q, k, v = (f.reshape(h, dk) for f in feats)
        q = q * dk**-0.5
        g = -F.softplus(x @ self.g_proj.weight()).reshape(h, dk)
        beta = torch.sigmoid(x @ self.beta_proj.weight.float().t())  # (h,)
        S = st["S"].float() * torch.exp(g)[:, :, None]  # (h, dk, dv)
        pred = torch.einsum("hkv,hk->hv", S, k)
        S = S + beta[:, None, None] * k[:, :, None] * (v - pred)[:, None, :]
        o = torch.einsum("hkv,hk->hv", S, q)
        new["S"] = S.to(st["S"].dtype)
        return o.reshape(-1) @ self.o_proj.weight(), new


class MLA(nn.Module):
    """Multi-head latent attention, one token, over a latent cache (keys and values rebuilt from it)."""

    def __init__(self, cfg: Config):
        super().__init__()
        d, h = cfg.hidden, cfg.mla_heads
        self.cfg = cfg
        self.q_proj = W4Linear(d, h * (cfg.qk_nope + cfg.qk_rope), cfg.group)
        self.kv_a = W4Linear(d, cfg.kv_lora + cfg.qk_rope, cfg.group)
        self.kv_b = W4Linear(cfg.kv_lora, h * (cfg.qk_nope + cfg.v_head), cfg.group)
        self.o_proj = W4Linear(h * cfg.v_head, d, cfg.group)

    def forward(self, x: torch.Tensor, st: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg = self.cfg
        h = cfg.mla_heads
        pos = st["c_kv"].shape[0]  # the new token's position: the current cache length
        q = (x @ self.q_proj.weight()).reshape(h, cfg.qk_nope + cfg.qk_rope)
        q_nope, q_rope = q[:, :cfg.qk_nope], rope(q[:, cfg.qk_nope:], pos, cfg.rope_theta)
        kv = x @ self.kv_a.weight()
        c, k_rope = kv[:cfg.kv_lora], rope(kv[cfg.kv_lora:], pos, cfg.rope_theta)
        c_kv = torch.cat([st["c_kv"], c.to(st["c_kv"].dtype)[None]])
        kr = torch.cat([st["k_rope"], k_rope.to(st["k_rope"].dtype)[None]])
        kvb = (c_kv.float() @ self.kv_b.weight()).reshape(-1, h, cfg.qk_nope + cfg.v_head)
        k_nope, v = kvb[..., :cfg.qk_nope], kvb[..., cfg.qk_nope:]
        scores = (torch.einsum("hd,thd->ht", q_nope, k_nope) + q_rope @ kr.float().t()) \
            * (cfg.qk_nope + cfg.qk_rope) ** -0.5
        o = torch.einsum("ht,thd->hd", torch.softmax(scores, dim=-1), v)
        return o.reshape(-1) @ self.o_proj.weight(), {"c_kv": c_kv, "k_rope": kr}


class MoE(nn.Module):
    """Softmax router, top-k renormalized and scaled, SiLU-gated experts plus a shared expert."""

    def __init__(self, cfg: Config):
        super().__init__()
        d, i, e = cfg.hidden, cfg.moe_inter, cfg.n_experts
        self.cfg = cfg
        self.router = nn.Linear(d, e, bias=False, dtype=torch.bfloat16)
        nn.init.normal_(self.router.weight, std=0.02)
        self.gate, self.up = W4Linear(d, i, cfg.group, experts=e), W4Linear(d, i, cfg.group, experts=e)
        self.down = W4Linear(i, d, cfg.group, experts=e)
        self.s_gate = W4Linear(d, i, cfg.group, experts=cfg.n_shared)
        self.s_up = W4Linear(d, i, cfg.group, experts=cfg.n_shared)
        self.s_down = W4Linear(i, d, cfg.group, experts=cfg.n_shared)

    @staticmethod
    def expert(x: torch.Tensor, gate: W4Linear, up: W4Linear, down: W4Linear, e: int) -> torch.Tensor:
        return (F.silu(x @ gate.weight(e)) * (x @ up.weight(e))) @ down.weight(e)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        probs = torch.softmax(x @ self.router.weight.float().t(), dim=-1)
        top_p, top_i = torch.topk(probs, cfg.n_active)
        weights = top_p / top_p.sum() * cfg.routed_scaling
        y = sum(w * self.expert(x, self.gate, self.up, self.down, int(e)) for w, e in zip(weights, top_i))
        for s in range(cfg.n_shared):
            y = y + self.expert(x, self.s_gate, self.s_up, self.s_down, s)
        return y


class Block(nn.Module):
    def __init__(self, cfg: Config, kind: str):
        super().__init__()
        self.attn_norm = nn.Parameter(torch.ones(cfg.hidden, dtype=torch.bfloat16))
        self.moe_norm = nn.Parameter(torch.ones(cfg.hidden, dtype=torch.bfloat16))
        self.attn = KDA(cfg) if kind == "K" else MLA(cfg)
        self.moe = MoE(cfg)

    def forward(self, x: torch.Tensor, st: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        a, new = self.attn(rmsnorm(x, self.attn_norm), st)
        h = x + a
        return h + self.moe(rmsnorm(h, self.moe_norm)), new


class Model(nn.Module):
    """One repeating unit; `step` decodes one token."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(Block(cfg, kind) for kind in cfg.pattern)

    @torch.no_grad()
    def step(self, hidden: torch.Tensor, state: list[dict[str, torch.Tensor]]
             ) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        x = hidden.float()
        new_state = []
        for block, st in zip(self.blocks, state):
            x, new = block(x, st)
            new_state.append(new)
        return x.to(hidden.dtype), new_state

    def forward(self, hidden: torch.Tensor, state: list[dict[str, torch.Tensor]]):
        return self.step(hidden, state)


# ----- inputs: a token and a pre-filled state -----------------------------------------------------
def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device=torch.get_default_device()).manual_seed(seed)


def init_token(cfg: Config, seed: int) -> torch.Tensor:
    """A hidden vector (bf16) on the default device, drawn from `seed`."""
    g = _generator(seed)
    return torch.randn(cfg.hidden, generator=g, device=g.device).to(cfg.dtype)


def init_state(cfg: Config, context: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """A decode state as if `context` tokens came before: KDA states and conv windows, and MLA
    caches of `context` rows (rope keys stored rotated), drawn from `seed` on the default device."""
    g = _generator(seed + 1)
    dev, hk = g.device, cfg.kda_heads * cfg.kda_head_dim
    out: list[dict[str, torch.Tensor]] = []
    for kind in cfg.pattern:
        if kind == "K":
            out.append({"S": torch.randn(cfg.kda_heads, cfg.kda_head_dim, cfg.kda_head_dim, generator=g, device=dev) * 0.05,
                        **{n: torch.randn(cfg.short_conv - 1, hk, generator=g, device=dev).to(cfg.dtype)
                           for n in ("cq", "ck", "cv")}})
        else:
            out.append({"c_kv": torch.randn(context, cfg.kv_lora, generator=g, device=dev).to(cfg.dtype),
                        "k_rope": torch.randn(context, cfg.qk_rope, generator=g, device=dev).to(cfg.dtype)})
    return out


# ----- the harness's hooks (kb_env): a shape's config, its inputs under the harness's seed ------
def get_init_inputs(**shape: int) -> list:
    return [build_config(shape)]


def get_inputs(**shape: int) -> list:
    """[hidden, state] for one step at `shape["context"]`, from the harness's seeded generator."""
    cfg = build_config(shape)
    seed = int(torch.randint(0, 2**31 - 1, (1,), device="cpu"))
    return [init_token(cfg, seed), init_state(cfg, shape["context"], seed)]
