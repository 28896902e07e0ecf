"""gelu_tanh(x @ w + bias) in one Triton kernel: a tiled float16 product with float32
accumulation, the bias and the GELU applied to the tile before its only write."""

import torch
import torch.nn as nn
import triton
import triton.language as tl

_GPU_CONFIGS = [
    triton.Config({"BM": 128, "BN": 256, "BK": 64, "GROUP": 8}, num_warps=8, num_stages=3),
    triton.Config({"BM": 256, "BN": 128, "BK": 64, "GROUP": 8}, num_warps=8, num_stages=3),
    triton.Config({"BM": 128, "BN": 128, "BK": 64, "GROUP": 8}, num_warps=8, num_stages=4),
    triton.Config({"BM": 128, "BN": 256, "BK": 32, "GROUP": 8}, num_warps=8, num_stages=4),
    triton.Config({"BM": 128, "BN": 128, "BK": 128, "GROUP": 8}, num_warps=8, num_stages=3),
]


@triton.jit
def _gemm_bias_gelu_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K,
                           stride_xm, stride_xk, stride_wk, stride_wn, stride_om, stride_on,
                           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
                           ALIGNED: tl.constexpr):
    if ALIGNED:  # rows start on 16-byte boundaries: lets the loads vectorise when K % 16 != 0
        stride_xm = tl.multiple_of(stride_xm, 8)
        stride_wk = tl.multiple_of(stride_wk, 8)
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BM)
    grid_n = tl.cdiv(N, BN)
    # Grouped ordering: neighbouring programs share rows of x, for L2 reuse.
    per_group = GROUP * grid_n
    first_m = (pid // per_group) * GROUP
    group_rows = min(grid_m - first_m, GROUP)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    row_ok = rm[:, None] < M
    col_ok = rn[None, :] < N
    x_ptrs = x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk
    w_ptrs = w_ptr + rk[:, None] * stride_wk + rn[None, :] * stride_wn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    k_full = (K // BK) * BK
    for _ in range(0, k_full, BK):  # whole K blocks: no K mask in the hot loop
        acc = tl.dot(tl.load(x_ptrs, mask=row_ok, other=0.0), tl.load(w_ptrs, mask=col_ok, other=0.0), acc)
        x_ptrs += BK * stride_xk
        w_ptrs += BK * stride_wk
    if k_full < K:  # the ragged tail
        k_ok = rk < K - k_full
        a = tl.load(x_ptrs, mask=row_ok & k_ok[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=k_ok[:, None] & col_ok, other=0.0)
        acc = tl.dot(a, b, acc)
    # Round the product to float16 first, as the unfused reference does.
    y = acc.to(tl.float16).to(tl.float32)
    y = y + tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
    inner = 0.7978845608028654 * (y + 0.044715 * y * y * y)
    tanh = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0
    out = 0.5 * y * (1.0 + tanh)
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :] * stride_on, out.to(tl.float16), mask=row_ok & col_ok)


_gpu_kernel = triton.autotune(configs=_GPU_CONFIGS, key=["M", "N", "K"])(_gemm_bias_gelu_kernel)


def gemm_bias_gelu(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    M, K = x.shape
    N = w.shape[1]
    out = torch.empty((M, N), dtype=torch.float16, device=x.device)
    if x.is_cuda and K % 64:
        # Zero-pad K to a multiple of 64: every row then starts 128-byte aligned and the K loop
        # has no ragged tail, which keeps the loads vectorised and pipelined. Costs one pass over
        # x and w (~5% of the product's time at K=1800); the padding adds zeros to the sum.
        pad = 64 - K % 64
        x = torch.nn.functional.pad(x, (0, pad))
        w = torch.nn.functional.pad(w, (0, 0, 0, pad))
        K += pad
    args = (x, w, bias, out, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
            out.stride(0), out.stride(1))
    aligned = x.stride(1) == 1 and w.stride(1) == 1 and x.stride(0) % 8 == 0 and w.stride(0) % 8 == 0
    if x.is_cuda:
        grid = lambda meta: (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]),)
        _gpu_kernel[grid](*args, ALIGNED=aligned)
    else:  # Triton's interpreter (CPU mode): small tiles
        grid = (triton.cdiv(M, 32) * triton.cdiv(N, 32),)
        _gemm_bias_gelu_kernel[grid](*args, BM=32, BN=32, BK=32, GROUP=4, ALIGNED=aligned)
    return out


class ModelNew(nn.Module):
    def __init__(self, K: int, N: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(K, N, dtype=torch.float16))
        self.bias = nn.Parameter(torch.empty(N, dtype=torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemm_bias_gelu(x, self.weight, self.bias)
