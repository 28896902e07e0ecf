"""The GPU table (kb_env.hardware) and the roofline (kb_env.evaluate.roofline): device names as
torch reports them map to the right row, and peak_fraction / regime follow from the ceilings."""

from __future__ import annotations

import pytest

from kb_env.evaluate.roofline import peak_fraction, ridge_point, roofline_time_s
from kb_env.hardware import GPUSpec, Measured, by_key, gpu_table, lookup

# torch.cuda.get_device_name() strings as real cards report them
NAMES = {
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H200": "h200",
    "NVIDIA A100-SXM4-40GB": "a100-40gb",
    "NVIDIA A100-PCIE-40GB": "a100-40gb",
    "NVIDIA A100-SXM4-80GB": "a100",
    "NVIDIA A100 80GB PCIe": "a100",
    "NVIDIA GeForce RTX 4090": "rtx-4090",
    "NVIDIA L40S": "l40s",
    "NVIDIA B200": "b200",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": "rtx-pro-6000-blackwell",
    "NVIDIA GeForce RTX 3090": "rtx-3090",
}


@pytest.mark.parametrize("name, key", NAMES.items())
def test_device_names_map_to_their_rows(name, key):
    row = lookup(name)
    assert row is not None, name
    assert row.key == key


@pytest.mark.parametrize("name, key", [("nvidia h100 80gb hbm3", "h100-sxm"), ("NVIDIA H100 PCIE", "h100-pcie")])
def test_lookup_is_case_insensitive(name, key):
    row = lookup(name)
    assert row is not None and row.key == key


@pytest.mark.parametrize("name", ["Tesla T4", "AMD Instinct MI300X", "", "cpu", "NVIDIA GeForce GTX 1080"])
def test_unknown_device_is_none(name):
    assert lookup(name) is None


def test_every_row_has_bandwidth_and_the_common_peaks():
    rows = gpu_table()
    assert len(rows) >= len(set(NAMES.values()))
    assert len({r.key for r in rows}) == len(rows), "keys are unique"
    for row in rows:
        assert row.bandwidth() > 0
        for dtype in ("float32", "float16", "bfloat16"):
            assert row.flops_per_s(dtype) > 0, (row.key, dtype)
        # tensor-core half precision is never slower than plain fp32
        assert row.flops_per_s("float16") >= row.flops_per_s("float32")


def test_every_row_is_found_by_its_own_name():
    # a row that an earlier, more general row shadows can never be selected
    for row in gpu_table():
        assert lookup(row.name) is row, row.key


def test_by_key_and_unknown_key():
    assert by_key("h200").name == "NVIDIA H200"
    with pytest.raises(KeyError, match="h100-sxm"):
        by_key("h9000")


def test_missing_dtype_peak_is_a_clear_key_error():
    with pytest.raises(KeyError, match="float8"):
        by_key("a100").flops_per_s("float8")


# ----- roofline -------------------------------------------------------------------------------
H100 = "h100-sxm"


def test_memory_bound_at_the_roofline_is_one():
    gpu = by_key(H100)
    nbytes = 8 * 4096 * 16384
    flops = 5 * 4096 * 16384  # 0.6 FLOP/byte: far below the ridge
    t_ms = nbytes / (3350 * 1e9) * 1e3
    frac, regime = peak_fraction(flops, nbytes, t_ms, gpu, "float32")
    assert regime == "memory-bound"
    assert frac == pytest.approx(1.0)
    frac2, regime2 = peak_fraction(flops, nbytes, 2 * t_ms, gpu, "float32")
    assert frac2 == pytest.approx(0.5) and regime2 == "memory-bound"


def test_compute_bound_at_the_roofline_is_one():
    gpu = by_key(H100)
    m = n = k = 8192
    flops = 2 * m * n * k
    nbytes = 2 * (m * k + k * n + m * n)  # bf16
    t_ms = flops / (989.4e12) * 1e3
    frac, regime = peak_fraction(flops, nbytes, t_ms, gpu, "bfloat16")
    assert regime == "compute-bound"
    assert frac == pytest.approx(1.0)
    assert peak_fraction(flops, nbytes, 2 * t_ms, gpu, "bfloat16")[0] == pytest.approx(0.5)
    assert peak_fraction(flops, nbytes, 4 * t_ms, gpu, "bfloat16")[0] == pytest.approx(0.25)


def test_regime_depends_on_the_compute_dtype():
    # 100 FLOP/byte: compute-bound against the fp32 ceiling, memory-bound against bf16's
    gpu = by_key(H100)
    nbytes = 1e9
    flops = 100 * nbytes
    assert roofline_time_s(flops, nbytes, gpu, "float32")[1] == "compute-bound"
    assert roofline_time_s(flops, nbytes, gpu, "bfloat16")[1] == "memory-bound"


def test_roofline_time_is_the_slower_ceiling():
    gpu = by_key(H100)
    t, regime = roofline_time_s(1e12, 1e9, gpu, "float32")
    assert t == pytest.approx(max(1e12 / 67e12, 1e9 / 3350e9))
    assert regime == "compute-bound"


def test_ridge_point_h100_bf16():
    assert ridge_point(by_key(H100), "bfloat16") == pytest.approx(295, rel=0.01)
    assert ridge_point(by_key(H100), "float32") == pytest.approx(67e12 / 3350e9)


def _spec(measured: Measured | None) -> GPUSpec:
    return GPUSpec(key="test", name="Test GPU", match=["test gpu"], bandwidth_gbps=1000,
                   tflops={"float32": 50, "bfloat16": 500}, measured=measured)


def test_measured_ceilings_override_the_datasheet():
    datasheet = _spec(None)
    measured = _spec(Measured(bandwidth_gbps=800, tflops={"bfloat16": 400}))
    assert datasheet.bandwidth() == 1000e9
    assert measured.bandwidth() == 800e9
    assert measured.flops_per_s("bfloat16") == 400e12
    assert measured.flops_per_s("float32") == 50e12  # not measured: the datasheet's

    nbytes = 1e9  # memory-bound work; 1 ms is 1 TB/s: the datasheet peak, over the measured one
    assert peak_fraction(1e6, nbytes, 1.0, datasheet, "float32")[0] == pytest.approx(1.0)
    assert peak_fraction(1e6, nbytes, 1.25, measured, "float32")[0] == pytest.approx(1.0)
    assert ridge_point(measured, "bfloat16") == pytest.approx(400e12 / 800e9)


def test_measured_without_bandwidth_keeps_the_datasheet_bandwidth():
    spec = _spec(Measured(tflops={"float32": 40}))
    assert spec.bandwidth() == 1000e9
    assert spec.flops_per_s("float32") == 40e12
