"""The private harness<->worker channel (kb_env.sandbox.protocol): what goes in comes out
bit for bit, and bytes a hostile worker writes can only ever raise ProtocolError /
ChannelClosed / ChannelTimeout in the harness -- never allocate without bound, never unpickle."""

from __future__ import annotations

import json
import os
import pickle
import struct
import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kb_env.sandbox.protocol import Channel, ChannelClosed, ChannelTimeout, ProtocolError


@pytest.fixture
def pipe_pair():
    """(sender, receiver): two Channels joined by one os.pipe() each way."""
    a_r, b_w = os.pipe()  # b -> a
    b_r, a_w = os.pipe()  # a -> b
    a, b = Channel(a_r, a_w), Channel(b_r, b_w)
    yield a, b
    a.close()
    b.close()


def _raw_frame(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def assert_same_tensor(got, sent: torch.Tensor) -> None:
    assert isinstance(got, torch.Tensor)
    assert got.dtype == sent.dtype
    assert tuple(got.shape) == tuple(sent.shape)
    assert got.device.type == "cpu"
    assert torch.equal(_bits(got), _bits(sent)), "values are not bit-identical"


# ----- round trips ------------------------------------------------------------------------------
def test_nested_message_round_trips_bit_identically(pipe_pair):
    a, b = pipe_pair
    g = torch.Generator().manual_seed(0)
    base = torch.randn(5, 7, generator=g)
    base[0, 0] = float("nan")  # bit-identical means NaN payloads survive too
    base[0, 1] = float("-inf")
    tensors = {
        "f32": base,
        "f16": torch.randn(3, 4, generator=g).to(torch.float16),
        "bf16": torch.randn(2, 3, 4, generator=g).to(torch.bfloat16),
        "i64": torch.randint(-(2**62), 2**62, (6,), generator=g, dtype=torch.int64),
        "bool": torch.rand(4, 4, generator=g) > 0.5,
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(3.25),
        "transposed": base.t(),  # non-contiguous
    }
    assert not tensors["transposed"].is_contiguous()
    msg = {
        "op": "run", "ok": True, "n": 3, "x": 1.5, "none": None, "s": "héllo\n",
        "outputs": [tensors["f32"], [tensors["f16"], {"deep": tensors["bf16"]}]],
        "more": {k: v for k, v in tensors.items()},
    }
    a.send(msg)
    got = b.recv(timeout=5)

    assert {k: got[k] for k in ("op", "ok", "n", "x", "none", "s")} == \
        {"op": "run", "ok": True, "n": 3, "x": 1.5, "none": None, "s": "héllo\n"}
    assert_same_tensor(got["outputs"][0], tensors["f32"])
    assert_same_tensor(got["outputs"][1][0], tensors["f16"])
    assert_same_tensor(got["outputs"][1][1]["deep"], tensors["bf16"])
    assert set(got["more"]) == set(tensors)
    for k, t in tensors.items():
        assert_same_tensor(got["more"][k], t)
    assert got["more"]["scalar"].dim() == 0 and float(got["more"]["scalar"]) == 3.25
    # the transposed tensor arrives with the transposed layout's values, not the storage order
    assert torch.equal(_bits(got["more"]["transposed"][1]), _bits(base[:, 1]))


def test_messages_arrive_in_order_and_both_directions_work(pipe_pair):
    a, b = pipe_pair
    for i in range(5):
        a.send({"i": i, "t": torch.full((i,), float(i))})
    b.send({"reply": "pong"})
    for i in range(5):
        got = b.recv(timeout=5)
        assert got["i"] == i and torch.equal(got["t"], torch.full((i,), float(i)))
    assert a.recv(timeout=5) == {"reply": "pong"}


def test_large_tensor_round_trips(pipe_pair):
    a, b = pipe_pair
    big = torch.arange(8 * 1024 * 1024, dtype=torch.float32).mul_(1.000001)
    errors: list[BaseException] = []

    def sender():
        try:
            a.send({"big": big, "tail": "done"})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    th = threading.Thread(target=sender)
    th.start()
    got = b.recv(timeout=30)
    th.join(timeout=30)
    assert not errors
    assert got["tail"] == "done"
    assert_same_tensor(got["big"], big)


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool]


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(0, 5), min_size=0, max_size=4),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1), transpose=st.booleans())
def test_random_tensors_round_trip(shape, dtype, seed, transpose):
    g = torch.Generator().manual_seed(seed)
    # random bytes reinterpreted as the dtype: covers every bit pattern, NaNs and denormals included
    nbytes = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8)
    if dtype is torch.bool:
        raw = raw % 2
    t = raw.view(dtype).reshape(shape)
    if transpose and t.dim() >= 2:
        t = t.transpose(0, -1)
    r1, w1 = os.pipe()
    ch = Channel(r1, w1)  # one pipe looped back: small messages fit in its buffer
    try:
        ch.send({"t": t, "shape": shape})
        got = ch.recv(timeout=5)
    finally:
        ch.close()
    assert got["shape"] == list(shape)
    assert_same_tensor(got["t"], t)


