"""The tolerance an imported problem gets, from its output dtype alone.

An output passes when every element meets ``|got - ref| <= atol + rtol * |ref|`` and the whole
tensor's relative L2 error is at most ``max_rel_l2`` (`kb_env.problem.Tolerance`). For imported
problems the bar cannot be calibrated per problem by hand, so it comes from this table:

============  ===============  ======  ==========  ===============================================
dtype         atol (x RMS)     rtol    max_rel_l2  what it admits
============  ===============  ======  ==========  ===============================================
float64       1e-9             1e-7    1e-8        any summation order; not a float32 computation
float32       1e-4             1e-3    1e-4        any summation order in float32 (measured: a
                                                   split-K product is ~5e-7); not TF32 (~3e-4)
float16       1e-3             5e-3    5e-3        a few ulps (one ulp everywhere is ~7e-4)
bfloat16      1e-2             2e-2    2e-2        a few ulps (one ulp everywhere is ~5e-3)
int64, int32, bool             exact
============  ===============  ======  ==========  ===============================================

``atol`` scales with the output: it is the table's value times the root-mean-square of the
reference's output of that dtype over the checked cases (the largest, where several outputs share
a dtype), so near-zero elements of a large-valued output are not held to an absolute bar they
cannot meet, nor a tiny-valued output waved through. Where the importer could not run the
reference (too big to check on this machine), the RMS is taken as `UNCHECKED_RMS`. The relative-L2
bar is what makes an all-zeros answer fail (its relative L2 error is 1), whatever the scale.

float32 problems are graded as float32: a TF32 tensor-core product (Triton's ``tl.dot`` default
on float32) is about 3e-4 off and fails; ``input_precision="ieee"`` passes."""

from __future__ import annotations

from ..problem import Tolerance

# dtype -> (atol as a fraction of the output's RMS, rtol, max_rel_l2)
TABLE: dict[str, tuple[float, float, float]] = {
    "float64": (1e-9, 1e-7, 1e-8),
    "float32": (1e-4, 1e-3, 1e-4),
    "float16": (1e-3, 5e-3, 5e-3),
    "bfloat16": (1e-2, 2e-2, 2e-2),
}
EXACT = ("int64", "int32", "bool")  # compared exactly; the entry records atol = rtol = 0
SUPPORTED = (*TABLE, *EXACT)
UNCHECKED_RMS = 10.0  # the output scale assumed where the reference could not be run here


def tolerance_for(dtype: str, rms: float | None) -> Tolerance:
    """The bar for outputs of `dtype` whose RMS is `rms` (None: not measured)."""
    if dtype in EXACT:
        return Tolerance(atol=0.0, rtol=0.0, max_rel_l2=1e-12)
    if dtype not in TABLE:
        raise ValueError(f"no tolerance for output dtype {dtype}; supported: {', '.join(SUPPORTED)}")
    atol_frac, rtol, max_rel_l2 = TABLE[dtype]
    scale = UNCHECKED_RMS if rms is None else rms
    return Tolerance(atol=float(f"{atol_frac * scale:.3g}"), rtol=rtol, max_rel_l2=max_rel_l2)
