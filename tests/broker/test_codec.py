"""Message-body codec: every kind of value comes back equal and of the same type."""

from __future__ import annotations

import collections
import dataclasses
import enum
import math
import struct
import subprocess
import sys
import textwrap
import threading
import types
import warnings
from types import MappingProxyType

import msgpack
import numpy as np
import pytest
import torch

from monarch.broker.bodies import codec, ext
from monarch.broker.bodies.codec import (
    CodecError,
    DecodeError,
    EncodeError,
    PicklingForbiddenError,
    dumps,
    loads,
    register_ext,
)
from monarch.settings import Settings


def assert_same(a, b):
    """Equal, with the same type at every level (and floats equal bit for bit)."""
    assert type(a) is type(b), f"{a!r} came back as {b!r}"
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert len(a) == len(b)
        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True):
            assert_same(ka, kb)
            assert_same(va, vb)
    elif type(a) is float:
        assert struct.pack("<d", a) == struct.pack("<d", b)
    else:
        assert a == b


def roundtrip(value, **kwargs):
    return loads(dumps(value, **kwargs), **kwargs)


def tensor_bits(t: torch.Tensor) -> list[int]:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).tolist()


@pytest.fixture
def clean_registry(monkeypatch):
    """Registrations made by a test vanish after it."""
    monkeypatch.setattr(ext, "_by_class", dict(ext._by_class))
    monkeypatch.setattr(ext, "by_class", MappingProxyType(ext._by_class))
    monkeypatch.setattr(ext, "_by_code", dict(ext._by_code))
    monkeypatch.setattr(codec, "_marks", dict(codec._marks))


class Color(enum.IntEnum):
    RED = 1


class Name(str):
    pass


PLAIN_VALUES = [
    None,
    True,
    False,
    0,
    -1,
    2**63 - 1,
    2**64 - 1,
    -(2**63),
    2**64,
    -(2**63) - 1,
    3**200,
    -(3**200),
    1.5,
    -0.0,
    float("inf"),
    "",
    "héllo",
    b"",
    b"\x00\xff",
    bytearray(),
    bytearray(b"\x00abc"),
    (),
    (1,),
    (1, (2, (3,))),
    [],
    [1, [2, [3]]],
    ([1, (2, [3])],),
    {},
    {"a": 1},
    {1: "int key", (1, 2): "tuple key", b"k": "bytes key", None: 0, 1.5: 2, -1: 3},
    {"nested": {"deeper": ((1, 2), [3.0, "x"])}},
    [bytearray(b"in a list"), {"k": bytearray(b"in a dict")}, (bytearray(b"in a tuple"),)],
    list(range(100)) + [bytearray(b"after a long flat run")],
    ((3,), {"step": 1}),
]


@pytest.mark.parametrize("value", PLAIN_VALUES, ids=repr)
def test_plain_values_round_trip_with_their_types(value):
    assert_same(value, roundtrip(value))
    assert_same(value, roundtrip(value, allow_pickle=False))


@pytest.mark.parametrize(
    "value",
    [
        {1, 2},
        frozenset({"a"}),
        collections.OrderedDict(a=1),
        collections.defaultdict(list, a=[1]),
        Color.RED,
        Name("sub"),
        1 + 2j,
        range(3),
    ],
    ids=repr,
)
def test_other_values_round_trip_through_pickle_keeping_their_type(value):
    assert_same(value, roundtrip(value))


def test_nan_float_keeps_its_bits():
    nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_DEAD_BEEF))[0]
    assert_same(nan, roundtrip(nan))


def test_plain_data_encodes_as_msgpack_with_tuples_as_marker_arrays():
    body = dumps({"a": [1, "x"]})
    assert msgpack.unpackb(body) == {"a": [1, "x"]}
    assert msgpack.unpackb(dumps((1, 2))) == [msgpack.ExtType(1, b""), 1, 2]


SCALARS = [v for v in PLAIN_VALUES if type(v) in (type(None), bool, int, float, str, bytes)]


