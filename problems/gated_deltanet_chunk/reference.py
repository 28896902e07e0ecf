"""Gated DeltaNet, chunked prefill (reference).

Per sequence and head, a state S [dk, dv] (float32) is carried over the tokens t = 1..T:

    S <- exp(g_t) * S                                  (g_t <= 0: a scalar decay per head and token)
    S <- S + beta_t * k_t (v_t - S^T k_t)^T            (the delta rule)
    o_t = S^T q_t

with q_t, k_t L2-normalised (q_t also scaled by dk^-0.5) and beta_t = sigmoid(b_t), starting
from the given state h0; the outputs are o and the final state.

This reference computes it 64 tokens at a time (the chunked form a GPU kernel uses): within a
chunk the delta rule is a unit lower-triangular system (I + A) X = B whose solution gives every
token's correction at once, and only the state crosses chunk boundaries. Its products take
bfloat16 operands and accumulate in float32, as tensor cores do (`mm`); the state and everything
else stay float32. `recurrence` is the token-by-token definition above: in float64 it is the
oracle the tolerance is calibrated against, and its arithmetic is what the FLOPs formula counts.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

CHUNK = 64
EPS = 1e-6  # inside the L2 norm's square root


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + EPS)


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with bfloat16 operands and float32 accumulation (a tensor-core product)."""
    return torch.matmul(a.to(torch.bfloat16).float(), b.to(torch.bfloat16).float())


class Model(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, b: torch.Tensor,
                h0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, seq_len, heads, dk = q.shape
        dv = v.shape[-1]
        q = l2norm(q.float()) * dk ** -0.5
        k = l2norm(k.float())
        beta = torch.sigmoid(b.float())
        # Pad to whole chunks: padded tokens have k = v = 0 and g = 0, so they change nothing.
        pad = -seq_len % CHUNK
        n = (seq_len + pad) // CHUNK

        def chunks(x: torch.Tensor) -> torch.Tensor:  # [batch, T, heads, ...] -> [batch, heads, n, CHUNK, ...]
            x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
            return x.reshape(batch, n, CHUNK, heads, *x.shape[3:]).transpose(1, 3).transpose(2, 3)

        q, k, v, g, beta = chunks(q), chunks(k), chunks(v.float()), chunks(g.float()), chunks(beta)
        gc = g.cumsum(-1)  # decay from the chunk's start, through each token: [batch, heads, n, CHUNK]
        pos = torch.arange(CHUNK, device=q.device)
        causal = pos[:, None] >= pos[None, :]  # token i sees tokens j <= i
        # exp(gc_i - gc_j) for j <= i (at most 1), 0 above the diagonal.
        decay = torch.exp(torch.where(causal, gc[..., :, None] - gc[..., None, :], float("-inf")))
        strict = (pos[:, None] > pos[None, :]).float()
        a = beta[..., None] * mm(k, k.transpose(-1, -2)) * decay * strict
        eye = torch.eye(CHUNK, device=q.device)
        w = torch.linalg.solve_triangular(eye + a, k * (beta * gc.exp())[..., None], upper=False, unitriangular=True)
        u = torch.linalg.solve_triangular(eye + a, v * beta[..., None], upper=False, unitriangular=True)
        attn = mm(q, k.transpose(-1, -2)) * decay  # within-chunk attention, j <= i
        q_in = q * gc.exp()[..., None]  # queries against the state at the chunk's start
        k_out = k * (gc[..., -1:] - gc).exp()[..., None]  # keys decayed to the chunk's end
        state = h0.float()
        out = []
        for c in range(n):
            delta = u[:, :, c] - mm(w[:, :, c], state)  # each token's correction, beta included
            out.append(mm(q_in[:, :, c], state) + mm(attn[:, :, c], delta))
            state = state * gc[:, :, c, -1].exp()[..., None, None] + mm(k_out[:, :, c].transpose(-1, -2), delta)
        o = torch.stack(out, 2).permute(0, 2, 3, 1, 4).reshape(batch, n * CHUNK, heads, dv)[:, :seq_len]
        return o.to(torch.bfloat16).contiguous(), state


def recurrence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, b: torch.Tensor,
               h0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition, one token at a time, in the inputs' dtype."""
    dk = q.shape[-1]
    q = l2norm(q) * dk ** -0.5
    k = l2norm(k)
    beta = torch.sigmoid(b)
    state = h0
    out = []
    for t in range(q.shape[1]):
        state = state * torch.exp(g[:, t])[..., None, None]
        kt = k[:, t]
        pred = torch.einsum("bhkv,bhk->bhv", state, kt)
        state = state + kt[..., :, None] * (beta[:, t, :, None] * (v[:, t] - pred))[..., None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", state, q[:, t]))
    return torch.stack(out, 1), state


def oracle(model: nn.Module, inputs: list) -> list[torch.Tensor]:
    """The recurrence in float64: an independent path (token by token, no chunks, no rounding)."""
    return list(recurrence(*[x.double() for x in inputs]))


def counted_forward(model: nn.Module, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the FLOPs formula counts: the recurrence (the least arithmetic), in float32."""
    o, state = recurrence(*[x.float() for x in inputs])
    return o.to(torch.bfloat16), state


# The recurrence's work is one identical step per token: the formula test traces it at a few
# values of this shape variable (a trace of 8192 steps would take minutes).
COUNTED_STEPS = "seq_len"


def get_inputs(batch: int = 4, seq_len: int = 8192, heads: int = 16, dk: int = 128,
               dv: int = 128) -> list[torch.Tensor]:
    q = torch.randn(batch, seq_len, heads, dk)
    # Keys share a per-(sequence, head) direction of random strength: correlated keys make the
    # delta rule's corrections interact (the triangular system is far from the identity).
    common = torch.randn(batch, 1, heads, dk) * torch.rand(batch, 1, heads, 1) * 2
    k = torch.randn(batch, seq_len, heads, dk) + common
    v = torch.randn(batch, seq_len, heads, dv) * torch.empty(batch, 1, heads, 1).uniform_(0.5, 2.0)
    # Log-decays in three regimes, by (sequence, head): long memory (g ~ -1e-4 .. -2.5e-3),
    # medium (-7e-3 .. -0.14) and short (-0.14 .. -4.5).
    regime = torch.arange(batch * heads).reshape(batch, 1, heads) % 3
    lo = torch.tensor([-9.0, -5.0, -2.0])[regime]
    hi = torch.tensor([-6.0, -2.0, 1.5])[regime]
    g = -torch.exp(lo + (hi - lo) * torch.rand(batch, seq_len, heads))
    b = torch.randn(batch, seq_len, heads) * 2  # beta = sigmoid(b): from ~0.01 to ~0.99
    h0 = torch.randn(batch, heads, dk, dv) * 0.5
    return [q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), g, b.to(torch.bfloat16), h0]


def get_init_inputs(batch: int = 4, seq_len: int = 8192, heads: int = 16, dk: int = 128, dv: int = 128) -> list:
    return []