# ----- what the sender refuses -------------------------------------------------------------------
@pytest.mark.parametrize("obj", [object(), {"a": {1, 2}}, [b"bytes"], {"t": torch.zeros(2, dtype=torch.complex128)}],
                         ids=["object", "set", "bytes", "complex128"])
def test_unsupported_objects_raise_type_error_and_write_nothing(pipe_pair, obj):
    a, b = pipe_pair
    with pytest.raises(TypeError):
        a.send(obj)
    # nothing half-written: the next message is read cleanly
    a.send({"ok": True})
    assert b.recv(timeout=5) == {"ok": True}


# ----- hostile or broken senders -----------------------------------------------------------------
def test_huge_header_length_is_refused_before_allocating(pipe_pair):
    a, b = pipe_pair
    os.write(a.write_fd, struct.pack("<Q", 2**62))  # bytearray(2**62) would be a MemoryError
    with pytest.raises(ProtocolError):
        b.recv(timeout=5)


def test_huge_payload_claim_is_refused_before_allocating(pipe_pair):
    a, b = pipe_pair
    header = json.dumps({"_body": {"__tensor__": 0, "dtype": "float32", "shape": [2**60]},
                         "_buffers": [2**62]}).encode()
    os.write(a.write_fd, _raw_frame(header))
    with pytest.raises(ProtocolError, match="limit"):
        b.recv(timeout=5)


def test_payload_over_the_channel_limit_is_refused():
    r, w = os.pipe()
    ch = Channel(r, w, max_payload_bytes=1000)
    try:
        os.write(w, _raw_frame(json.dumps({"_body": None, "_buffers": [600, 600]}).encode()))
        with pytest.raises(ProtocolError):
            ch.recv(timeout=5)
    finally:
        ch.close()


def test_negative_buffer_size_is_a_protocol_error(pipe_pair):
    a, b = pipe_pair
    os.write(a.write_fd, _raw_frame(json.dumps({"_body": None, "_buffers": [-5]}).encode()))
    with pytest.raises(ProtocolError):
        b.recv(timeout=5)


@pytest.mark.parametrize("header", [
    b"{not json", b"\xff\xfe\x00garbage", b'"a string"', b"[1, 2]", b'{"_body": 1}', b'{"_buffers": []}',
    b'{"_body": 1, "_buffers": 5}', b'{"_body": 1, "_buffers": ["x"]}',
], ids=["broken", "binary", "string", "list", "no-buffers", "no-body", "buffers-int", "buffers-str"])
def test_malformed_header_is_a_protocol_error(pipe_pair, header):
    a, b = pipe_pair
    os.write(a.write_fd, _raw_frame(header))
    with pytest.raises(ProtocolError):
        b.recv(timeout=5)


@pytest.mark.parametrize("record, nbytes", [
    ({"__tensor__": 0, "dtype": "float32", "shape": [2, 3]}, 20),   # needs 24
    ({"__tensor__": 0, "dtype": "float32", "shape": [2, 3]}, 28),
    ({"__tensor__": 0, "dtype": "int64", "shape": []}, 4),          # 0-d needs 8
    ({"__tensor__": 0, "dtype": "float32", "shape": [-1, 2]}, 8),   # negative size
    ({"__tensor__": 0, "dtype": "float32", "shape": [-2, -2]}, 16),  # negative sizes, positive product
    ({"__tensor__": 3, "dtype": "float32", "shape": [1]}, 4),       # no such buffer
    ({"__tensor__": 0, "dtype": "object", "shape": [1]}, 4),        # unknown dtype
    ({"__tensor__": 0, "dtype": ["float32"], "shape": [1]}, 4),     # unhashable dtype
    ({"__tensor__": 0, "dtype": "float32", "shape": 4}, 16),        # shape not a list
], ids=["short", "long", "0d-short", "negative", "two-negatives", "index", "dtype", "dtype-list", "shape-int"])
def test_tensor_record_inconsistent_with_its_bytes_is_a_protocol_error(pipe_pair, record, nbytes):
    a, b = pipe_pair
    header = json.dumps({"_body": {"out": [record]}, "_buffers": [nbytes]}).encode()
    os.write(a.write_fd, _raw_frame(header) + b"\x01" * nbytes)
    with pytest.raises(ProtocolError):
        b.recv(timeout=5)


