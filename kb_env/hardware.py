"""The GPU table (peak GB/s and dense TFLOP/s per dtype, datasheet and measured) and detection.

The table is data: ``kb_env/data/gpus.yaml``. Measured ceilings, where a row has them, are
preferred over the datasheet's."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field


class Measured(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    bandwidth_gbps: float | None = None
    tflops: dict[str, float] = Field(default_factory=dict)
    note: str = ""


class GPUSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str
    name: str
    match: list[str]
    bandwidth_gbps: float = Field(gt=0)
    tflops: dict[str, float]
    measured: Measured | None = None

    def bandwidth(self) -> float:
        """Bytes per second: measured where known, else the datasheet's."""
        gbps = self.measured.bandwidth_gbps if self.measured and self.measured.bandwidth_gbps else self.bandwidth_gbps
        return gbps * 1e9

    def flops_per_s(self, dtype: str) -> float:
        if self.measured and dtype in self.measured.tflops:
            return self.measured.tflops[dtype] * 1e12
        if dtype not in self.tflops:
            raise KeyError(f"{self.name}: no peak for {dtype}; known: {sorted(self.tflops)}")
        return self.tflops[dtype] * 1e12


@lru_cache(maxsize=1)
def gpu_table() -> tuple[GPUSpec, ...]:
    text = resources.files("kb_env.data").joinpath("gpus.yaml").read_text()
    return tuple(GPUSpec.model_validate(row) for row in yaml.safe_load(text))


def lookup(device_name: str) -> GPUSpec | None:
    """The first table row whose `match` substrings all occur in `device_name`."""
    name = device_name.lower()
    for row in gpu_table():
        if all(m.lower() in name for m in row.match):
            return row
    return None


def by_key(key: str) -> GPUSpec:
    for row in gpu_table():
        if row.key == key:
            return row
    raise KeyError(f"no GPU {key!r} in the table; known: {[r.key for r in gpu_table()]}")