@pytest.mark.parametrize("value", SCALARS, ids=repr)
def test_a_scalar_is_msgpacks_own_bytes_or_beyond_64_bits_the_codecs_ext(value):
    """A lone scalar takes a short path (most replies are one); its body is what the
    full path writes: msgpack's own bytes, which a gathered reply concatenates."""
    try:
        plain = msgpack.packb(value, use_bin_type=True)
    except OverflowError:  # an int beyond 64 bits: the codec's own ext, as before
        assert msgpack.unpackb(dumps(value)) != value
        assert_same(value, roundtrip(value))
        return
    assert dumps(value) == plain
    assert dumps(value, wire="json") != plain  # JSON wire: still JSON


def test_a_str_msgpack_refuses_is_an_encode_error_naming_it():
    with pytest.raises(EncodeError, match="cannot encode a str: UnicodeEncodeError"):
        dumps("\ud800")
    assert dumps("after") == msgpack.packb("after")  # the encoder is fine afterwards


FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
ALL_DTYPES = (
    FLOAT_DTYPES
    + [
        torch.complex64,
        torch.complex128,
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
    ]
    + [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_tensor_of_any_dtype_round_trips_bit_exactly(dtype):
    raw = torch.randint(0, 256, (3, 4 * dtype.itemsize), dtype=torch.uint8)
    t = raw.view(dtype) if dtype is not torch.bool else raw % 2 == 0
    out = loads(dumps(t, allow_pickle=False), allow_pickle=False)
    assert type(out) is torch.Tensor and out.dtype == dtype and out.shape == t.shape
    assert tensor_bits(out) == tensor_bits(t)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_float_tensor_keeps_nan_payloads_signed_zero_and_inf(dtype):
    t = torch.tensor([float("nan"), -0.0, 0.0, float("inf"), -float("inf"), 1.0], dtype=dtype)
    bits = t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize])
    bits[0] = bits[0] + 1  # a NaN with a non-default payload
    assert torch.isnan(t[0])
    out = roundtrip(t)
    assert tensor_bits(out) == tensor_bits(t)
    assert math.copysign(1.0, out[1].item()) == -1.0


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(12.0).reshape(3, 4).t(),
        lambda: torch.arange(20).reshape(4, 5)[::2, 1:4],
        lambda: torch.arange(6.0).expand(3, 6),
        lambda: torch.tensor(3.5),
        lambda: torch.empty(0, 3),
        lambda: torch.tensor([1 + 2j, 3 - 4j]).conj(),
        lambda: -torch.tensor([1 + 2j]).conj(),
    ],
    ids=["transposed", "strided-slice", "expanded", "0-d", "empty", "conj-view", "neg-view"],
)
def test_tensor_layouts_round_trip_by_value(make):
    t = make()
    out = roundtrip(t)
    assert out.shape == t.shape and out.dtype == t.dtype
    assert torch.equal(out, t.resolve_conj().resolve_neg())
    assert out.is_contiguous()


