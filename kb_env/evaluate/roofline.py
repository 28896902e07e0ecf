"""peak_fraction: how close a measured time is to the roofline of the GPU it ran on."""

from __future__ import annotations

from ..hardware import GPUSpec


def roofline_time_s(flops: float, nbytes: float, gpu: GPUSpec, compute_dtype: str) -> tuple[float, str]:
    """The fastest time the roofline allows, and which ceiling sets it."""
    t_compute = flops / gpu.flops_per_s(compute_dtype)
    t_memory = nbytes / gpu.bandwidth()
    return max(t_compute, t_memory), ("compute-bound" if t_compute >= t_memory else "memory-bound")


def peak_fraction(flops: float, nbytes: float, time_ms: float, gpu: GPUSpec, compute_dtype: str) -> tuple[float, str]:
    """(roofline time over measured time, regime). 1.0 means running at the roofline."""
    t_roof, regime = roofline_time_s(flops, nbytes, gpu, compute_dtype)
    return t_roof / (time_ms * 1e-3), regime


def ridge_point(gpu: GPUSpec, compute_dtype: str) -> float:
    """Arithmetic intensity (FLOP/byte) above which a kernel is compute-bound on `gpu`."""
    return gpu.flops_per_s(compute_dtype) / gpu.bandwidth()
