"""The private channel between the harness and a worker process: framed messages over a
pipe the harness owns, never the worker's stdout.

A message is JSON (dicts, lists, strings, numbers, booleans, None) in which CPU tensors may
appear; tensors travel as raw bytes beside the JSON and are rebuilt with `torch.frombuffer`.
Nothing is unpickled, so a hostile worker cannot make the harness run code by what it sends.

Frame: 8-byte little-endian header length, the JSON header, then each buffer's bytes; the
header's ``"_buffers"`` lists the buffer sizes.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any

import torch

MAX_HEADER_BYTES = 64 << 20
DEFAULT_MAX_PAYLOAD_BYTES = 16 << 30

_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
              torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64)
}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _DTYPES[_name] = getattr(torch, _name)

_TENSOR_KEY = "__tensor__"


class ChannelClosed(EOFError):
    """The other end closed the channel (the process exited or died)."""


class ChannelTimeout(TimeoutError):
    """No complete message arrived before the deadline."""


class ProtocolError(ValueError):
    """The other end sent bytes that are not a well-formed message."""


def _encode(obj: Any, buffers: list[memoryview]) -> Any:
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise TypeError(f"cannot send a tensor of dtype {t.dtype}")
        raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
        buffers.append(memoryview(raw.numpy()))
        return {_TENSOR_KEY: len(buffers) - 1, "dtype": dtype, "shape": list(t.shape)}
    if isinstance(obj, dict):
        return {str(k): _encode(v, buffers) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v, buffers) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot send {type(obj).__name__}")


def _decode(obj: Any, buffers: list[bytearray]) -> Any:
    if isinstance(obj, dict):
        if _TENSOR_KEY in obj:
            try:
                index, dtype, shape = int(obj[_TENSOR_KEY]), _DTYPES[obj["dtype"]], [int(s) for s in obj["shape"]]
                buf = buffers[index]
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise ProtocolError(f"bad tensor record {obj!r}: {exc}") from None
            numel = 1
            for s in shape:
                if s < 0:
                    raise ProtocolError(f"negative size in {shape}")
                numel *= s
            itemsize = torch.empty(0, dtype=dtype).element_size()
            if numel * itemsize != len(buf):
                raise ProtocolError(f"tensor {shape} {dtype} needs {numel * itemsize} bytes, got {len(buf)}")
            if numel == 0:
                return torch.empty(shape, dtype=dtype)
            return torch.frombuffer(buf, dtype=dtype).reshape(shape)
        return {k: _decode(v, buffers) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v, buffers) for v in obj]
    return obj


_F_SETPIPE_SZ = 1031  # Linux
PIPE_BYTES = 1 << 20


def widen_pipe(fd: int, size: int = PIPE_BYTES) -> int:
    """Ask for a `size`-byte pipe buffer (Linux; the default is 64 KiB) so that large tensors cross in
    fewer wake-ups; the size granted (0 where the platform or /proc/sys/fs/pipe-max-size says no)."""
    try:
        import fcntl

        return fcntl.fcntl(fd, _F_SETPIPE_SZ, size)
    except (ImportError, OSError):
        return 0


class Channel:
    """One direction-pair of pipe file descriptors: `send` writes, `recv` reads with a deadline."""

    def __init__(self, read_fd: int, write_fd: int, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES):
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.max_payload_bytes = max_payload_bytes

    # ----- sending -----------------------------------------------------------------
    def send(self, obj: Any) -> None:
        buffers: list[memoryview] = []
        header = _encode(obj, buffers)
        header = {"_body": header, "_buffers": [b.nbytes for b in buffers]}
        data = json.dumps(header).encode()
        self._write_all(struct.pack("<Q", len(data)) + data)
        for buf in buffers:
            self._write_all(buf)

    def _write_all(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view.nbytes:
            try:
                n = os.write(self.write_fd, view[: 1 << 24])
            except BrokenPipeError:
                raise ChannelClosed("the other end closed the channel") from None
            view = view[n:]

    # ----- receiving ---------------------------------------------------------------
    def recv(self, timeout: float | None = None) -> Any:
        """Read one message; raise ChannelTimeout if it is not complete within `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        (size,) = struct.unpack("<Q", self._read_exact(8, deadline))
        if size > MAX_HEADER_BYTES:
            raise ProtocolError(f"header of {size} bytes is over the {MAX_HEADER_BYTES} limit")
        try:
            header = json.loads(self._read_exact(size, deadline))
            sizes = [int(s) for s in header["_buffers"]]
            body = header["_body"]
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ProtocolError(f"malformed header: {type(exc).__name__}: {str(exc)[:200]}") from None
        if any(s < 0 for s in sizes) or sum(sizes) > self.max_payload_bytes:
            raise ProtocolError(f"payload of {sum(sizes)} bytes is over the {self.max_payload_bytes} limit")
        buffers = [self._read_exact(s, deadline) for s in sizes]
        try:
            return _decode(body, buffers)
        except RecursionError:
            raise ProtocolError("malformed message: nested too deeply") from None

    def _read_exact(self, n: int, deadline: float | None) -> bytearray:
        out = bytearray(n)
        view = memoryview(out)
        got = 0
        while got < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChannelTimeout("timed out waiting for the worker")
                ready, _, _ = select.select([self.read_fd], [], [], left)
                if not ready:
                    raise ChannelTimeout("timed out waiting for the worker")
            chunk = os.readv(self.read_fd, [view[got : got + (1 << 24)]])
            if chunk == 0:
                raise ChannelClosed("the other end closed the channel")
            got += chunk
        return out

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
