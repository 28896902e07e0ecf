"""The in-worker integrity snapshot sees a function rewritten in place, not only replaced."""

from __future__ import annotations

from kb_env.sandbox.integrity import _fingerprint, _same


def _make():
    scale = [1.0]

    def timer(x, factor=1.0, *, unit="ms"):
        return x * factor * scale[0]

    return timer


def _make_fake():
    scale = [1.0]

    def timer(x, factor=1.0, *, unit="ms"):
        return x * factor * scale[0] / 10

    return timer


def test_unchanged_function_matches_its_snapshot():
    f = _make()
    assert _same(_fingerprint(f), _fingerprint(f))


def test_code_swap_is_seen():
    f = _make()
    snap = _fingerprint(f)
    f.__code__ = _make_fake().__code__
    assert f(1.0) == 0.1  # same object, new behaviour
    assert not _same(_fingerprint(f), snap)


def test_default_kwdefault_and_closure_swaps_are_seen():
    f = _make()
    snap = _fingerprint(f)
    f.__defaults__ = (0.1,)
    assert not _same(_fingerprint(f), snap)

    f = _make()
    snap = _fingerprint(f)
    f.__kwdefaults__ = {"unit": "ns"}
    assert not _same(_fingerprint(f), snap)

    f = _make()
    snap = _fingerprint(f)
    f.__closure__[0].cell_contents = [0.1]
    assert not _same(_fingerprint(f), snap)


def test_builtins_and_classes_compare_by_identity():
    import time

    assert _same(_fingerprint(time.perf_counter), _fingerprint(time.perf_counter))
    assert not _same(_fingerprint(time.perf_counter), _fingerprint(time.monotonic))
    assert _same(_fingerprint(int), _fingerprint(int))
