"""The rules an imported problem is graded under, derived from what its reference does: which
torch ops a candidate may not call, the compute dtype of its roofline, and its regime."""

from __future__ import annotations

from typing import Literal

from ..evaluate.oprules import STRUCTURAL_OPS
from ..evaluate.roofline import ridge_point, roofline_time_s
from ..hardware import by_key
from ..problem import Forbidden

ForbidOps = Literal["reference", "all", "none"]
FORBIDDEN_IMPORTS = ["cupy", "numba", "jax", "ctypes", "torch._inductor"]  # as the shipped problems

# Ops that do the same work under other names (other devices, backends or entry points): a
# reference that runs one forbids them all, so the CPU's name for it is no loophole on a GPU.
_FAMILIES = {
    "matrix products": "mm addmm bmm baddbmm addbmm matmul linear einsum mv addmv dot vdot addr outer "
                       "tensordot _scaled_mm _addmm_activation",
    "convolutions": "convolution _convolution _convolution_mode conv1d conv2d conv3d conv_transpose1d "
                    "conv_transpose2d conv_transpose3d cudnn_convolution cudnn_convolution_transpose "
                    "mkldnn_convolution miopen_convolution _slow_conv2d_forward slow_conv3d_forward "
                    "slow_conv_transpose2d slow_conv_transpose3d slow_conv_dilated2d slow_conv_dilated3d "
                    "_nnpack_spatial_convolution thnn_conv2d",
    "attention": "scaled_dot_product_attention _scaled_dot_product_flash_attention "
                 "_scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_efficient_attention "
                 "_scaled_dot_product_cudnn_attention _scaled_dot_product_attention_math "
                 "_scaled_dot_product_fused_attention_overrideable _flash_attention_forward "
                 "_efficient_attention_forward",
    "softmax": "_softmax _log_softmax softmax log_softmax _safe_softmax",
    "normalization": "native_layer_norm layer_norm native_batch_norm _native_batch_norm_legit "
                     "_native_batch_norm_legit_no_training batch_norm _batch_norm_impl_index cudnn_batch_norm "
                     "miopen_batch_norm native_group_norm group_norm instance_norm rms_norm _fused_rms_norm",
    "recurrent layers": "lstm gru rnn_tanh rnn_relu mkldnn_rnn_layer _cudnn_rnn miopen_rnn _thnn_fused_lstm_cell "
                        "_thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell",
    "pooling": "max_pool1d max_pool2d max_pool3d max_pool1d_with_indices max_pool2d_with_indices "
               "max_pool3d_with_indices mkldnn_max_pool2d mkldnn_max_pool3d avg_pool1d avg_pool2d avg_pool3d "
               "adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d _adaptive_avg_pool2d "
               "_adaptive_avg_pool3d mkldnn_adaptive_avg_pool2d adaptive_max_pool1d adaptive_max_pool2d "
               "adaptive_max_pool3d",
    "scans": "cumsum cumprod cummax cummin logcumsumexp _logcumsumexp",
}
FAMILIES = {name: frozenset(f"aten::{op}" for op in ops.split()) for name, ops in _FAMILIES.items()}


def reference_compute_ops(recorded: list[str]) -> list[str]:
    """The compute ops the reference ran (structural ones left out), widened to their families."""
    ops = {op for op in recorded if op not in STRUCTURAL_OPS and op.startswith("aten::")}
    for family in FAMILIES.values():
        if ops & family:
            ops |= family
    return sorted(ops)


def forbidden(recorded: list[str], mode: ForbidOps) -> Forbidden:
    """`reference` (the default): a candidate may not call the torch ops its reference runs (nor
    their other names); `all`: nor any torch compute op; `none`: only the forbidden imports, as
    KernelBench itself grades (on a GPU the kernel-time share check still applies)."""
    if mode == "none":
        return Forbidden(imports=FORBIDDEN_IMPORTS)
    ops = reference_compute_ops(recorded)
    return Forbidden(imports=FORBIDDEN_IMPORTS, torch_ops=ops, allowed_torch_ops=[] if mode == "all" else None)


_DTYPES = ("float64", "float32", "float16", "bfloat16")


def compute_dtype(dtype_bytes: dict[str, int]) -> str:
    """The floating dtype holding most of the inputs', parameters' and buffers' bytes (float32
    when there is none). float32 is not TF32: the tolerance table does not admit TF32 products."""
    known = {d: n for d, n in dtype_bytes.items() if d in _DTYPES}
    return max(known, key=lambda d: (known[d], d)) if known else "float32"


REGIME_GPUS = ("h100-sxm", "h200")
REGIME_MARGIN = 1.5


def regime(flops: float, nbytes: float, dtype: str) -> str | None:
    """memory-bound or compute-bound when the H100 and H200 rows agree and the intensity is at
    least REGIME_MARGIN from both ridges; None for a borderline problem."""
    seen = set()
    for key in REGIME_GPUS:
        gpu = by_key(key)
        intensity, ridge = flops / nbytes, ridge_point(gpu, dtype)
        if intensity > 0 and max(intensity / ridge, ridge / intensity) < REGIME_MARGIN:
            return None
        seen.add(roofline_time_s(flops, nbytes, gpu, dtype)[1])
    return seen.pop() if len(seen) == 1 else None