class _Exploit:
    """Unpickling this opens (creates) a file."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
@pytest.mark.parametrize("framed", [False, True], ids=["raw", "as-header"])
def test_a_pickle_is_never_unpickled(pipe_pair, tmp_path, protocol, framed):
    a, b = pipe_pair
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Exploit(str(marker)), protocol=protocol)
    # sanity: the payload really would create the file if anyone unpickled it
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(_Exploit(str(probe)), protocol=protocol)).close()
    assert probe.exists()

    os.write(a.write_fd, _raw_frame(payload) if framed else payload + b"\x00" * 16)
    with pytest.raises(ProtocolError):
        b.recv(timeout=2)
    assert not marker.exists()


def test_a_pickle_inside_a_tensor_buffer_stays_bytes(pipe_pair, tmp_path):
    a, b = pipe_pair
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Exploit(str(marker)))
    header = json.dumps({"_body": {"__tensor__": 0, "dtype": "uint8", "shape": [len(payload)]},
                         "_buffers": [len(payload)]}).encode()
    os.write(a.write_fd, _raw_frame(header) + payload)
    got = b.recv(timeout=5)
    assert bytes(got.numpy()) == payload
    assert not marker.exists()


# ----- deadlines and endings ----------------------------------------------------------------------
def test_recv_on_a_silent_pipe_times_out_on_time(pipe_pair):
    _, b = pipe_pair
    t0 = time.monotonic()
    with pytest.raises(ChannelTimeout):
        b.recv(timeout=0.3)
    elapsed = time.monotonic() - t0
    assert 0.25 <= elapsed < 2.0


def test_a_partial_message_times_out_rather_than_hanging(pipe_pair):
    a, b = pipe_pair
    header = json.dumps({"_body": {"__tensor__": 0, "dtype": "uint8", "shape": [100]}, "_buffers": [100]}).encode()
    os.write(a.write_fd, _raw_frame(header) + b"x" * 10)  # 90 bytes never come
    t0 = time.monotonic()
    with pytest.raises(ChannelTimeout):
        b.recv(timeout=0.3)
    assert time.monotonic() - t0 < 2.0


def test_closed_writer_is_channel_closed(pipe_pair):
    a, b = pipe_pair
    os.close(a.write_fd)
    t0 = time.monotonic()
    with pytest.raises(ChannelClosed):
        b.recv(timeout=5)
    assert time.monotonic() - t0 < 2.0  # noticed at once, not at the deadline
    with pytest.raises(ChannelClosed):
        b.recv()  # and without a deadline too (no hang)


def test_writer_closing_mid_message_is_channel_closed(pipe_pair):
    a, b = pipe_pair
    header = json.dumps({"_body": None, "_buffers": [64]}).encode()
    os.write(a.write_fd, _raw_frame(header) + b"y" * 8)
    os.close(a.write_fd)
    with pytest.raises(ChannelClosed):
        b.recv(timeout=5)


def test_sending_to_a_closed_reader_is_channel_closed(pipe_pair):
    a, b = pipe_pair
    os.close(b.read_fd)
    with pytest.raises(ChannelClosed):
        a.send({"t": torch.zeros(10)})


def test_channel_closed_and_timeout_are_the_documented_exception_families():
    # callers catch these by their standard bases
    assert issubclass(ChannelClosed, EOFError)
    assert issubclass(ChannelTimeout, TimeoutError)
    assert issubclass(ProtocolError, ValueError)


# ----- known gaps ---------------------------------------------------------------------------------
def test_deeply_nested_header_is_a_protocol_error(pipe_pair):
    a, b = pipe_pair
    header = b"[" * 100_000 + b"]" * 100_000
    th = threading.Thread(target=lambda: a._write_all(_raw_frame(header)))
    th.start()
    try:
        with pytest.raises(ProtocolError):
            b.recv(timeout=10)
    finally:
        th.join(timeout=10)
