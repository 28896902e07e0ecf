"""Performance pass: where an evaluation's time goes, evaluations per GPU-minute on the L1 problems'
known-good candidates and broken ones, the spread of one candidate's time over fresh evaluations,
and kb_env's time against triton.testing.do_bench and Nsight Compute (see kb_env/bench.py and
docs/PERFORMANCE.md).

    python benchmarks/bench.py [--device cuda] [--budget-s 450]    # the same as `kb bench`

Prints its tables last; writes bench.json to --out or $OUT."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kb_env.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
