"""Inside a CUDA worker: the persisting-L2 state a candidate could use to keep its data
resident across the harness's L2 flush (the cold-cache contract).

Read and reset through the driver API (``libcuda.so.1``, the library every CUDA runtime in
the process talks to), bound by `bind()` when a CUDA worker gets its device ready, before any
candidate code exists (not when this module loads: the warm worker server imports it and must
not load the driver, or it cannot fork workers):

- the context's persisting-L2 set-aside (``CU_LIMIT_PERSISTING_L2_CACHE_SIZE``), and
- the access-policy window of the stream the harness times on.

The driver's default set-aside is not zero (9.4 MiB on an H100), so workers reset it to zero
when they start, before any candidate code exists, and before every timed batch; either being
non-zero after a candidate's call is then the ``l2_persistence`` flag."""

from __future__ import annotations

import ctypes
from typing import Any

_LIMIT_PERSISTING_L2 = 0x06  # CU_LIMIT_PERSISTING_L2_CACHE_SIZE
_STREAM_ACCESS_POLICY_WINDOW = 1  # CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW


class _AccessPolicyWindow(ctypes.Structure):
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hitRatio", ctypes.c_float),
                ("hitProp", ctypes.c_int), ("missProp", ctypes.c_int)]


class _StreamAttr(ctypes.Union):  # CUlaunchAttributeValue is a 64-byte union
    _fields_ = [("window", _AccessPolicyWindow), ("pad", ctypes.c_char * 64)]


_cuda: Any = None  # the driver, once `bind()` loaded it; the calls below are bound with it
_get_limit: Any = None
_set_limit: Any = None
_reset_persisting: Any = None
_get_stream_attr: Any = None
_set_stream_attr: Any = None


def bind() -> bool:
    """Load the driver and bind the calls (once); False where there is no driver (CPU mode) or
    one too old for persisting L2."""
    global _cuda, _get_limit, _set_limit, _reset_persisting, _get_stream_attr, _set_stream_attr
    if _cuda is not None:
        return True
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        _get_limit, _set_limit = cuda.cuCtxGetLimit, cuda.cuCtxSetLimit
        _reset_persisting = cuda.cuCtxResetPersistingL2Cache
        _get_stream_attr, _set_stream_attr = cuda.cuStreamGetAttribute, cuda.cuStreamSetAttribute
    except (OSError, AttributeError):
        return False
    _cuda = cuda
    return True


def available() -> bool:
    return _cuda is not None


def persisting_state(stream: int) -> tuple[int, int]:
    """(bytes set aside for persisting lines, bytes of `stream`'s access-policy window); (0, 0)
    where the driver cannot say."""
    if _cuda is None:
        return 0, 0
    size = ctypes.c_size_t(0)
    if _get_limit(ctypes.byref(size), _LIMIT_PERSISTING_L2) != 0:
        size.value = 0
    attr = _StreamAttr()
    if _get_stream_attr(ctypes.c_void_p(stream), _STREAM_ACCESS_POLICY_WINDOW, ctypes.byref(attr)) != 0:
        return size.value, 0
    return size.value, attr.window.num_bytes


def reset(stream: int) -> None:
    """No set-aside, no window on `stream`, and every line back to normal priority."""
    if _cuda is None:
        return
    _set_limit(_LIMIT_PERSISTING_L2, ctypes.c_size_t(0))
    _set_stream_attr(ctypes.c_void_p(stream), _STREAM_ACCESS_POLICY_WINDOW, ctypes.byref(_StreamAttr()))
    _reset_persisting()


def violated(stream: int) -> bool:
    limit, window = persisting_state(stream)
    return limit > 0 or window > 0