def test_decoded_tensor_is_writable_and_owns_its_memory():
    t = torch.arange(1000.0)
    body = bytearray(dumps((t,)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (out,) = loads(body)
        out.add_(1)
    body[:] = bytes(len(body))
    assert torch.equal(out, t + 1)
    assert torch.equal(t, torch.arange(1000.0))


def test_same_tensor_twice_decodes_into_two_independent_tensors():
    t = torch.zeros(4)
    a, b = roundtrip((t, t))
    a.fill_(1)
    assert torch.equal(b, torch.zeros(4))


def test_tensor_that_requires_grad_arrives_detached():
    t = torch.ones(3, requires_grad=True) * 2
    out = roundtrip(t)
    assert not out.requires_grad and out.grad_fn is None
    assert torch.equal(out, t.detach())


def test_parameter_arrives_as_plain_tensor_without_pickle():
    p = torch.nn.Parameter(torch.ones(2))
    out = roundtrip(p, allow_pickle=False)
    assert type(out) is torch.Tensor and torch.equal(out, torch.ones(2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensor_arrives_on_cpu():
    t = torch.arange(10.0, device="cuda")
    out = roundtrip(t)
    assert out.device.type == "cpu" and torch.equal(out, t.cpu())


def test_big_tensor_round_trips_with_one_out_of_band_buffer():
    t = torch.randn(1 << 20)
    body = dumps(((t,), {}))
    assert len(body) < t.numel() * 4 + 200
    (out,), kwargs = loads(memoryview(body))
    assert kwargs == {} and torch.equal(out, t)


def test_big_plain_values_round_trip_and_later_small_ones_still_do():
    big = (b"x" * (3 << 20), list(range(100_000)))
    assert_same(big, roundtrip(big))
    assert_same(((3,), {"step": 1}), roundtrip(((3,), {"step": 1})))


@pytest.mark.parametrize(
    "array",
    [
        np.arange(10, dtype=np.float32),
        np.array([np.nan, -0.0, np.inf]),
        np.array([[1, -2], [3, 4]], dtype=np.int8),
        np.array([2**64 - 1], dtype=np.uint64),
        np.array([True, False]),
        np.array([1 + 2j], dtype=np.complex128),
        np.array([1, 2], dtype=">i4"),
        np.array(["2024-01-01"], dtype="datetime64[ns]"),
        np.array(["ab", "c"], dtype="<U2"),
        np.float16(1.5) * np.ones((2, 3), dtype=np.float16),
        np.array(7.0),
        np.zeros((0, 4)),
        np.asfortranarray(np.arange(6).reshape(2, 3)),
        np.arange(20).reshape(4, 5)[::2, ::-1],
    ],
    ids=lambda a: f"{a.dtype.str}{a.shape}",
)
def test_numpy_array_round_trips_bit_exactly_without_pickle(array):
    out = roundtrip(array, allow_pickle=False)
    assert type(out) is np.ndarray
    assert out.dtype == array.dtype and out.shape == array.shape
    assert out.tobytes() == array.tobytes()
    assert out.flags.writeable


def test_object_numpy_array_falls_back_to_pickle():
    array = np.array([{"a": 1}, None], dtype=object)
    out = roundtrip(array)
    assert out.dtype == object and list(out) == list(array)
    with pytest.raises(PicklingForbiddenError):
        dumps(array, allow_pickle=False)


def test_nested_containers_with_tensors_and_arrays_round_trip():
    value = {
        "weights": [torch.ones(2, 2), (torch.arange(3), {"bias": np.zeros(2)})],
        (1, "k"): (torch.tensor(True), bytearray(b"buf"), [b"raw"]),
    }
    out = roundtrip(value, allow_pickle=False)
    assert list(out) == ["weights", (1, "k")]
    w = out["weights"]
    assert torch.equal(w[0], torch.ones(2, 2)) and torch.equal(w[1][0], torch.arange(3))
    assert type(w[1]) is tuple and np.array_equal(w[1][1]["bias"], np.zeros(2))
    t, buf, raw = out[(1, "k")]
    assert t.item() is True and buf == bytearray(b"buf") and type(buf) is bytearray
    assert raw == [b"raw"]


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int


class Point3(Point):
    pass


@dataclasses.dataclass
class Box:
    label: str
    data: torch.Tensor


def test_registered_type_round_trips_alone_and_nested(clean_registry):
    register_ext(120, Point, lambda p: (p.x, p.y), lambda xy: Point(*xy))
    p = Point(1, 2)
    value = ((p, [p]), {p: (p,)})
    assert roundtrip(value, allow_pickle=False) == value
    assert type(roundtrip(p, allow_pickle=False)) is Point


def test_registered_type_may_contain_tensors_and_other_registered_types(clean_registry):
    register_ext(121, Point, lambda p: (p.x, p.y), lambda xy: Point(*xy))
    register_ext(122, Box, lambda b: (b.label, b.data, Point(0, 1)), lambda s: (Box(*s[:2]), s[2]))
    box, point = roundtrip((Box("w", torch.arange(4.0)),), allow_pickle=False)[0]
    assert box.label == "w" and torch.equal(box.data, torch.arange(4.0))
    assert point == Point(0, 1)


def test_subclass_of_registered_type_uses_its_base_registration(clean_registry):
    register_ext(123, Point, lambda p: [type(p).__name__, p.x, p.y], lambda s: tuple(s))
    assert roundtrip(Point3(1, 2), allow_pickle=False) == ("Point3", 1, 2)


def test_registered_encode_hook_may_call_dumps_itself(clean_registry):
    register_ext(124, Point, lambda p: dumps((p.x, p.y)), lambda b: Point(*loads(b)))
    assert roundtrip([Point(3, 4), Point(5, 6)]) == [Point(3, 4), Point(5, 6)]


def test_failing_registered_decode_hook_raises_decode_error(clean_registry):
    def decode(xy):
        raise KeyError("no such point")

    register_ext(119, Point, lambda p: (p.x, p.y), decode)
    with pytest.raises(DecodeError, match="no such point"):
        loads(dumps(Point(1, 2)))


@pytest.mark.parametrize("code", [-1, 0, 1, 15, 128, 1000, True, "16", 16.0])
def test_register_ext_rejects_codes_outside_16_to_127(clean_registry, code):
    with pytest.raises(ValueError, match="16..127"):
        register_ext(code, Point, repr, repr)


def test_register_ext_rejects_taken_codes_and_classes(clean_registry):
    register_ext(125, Point, repr, repr)
    with pytest.raises(ValueError, match="125"):
        register_ext(125, Box, repr, repr)
    with pytest.raises(ValueError, match="Point"):
        register_ext(126, Point, repr, repr)
    with pytest.raises(ValueError):
        register_ext(127, tuple, repr, repr)


def test_pickling_forbidden_at_sender_names_the_type_and_the_switch():
    class Opaque:
        pass

    with pytest.raises(PicklingForbiddenError) as info:
        dumps(((1, Opaque()),), allow_pickle=False)
    message = str(info.value)
    assert "Opaque" in message and "MONARCH_PICKLE=1" in message and "numpy arrays" in message
    assert isinstance(info.value, EncodeError) and isinstance(info.value, TypeError)


def test_allow_pickle_default_follows_monarch_pickle_setting(monkeypatch):
    monkeypatch.setattr(codec, "settings", lambda: Settings(pickle=False))
    with pytest.raises(PicklingForbiddenError):
        dumps({1, 2})
    with pytest.raises(DecodeError):
        loads(dumps({1, 2}, allow_pickle=True))
    assert roundtrip((1, [2])) == (1, [2])
    monkeypatch.setattr(codec, "settings", lambda: Settings(pickle=True))
    assert roundtrip({1, 2}) == {1, 2}


def test_unpicklable_value_raises_encode_error_naming_type_and_reason():
    with pytest.raises(EncodeError) as info:
        dumps(("x", threading.Lock()))
    assert "lock" in str(info.value) and "cloudpickle failed" in str(info.value)
    assert not isinstance(info.value, PicklingForbiddenError)


def test_local_class_and_closure_round_trip_by_value():
    class Local:
        def __init__(self, n):
            self.n = n

        def twice(self):
            return 2 * self.n

    offset = 10
    obj, fn = roundtrip((Local(21), lambda v: v + offset))
    assert type(obj).__name__ == "Local" and obj.twice() == 42
    assert fn(1) == 11


def test_exceptions_round_trip_through_pickle():
    class LocalError(RuntimeError):
        pass

    err, local = roundtrip((KeyError("k"), LocalError("boom", 3)))
    assert type(err) is KeyError and err.args == ("k",)
    assert type(local).__name__ == "LocalError" and local.args == ("boom", 3)
    assert isinstance(local, RuntimeError)


def frame_with_tensor() -> bytes:
    return dumps((torch.arange(8.0),))


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\xc1",
        b"\x93\x01\x02",
        dumps(((1, 2), "abcdef"))[:-3],
        dumps({"key": list(range(50))}) + b"\x00",
        frame_with_tensor()[:-1],
        frame_with_tensor()[:12],
        msgpack.packb(msgpack.ExtType(99, b"x")),
        msgpack.packb(msgpack.ExtType(7, b"abc")),
        msgpack.packb([msgpack.ExtType(3, b""), "float32", [2], 0, 8]),
        msgpack.packb([msgpack.ExtType(2, b""), "|O", [1], 0, 8]),
        msgpack.packb([msgpack.ExtType(1, b"x")]),
        bytes(range(256)),
    ],
    ids=[
        "empty",
        "never-used-byte",
        "truncated-array",
        "truncated-tuple",
        "trailing-garbage",
        "truncated-frame",
        "frame-header-only",
        "unknown-ext-code",
        "stray-frame-code",
        "tensor-without-frame",
        "object-dtype-array",
        "tuple-mark-with-payload",
        "garbage",
    ],
)
def test_malformed_body_raises_decode_error(body):
    with pytest.raises(DecodeError):
        loads(body)


def test_tensor_with_unknown_dtype_or_wrong_size_raises_decode_error():
    good = frame_with_tensor()
    for old, new in [(b"float32", b"float99"), (b"float32", b"float64")]:
        with pytest.raises(DecodeError, match="bad tensor payload"):
            loads(good.replace(old, new))


def test_pickle_payload_is_refused_when_receiver_forbids_pickle():
    body = dumps(("ok", {1, 2}), allow_pickle=True)
    with pytest.raises(DecodeError, match="forbids pickle"):
        loads(body, allow_pickle=False)
    assert isinstance(DecodeError("x"), ValueError) and issubclass(DecodeError, CodecError)


def test_encoding_is_thread_safe():
    errors = []

    def work(i):
        try:
            for j in range(200):
                value = (i, [j, bytearray(b"%d" % j)], {"t": torch.full((3,), float(j))})
                out = loads(dumps(value))
                assert out[:2] == value[:2] and torch.equal(out[2]["t"], value[2]["t"])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)


def test_importing_and_using_codec_on_plain_data_does_not_import_torch_or_numpy():
    script = textwrap.dedent(
        """
        import sys
        from monarch.broker.bodies.codec import dumps, loads
        value = ((1, 2**80, bytearray(b"x")), {"a": [1.5, None, "s", b"b"]}, {1, 2})
        assert loads(dumps(value)) == value
        print(sorted(m for m in ("torch", "numpy") if m in sys.modules))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


def test_loads_take_uses_a_writable_buffer_in_place():
    import torch

    t = torch.arange(1000, dtype=torch.float32)
    body = bytearray(dumps((t, 1)))
    out, one = loads(body, take=True)
    assert torch.equal(out, t) and one == 1
    out[0] = 42.0  # a view into ``body``: no copy was made
    assert loads(bytes(body))[0][0].item() == 42.0
    copied, _ = loads(bytes(body), take=True)  # read-only input: still a private copy
    copied[1] = -1.0
    assert loads(bytes(body))[0][1].item() == 1.0


def test_big_out_assembles_big_bodies_in_mapped_memory_that_decodes_the_same():
    import torch

    t = torch.arange(1 << 19, dtype=torch.float32)  # 2 MiB of raw buffer
    body = dumps(({"t": t}, b"x"), big_out=True)
    assert isinstance(body, memoryview)
    out, x = loads(body)
    assert torch.equal(out["t"], t) and x == b"x"
    small = dumps((torch.ones(3), 1), big_out=True)
    assert isinstance(small, bytes)  # below 1 MiB: plain bytes as always


def test_a_torch_module_still_being_imported_is_treated_as_absent(monkeypatch):
    """Another thread half way through ``import torch`` leaves a module without ``Tensor``.

    Encoding anything that falls through to the tensor check (here a str subclass)
    used to raise "partially initialized module 'torch' has no attribute 'Tensor'".
    """
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setitem(sys.modules, "numpy", types.ModuleType("numpy"))

    class Name(str):
        pass

    assert loads(dumps({"actor": Name("a")})) == {"actor": "a"}
