"""The seeds of an evaluation, on the trusted side: which inputs and weights it draws.

Every seed is derived (`derive_seed`) from a secret the candidate never sees: the evaluation's
*salt* (fresh per evaluation: the environment draws it from its RNG, or `secrets`) and, with a
warm evaluator, its *pool key* (drawn by `secrets` when the evaluator starts, kept in this
process, never sent anywhere: only seeds derived from it reach the workers, over their private
pipes, as before). Seeds never reach a worker's argv, environment or files.

Which seeds come from where (`SeedPlan`):

- grading cases: each shape's grading seeds are drawn from a pool of `SEED_POOL` seeds per shape
  (pool key), a different draw every evaluation (salt), except `FRESH_GRADING` of them, at a
  position the salt picks, drawn fresh from the salt. Pooled cases recur across evaluations, so
  the reference worker can keep their outputs (`cache` in the case);
- the model's weights (``param_seed``): one per pool key, so the reference worker keeps its models;
- stress cases, every timed call and the wall-clock check's batches, the profiled call: fresh from
  the salt, as before.

Without a pool key (a cold evaluator, ``Evaluator(warm=False)``) everything comes from the salt,
exactly as before the pool existed.

Why a candidate gains nothing from the pool. It never sees a seed before its call, nor any
reference output (they stay in the reference worker), so recurring seeds tell it nothing it could
not compute from the inputs it is given. What recurs is inputs, across evaluations. A candidate
cannot keep anything in its own process (a fresh one per evaluation), but it can write files: its
working folder is deleted after each evaluation and HOME-relative caches point into it, yet it runs
as the harness's user and can write to /tmp, HOME or anywhere else that user can; a later
candidate can read them. So assume the worst: every candidate may consult a table of outputs that
earlier candidates (the same agent's correct ones, say) computed for pooled inputs. Such a table
can only replace a candidate's answer on an input some earlier candidate answered; the table's
entries are what that candidate returned, never the reference's. It helps only a candidate that
is wrong where an earlier one was right, and every kind of input a table could answer has a fresh
counterpart in the same evaluation that no table holds: normal-distribution inputs in the fresh
grading case of every shape and in the timed calls whose outputs are re-checked (fresh per call),
stress inputs in the stress cases (all fresh). A candidate wrong on a kind of input fails that
kind's fresh case as it would without the pool. What the pool costs is power against a candidate
that is wrong on a small fraction of inputs and colludes with an earlier correct one: its pooled
grading cases no longer count against it, only the fresh ones (one grading case per shape plus
the re-checked timed calls). We accept that for the cached reference outputs, and do not try to
block the files: without a filesystem sandbox (namespaces, Landlock) a same-user process can
write somewhere persistent, and a rule that seemed to block it would only hide the risk.
"""

from __future__ import annotations

import hashlib
import random

SEED_POOL = 8  # pooled grading seeds per shape
FRESH_GRADING = 1  # grading cases per shape drawn fresh from the salt every evaluation


def derive_seed(salt: int, label: str) -> int:
    digest = hashlib.blake2b(f"{salt}:{label}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


class SeedPlan:
    """The seeds of one evaluation: from its `salt`, and from the evaluator's `pool_key` (None: no
    pool, every seed from the salt)."""

    def __init__(self, salt: int, pool_key: int | None):
        self.salt, self.pool_key = salt, pool_key
        self.param_seed = derive_seed(salt if pool_key is None else pool_key, "params")

    def grading(self, shape_index: int, labels: list[int]) -> list[tuple[int, bool]]:
        """(seed, pooled) for each grading seed label of a shape: `FRESH_GRADING` fresh ones at
        positions the salt picks, the rest drawn from the shape's pool without repeats."""
        fresh_seeds = [(derive_seed(self.salt, f"grading:{label}"), False) for label in labels]
        if self.pool_key is None:
            return fresh_seeds
        rng = random.Random(derive_seed(self.salt, f"pick:{shape_index}"))
        n_fresh = min(len(labels), max(FRESH_GRADING, len(labels) - SEED_POOL))
        fresh = set(rng.sample(range(len(labels)), n_fresh))
        picks = iter(rng.sample(range(SEED_POOL), len(labels) - n_fresh))
        return [fresh_seeds[k] if k in fresh else (self.pooled(shape_index, next(picks)), True)
                for k in range(len(labels))]

    def pooled(self, shape_index: int, index: int) -> int:
        """The `index`-th pooled grading seed of a shape."""
        assert self.pool_key is not None
        return derive_seed(self.pool_key, f"pool:{shape_index}:{index}")

    def stress(self, k: int) -> int:
        return derive_seed(self.salt, f"stress:{k}")

    def fresh(self, label: str) -> int:
        """A seed of this evaluation only (timed calls, wall-clock batches, profiling, compiling)."""
        return derive_seed(self.salt, label)

    def all_pooled(self, n_shapes: int) -> list[int]:
        """Every seed of the pool (for tests that look for seeds where they must not be)."""
        return [] if self.pool_key is None else [self.pooled(si, j) for si in range(n_shapes) for j in range(SEED_POOL)]
