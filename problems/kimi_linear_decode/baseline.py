"""An optimized eager PyTorch decode step (the baseline the speedup is measured against).

Faster than the float32 reference the way a careful PyTorch engineer would make it: bf16
matmuls, the selected experts dequantized in one batch and run as one batched product, the
shared expert batched with them, no Python loop over experts. It still materializes every
dequantized bf16 weight (int4 read, bf16 written, bf16 read again) and the MLA keys and values
for every cached position: fusing the int4 unpack into the GEMVs and absorbing the MLA
up-projection are left to the candidate.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-6


class W4(nn.Module):
    """The W4A16 buffers of one (in, out) weight, or `experts` of them."""

    def __init__(self, n_in: int, n_out: int, group: int, experts: int | None = None):
        super().__init__()
        lead = (experts,) if experts else ()
        self.register_buffer("w_q", torch.empty(*lead, n_in // 2, n_out, dtype=torch.uint8))
        self.register_buffer("scales", torch.empty(*lead, n_in // group, n_out, dtype=torch.bfloat16))
        self.register_buffer("zeros", torch.empty(*lead, n_in // group, n_out, dtype=torch.bfloat16))


def dequant(w_q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """bf16 weight (..., in, out) from the packed int4 values."""
    q = torch.stack([w_q & 0xF, w_q >> 4], dim=-2).reshape(*w_q.shape[:-2], 2 * w_q.shape[-2], w_q.shape[-1])
    group = q.shape[-2] // scales.shape[-2]
    return (q.to(torch.bfloat16) - zeros.repeat_interleave(group, dim=-2)) * scales.repeat_interleave(group, dim=-2)


def linear(x: torch.Tensor, w: W4) -> torch.Tensor:
    return x @ dequant(w.w_q, w.scales, w.zeros)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + EPS) * weight.float()).to(torch.bfloat16)


def rope(x: torch.Tensor, pos: int, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    cos, sin = torch.cos(pos * inv), torch.sin(pos * inv)
    xf = x.float()
    x0, x1 = xf[..., 0::2], xf[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2).to(x.dtype)


class KDA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, hk = cfg.hidden, cfg.kda_heads * cfg.kda_head_dim
        self.cfg = cfg
        self.q_proj, self.k_proj, self.v_proj, self.g_proj = (W4(d, hk, cfg.group) for _ in range(4))
        self.o_proj = W4(hk, d, cfg.group)
        self.beta_proj = nn.Linear(d, cfg.kda_heads, bias=False, dtype=torch.bfloat16)
        self.conv_w = nn.Parameter(torch.empty(3, hk, cfg.short_conv, dtype=torch.bfloat16))

    def forward(self, x, st):
        cfg = self.cfg
        h, dk = cfg.kda_heads, cfg.kda_head_dim
        cur = torch.stack([linear(x, p) for p in (self.q_proj, self.k_proj, self.v_proj)])  # (3, hk)
        windows = torch.cat([torch.stack([st["cq"], st["ck"], st["cv"]]), cur[:, None]], dim=1)  # (3, 4, hk)
        feats = F.silu((windows.float() * self.conv_w.float().transpose(1, 2)).sum(1))  # (3, hk)
        q, k, v = feats.reshape(3, h, dk).unbind(0)
        q = q * dk**-0.5
        g = -F.softplus(linear(x, self.g_proj).float()).reshape(h, dk)
        beta = torch.sigmoid(self.beta_proj(x).float())
        S = st["S"] * torch.exp(g)[:, :, None]
        pred = (S * k[:, :, None]).sum(1)
        S = S + beta[:, None, None] * k[:, :, None] * (v - pred)[:, None, :]
        o = (S * q[:, :, None]).sum(1).to(torch.bfloat16)
        new = {"S": S, "cq": windows[0, 1:], "ck": windows[1, 1:], "cv": windows[2, 1:]}
        return linear(o.reshape(-1), self.o_proj), new


class MLA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, h = cfg.hidden, cfg.mla_heads
        self.cfg = cfg
        self.q_proj = W4(d, h * (cfg.qk_nope + cfg.qk_rope), cfg.group)
        self.kv_a = W4(d, cfg.kv_lora + cfg.qk_rope, cfg.group)
        self.kv_b = W4(cfg.kv_lora, h * (cfg.qk_nope + cfg.v_head), cfg.group)
        self.o_proj = W4(h * cfg.v_head, d, cfg.group)

    def forward(self, x, st):
        cfg = self.cfg
        h = cfg.mla_heads
        pos = st["c_kv"].shape[0]
        q = linear(x, self.q_proj).reshape(h, cfg.qk_nope + cfg.qk_rope)
        q_nope, q_rope = q[:, :cfg.qk_nope], rope(q[:, cfg.qk_nope:], pos, cfg.rope_theta)
        kv = linear(x, self.kv_a)
        c_kv = torch.cat([st["c_kv"], kv[None, :cfg.kv_lora]])
        kr = torch.cat([st["k_rope"], rope(kv[cfg.kv_lora:], pos, cfg.rope_theta)[None]])
        kvb = linear(c_kv, self.kv_b).reshape(-1, h, cfg.qk_nope + cfg.v_head)
        k_nope, v = kvb[..., :cfg.qk_nope], kvb[..., cfg.qk_nope:]
        scores = (torch.einsum("hd,thd->ht", q_nope, k_nope).float() + (q_rope @ kr.t()).float()) \
            * (cfg.qk_nope + cfg.qk_rope) ** -0.5
        o = torch.einsum("ht,thd->hd", torch.softmax(scores, dim=-1).to(torch.bfloat16), v)
        return linear(o.reshape(-1), self.o_proj), {"c_kv": c_kv, "k_rope": kr}


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, i, e = cfg.hidden, cfg.moe_inter, cfg.n_experts
        self.cfg = cfg
        self.router = nn.Linear(d, e, bias=False, dtype=torch.bfloat16)
        self.gate, self.up, self.down = W4(d, i, cfg.group, e), W4(d, i, cfg.group, e), W4(i, d, cfg.group, e)
        self.s_gate, self.s_up = W4(d, i, cfg.group, cfg.n_shared), W4(d, i, cfg.group, cfg.n_shared)
        self.s_down = W4(i, d, cfg.group, cfg.n_shared)

    def forward(self, x):
        cfg = self.cfg
        probs = torch.softmax(self.router(x).float(), dim=-1)
        top_p, top_i = torch.topk(probs, cfg.n_active)
        weights = torch.cat([top_p / top_p.sum() * cfg.routed_scaling, top_p.new_ones(cfg.n_shared)])

        def batch(routed: W4, shared: W4) -> torch.Tensor:  # selected experts and the shared ones, dequantized at once
            return dequant(torch.cat([routed.w_q[top_i], shared.w_q]), torch.cat([routed.scales[top_i], shared.scales]),
                           torch.cat([routed.zeros[top_i], shared.zeros]))

        xs = x.expand(cfg.n_active + cfg.n_shared, 1, -1)
        act = F.silu(torch.bmm(xs, batch(self.gate, self.s_gate))) * torch.bmm(xs, batch(self.up, self.s_up))
        out = torch.bmm(act, batch(self.down, self.s_down))[:, 0]  # (experts, d)
        return (weights[:, None] * out.float()).sum(0).to(torch.bfloat16)


class Block(nn.Module):
    def __init__(self, cfg, kind):
        super().__init__()
        self.attn_norm = nn.Parameter(torch.empty(cfg.hidden, dtype=torch.bfloat16))
        self.moe_norm = nn.Parameter(torch.empty(cfg.hidden, dtype=torch.bfloat16))
        self.attn = KDA(cfg) if kind == "K" else MLA(cfg)
        self.moe = MoE(cfg)

    def forward(self, x, st):
        a, new = self.attn(rmsnorm(x, self.attn_norm), st)
        h = x + a
        return h + self.moe(rmsnorm(h, self.moe_norm)), new


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(Block(cfg, kind) for kind in cfg.pattern)

    @torch.no_grad()
    def step(self, hidden, state):
        x, new_state = hidden, []
        for block, st in zip(self.blocks, state):
            x, new = block(x, st)
            new_state.append(new)
        return x, new_state
