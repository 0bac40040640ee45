"""Message bodies: Python values to bytes and back.

A body is msgpack: fast for the small control messages that dominate traffic
and readable by any msgpack tool. msgpack alone would turn tuples into lists
and drop subclasses, so what it cannot carry exactly uses extension types
(codes 1..15 are the codec's, 16..127 are for types registered in
:mod:`monarch.broker.bodies.ext`, the registry this codec shares with the JSON mode):

* **Marker arrays** (tuple, ndarray, tensor, bytearray, registered types): an
  array whose first item is an empty ext of the type's code, followed by the
  fields, all in the one msgpack stream. Unlike an ext whose payload is a
  nested msgpack blob, this needs no nested pack/unpack and no copy per level.
* **Payload exts**: cloudpickle (4) for everything else, ints beyond 64 bits (6).
* **Raw buffers** (tensors, numpy arrays, bytearrays) travel out of band in the
  same body: ``fixext8(code 7, len(msgpack part))``, the msgpack part, then the
  buffers back to back; the marker array holds dtype, shape, offset and length.
  So encoding copies a buffer once (into the body) however deep it sits, and
  decoding once (into fresh writable memory). Bodies without buffers are plain
  msgpack.

torch and numpy are never imported here: a value is a tensor only if torch is
already in ``sys.modules``; decoding a tensor imports torch at that point.
"""

from __future__ import annotations

import math
import struct
import sys
import threading
from collections.abc import Callable
from typing import Any

import cloudpickle
from msgpack import ExtType, Packer, unpackb

from monarch.broker.bodies import buffers, ext, json_wire
from monarch.broker.bodies.ext import (
    CodecError,
    DecodeError,
    EncodeError,
    PicklingForbiddenError,
    register_ext,
)
from monarch.broker.bodies.ext import type_name as _type_name
from monarch.broker.settings import settings

__all__ = ["CodecError", "DecodeError", "EncodeError", "PicklingForbiddenError"]
__all__ += ["dumps", "loads", "register_ext"]


_TUPLE, _NDARRAY, _TENSOR, _PICKLE, _BYTEARRAY, _BIGINT, _FRAME = 1, 2, 3, 4, 5, 6, 7
_FRAME_HEAD = struct.Struct(">BbQ")  # msgpack fixext8: 0xd7, code, 8-byte length
_PACKER_KEEPS = 1 << 20  # a Packer keeps its largest buffer; replace it after bigger bodies
_LEAVES = frozenset((type(None), bool, int, float, str, bytes, tuple))
_SCALARS = frozenset((type(None), bool, int, float, str, bytes))  # msgpack packs them alone


class _Mark:
    """What the decoder sees for a marker ext; ``build(decoder, [mark, *fields])`` makes the value."""

    __slots__ = ("build", "ext")

    def __init__(self, code: int, build: Callable[[_Decoder, list], Any]) -> None:
        self.ext, self.build = ExtType(code, b""), build


# code -> mark of the codec's own marker codes, and of registered ones once seen
_marks: dict[int, _Mark] = {}


def _mark_of(code: int) -> _Mark | None:
    """The decoder's mark for a marker ext of ``code``: the codec's own or a registered type's."""
    mark = _marks.get(code)
    if mark is None:
        registered = ext.by_code(code)
        if registered is not None:
            decode = registered.decode
            mark = _marks[code] = _Mark(code, lambda _decoder, items: decode(items[1]))
    return mark


def _has_bytearray(values: Any) -> bool:
    """Whether ``values`` reach a bytearray through lists and dicts (tuples go through _default).

    msgpack packs a bytearray as bin, which comes back as bytes, and offers no
    hook for it, so containers are looked through before packing.
    """
    if len(values) > 16 and _LEAVES.issuperset(map(type, values)):
        return False  # long flat containers: one pass in C
    for v in values:
        t = type(v)
        if t is bytearray or (t is list and _has_bytearray(v)):
            return True
        if t is dict and _has_bytearray(v.values()):
            return True
    return False


class _Encoder:
    """Runs one ``dumps`` at a time; msgpack calls ``_default`` for what it does not pack itself.

    Each thread keeps one per ``allow_pickle`` value, so the hot path allocates
    no Packer; a nested ``dumps`` (from a registered encode hook) gets a fresh one.
    """

    def __init__(self, allow_pickle: bool) -> None:
        self.allow_pickle, self.busy, self.size = allow_pickle, False, 0
        self.big_out = False
        self.buffers: list[Any] = []  # out-of-band buffers, in offset order
        self.keep: list[Any] = []  # tensors whose memory ``buffers`` point into
        self.packer = Packer(default=self._default, use_bin_type=True, strict_types=True)

    def encode(self, obj: Any) -> bytes:
        self.busy = True
        try:
            body = self.packer.pack(self._prepare(obj))
            if len(body) > _PACKER_KEEPS:
                self.packer = Packer(default=self._default, use_bin_type=True, strict_types=True)
            if not self.buffers:
                return body
            head = _FRAME_HEAD.pack(0xD7, _FRAME, len(body))
            if self.big_out and self.size >= _BIG_BODY:
                return _assemble_big([head, body, *self.buffers])
            return b"".join([head, body, *self.buffers])
        finally:
            self.buffers.clear()
            self.keep.clear()
            self.size, self.busy = 0, False

    def _prepare(self, obj: Any) -> Any:
        return self._rewrite(obj) if _has_bytearray((obj,)) else obj

    def _rewrite(self, obj: Any) -> Any:
        """``obj`` with bytearrays (outside tuples) replaced by their marker arrays."""
        t = type(obj)
        if t is list:
            return [self._rewrite(v) for v in obj]
        if t is dict:
            return {k: self._rewrite(v) for k, v in obj.items()}
        if t is bytearray:
            return [_BYTEARRAY_EXT, self._add_buffer(memoryview(obj), len(obj)), len(obj)]
        return obj

    def _add_buffer(self, raw: Any, nbytes: int) -> int:
        offset = self.size
        if nbytes:
            self.buffers.append(raw)
            self.size += nbytes
        return offset

    def _default(self, obj: Any) -> Any:
        t = type(obj)
        if t is tuple:
            return [_TUPLE_EXT, *(map(self._rewrite, obj) if _has_bytearray(obj) else obj)]
        registered = ext.by_class.get(t)
        if registered is None:
            # getattr, not attribute access: another thread may be half way through
            # ``import torch``, and a class that does not exist yet is no match.
            torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
            if torch is not None and t in (
                getattr(torch, "Tensor", None),
                getattr(getattr(torch, "nn", None), "Parameter", None),
            ):
                if obj.layout == torch.strided and not obj.is_quantized and not obj.is_meta:
                    return self._tensor(obj)
            if np is not None and t is getattr(np, "ndarray", None):
                if not obj.dtype.hasobject and obj.dtype.fields is None:
                    return self._ndarray(np, obj)
            registered = ext.for_value(obj)
        if registered is not None:
            return [registered.marker, self._prepare(registered.encode(obj))]
        if t is int:  # beyond 64 bits
            return ExtType(_BIGINT, obj.to_bytes((obj.bit_length() + 8) // 8, "big", signed=True))
        return self._pickle(obj)

    def _tensor(self, t: Any) -> list:
        import ctypes

        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.resolve_conj().resolve_neg().contiguous()
        nbytes = t.numel() * t.element_size()
        raw = (ctypes.c_char * nbytes).from_address(t.data_ptr()) if nbytes else b""
        self.keep.append(t)
        dtype = str(t.dtype).removeprefix("torch.")
        return [_TENSOR_EXT, dtype, list(t.shape), self._add_buffer(raw, nbytes), nbytes]

    def _ndarray(self, np: Any, a: Any) -> list:
        if not a.flags.c_contiguous:
            a = a.copy(order="C")
        raw = memoryview(a.reshape(-1).view(np.uint8))
        return [_NDARRAY_EXT, a.dtype.str, list(a.shape), self._add_buffer(raw, a.nbytes), a.nbytes]

    def _pickle(self, obj: Any) -> ExtType:
        if not self.allow_pickle:
            raise PicklingForbiddenError(
                f"cannot send a {_type_name(obj)}: it needs pickle, which is off (MONARCH_PICKLE=0"
                " or allow_pickle=False). Set MONARCH_PICKLE=1, or send only None, bool, int,"
                " float, str, bytes, bytearray, list, tuple, dict, torch tensors, numpy arrays"
                " and types registered with monarch.broker.bodies.ext.register_ext."
            )
        try:
            return ExtType(_PICKLE, cloudpickle.dumps(obj, protocol=5))
        except Exception as e:
            reason = f"{type(e).__name__}: {e}"
            raise EncodeError(
                f"cannot send a {_type_name(obj)}: cloudpickle failed: {reason}"
            ) from e


class _Encoders(threading.local):
    def __init__(self) -> None:
        self.by_allow = {True: _Encoder(True), False: _Encoder(False)}


_encoders = _Encoders()


_BIG_BODY = 1 << 20  # raw buffers from this size may be assembled in pre-faulted memory


def _assemble_big(parts: list) -> memoryview:
    """Join ``parts`` into anonymous memory whose pages are mapped up front.

    Copying into a fresh ``bytes`` object faults its pages in one by one while
    holding the GIL (about 2 GB/s here); MAP_POPULATE maps them in one system
    call, so the copy itself runs near memcpy speed (entry 11 of NOTES).
    """
    views = [memoryview(p).cast("B") for p in parts]
    out = buffers.take(sum(v.nbytes for v in views))
    pos = 0
    for v in views:
        buffers.copy_into(out, pos, v)
        pos += v.nbytes
    return out


def dumps(
    obj: Any, *, allow_pickle: bool | None = None, wire: str | None = None, big_out: bool = False
) -> bytes:
    """Encode ``obj`` as a message body; :func:`loads` gives back an equal value of the same type.

    Tensors come back detached and on CPU; tensors and numpy arrays travel
    bit-exactly without pickle. ``allow_pickle=None`` means ``MONARCH_PICKLE``;
    ``wire=None`` means ``MONARCH_WIRE`` (``"json"``: readable JSON, see
    :mod:`monarch.broker.bodies.json_wire`; bodies that must stay msgpack pass ``"msgpack"``).
    Raises PicklingForbiddenError if the value needs pickle and pickle is off,
    EncodeError if it cannot be encoded at all. Thread-safe. ``big_out=True``
    lets a body carrying 1 MiB or more of raw buffers come back as a memoryview
    of pre-faulted anonymous memory instead of ``bytes`` (for bodies that go
    out of band: see monarch.rdma.bulk).
    """
    cfg = settings()
    allow = cfg.pickle if allow_pickle is None else bool(allow_pickle)
    if (wire or cfg.wire) == "json":
        return json_wire.dumps(obj, allow_pickle=allow)
    enc = _encoders.by_allow[allow]
    if type(obj) in _SCALARS and not enc.busy:
        # Nothing to look through, nothing out of band: msgpack's own bytes, which are
        # the full path's (a reply is mostly such a value: 0.5 -> 0.3 us a body).
        try:
            return enc.packer.pack(obj)
        except Exception:  # a big int (the codec's ext), a str msgpack refuses: as below
            pass
    enc = _Encoder(allow) if enc.busy else enc
    enc.big_out = big_out
    try:
        return enc.encode(obj)
    except CodecError:
        raise
    except Exception as e:
        raise EncodeError(f"cannot encode a {_type_name(obj)}: {type(e).__name__}: {e}") from e


class _Decoder:
    """msgpack hooks for one body; ``region`` is its out-of-band buffer area."""

    __slots__ = ("allow_pickle", "region", "take")

    def __init__(self, allow_pickle: bool, region: memoryview, take: bool = False) -> None:
        self.allow_pickle, self.region, self.take = allow_pickle, region, take

    def ext_hook(self, code: int, data: bytes) -> Any:
        mark = _mark_of(code) if not data else None
        if mark is not None:
            return mark
        if code == _PICKLE:
            if not self.allow_pickle:
                raise DecodeError(
                    "the body holds a pickled value and this receiver forbids pickle"
                    " (MONARCH_PICKLE=0 or allow_pickle=False)"
                )
            return cloudpickle.loads(data)
        if code == _BIGINT:
            return int.from_bytes(data, "big", signed=True)
        raise DecodeError(f"unknown or malformed ext code {code} ({len(data)} bytes)")

    def list_hook(self, items: list) -> Any:
        if items and type(items[0]) is _Mark:
            return items[0].build(self, items)
        return items

    def raw(self, offset: Any, nbytes: Any, shape: Any = None, itemsize: int = 1) -> bytearray:
        """A writable copy of ``nbytes`` at ``offset``, checked against ``shape`` of ``itemsize``."""
        if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 0:
            raise DecodeError(f"bad buffer reference {offset!r}+{nbytes!r}")
        if shape is not None:
            if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
                raise DecodeError(f"bad tensor payload: shape {shape!r}")
            if math.prod(shape) * itemsize != nbytes:
                raise DecodeError(
                    f"bad tensor payload: shape {shape} does not match {nbytes} bytes"
                )
        if offset + nbytes > len(self.region):
            raise DecodeError(f"bad buffer reference: {offset}+{nbytes} > {len(self.region)} bytes")
        if self.take and shape is not None and not self.region.readonly:
            return self.region[offset : offset + nbytes]  # a view: the caller gave us the buffer
        return bytearray(self.region[offset : offset + nbytes])

    def build_tuple(self, items: list) -> tuple:
        del items[0]
        return tuple(items)

    def build_bytearray(self, items: list) -> bytearray:
        _, offset, nbytes = items
        return self.raw(offset, nbytes)

    def build_tensor(self, items: list) -> Any:
        import torch

        _, name, shape, offset, nbytes = items
        dtype = getattr(torch, name, None) if type(name) is str else None
        if not isinstance(dtype, torch.dtype):
            raise DecodeError(f"bad tensor payload: unknown dtype {name!r}")
        data = self.raw(offset, nbytes, shape, dtype.itemsize)
        if not nbytes:  # torch.frombuffer refuses empty buffers
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(data, dtype=dtype).reshape(shape)

    def build_ndarray(self, items: list) -> Any:
        import numpy as np

        _, name, shape, offset, nbytes = items
        dtype = np.dtype(name)
        if dtype.hasobject:
            raise DecodeError("bad array payload: object dtype")
        return np.frombuffer(self.raw(offset, nbytes, shape, dtype.itemsize), dtype).reshape(shape)


_TYPE_MARKS = {
    _TUPLE: _Mark(_TUPLE, _Decoder.build_tuple),
    _NDARRAY: _Mark(_NDARRAY, _Decoder.build_ndarray),
    _TENSOR: _Mark(_TENSOR, _Decoder.build_tensor),
    _BYTEARRAY: _Mark(_BYTEARRAY, _Decoder.build_bytearray),
}
_marks.update(_TYPE_MARKS)
_TUPLE_EXT, _NDARRAY_EXT, _TENSOR_EXT, _BYTEARRAY_EXT = (m.ext for m in _TYPE_MARKS.values())
_plain_decoders = {allow: _Decoder(allow, memoryview(b"")) for allow in (True, False)}


def plain_msgpack(body: bytes) -> bool:
    """Whether ``body`` (made by :func:`dumps`) is one msgpack object with nothing out of
    band: not JSON, not a frame of raw buffers. Such bodies concatenated after a
    msgpack array header decode as the list of their values (a reply gathered on its
    proc, :func:`monarch.actors.messaging.reduction.gathered_body`)."""
    n = len(body)
    if not n or (n > 1 and body[0] < 0x80):  # empty, or JSON (every JSON body ends in \n)
        return False
    return not (n >= 2 and body[0] == 0xD7 and body[1] == _FRAME)


def loads(
    data: bytes | bytearray | memoryview, *, allow_pickle: bool | None = None, take: bool = False
) -> Any:
    """Decode a body made by :func:`dumps`. Tensors and arrays come back writable, on CPU.

    The result shares no memory with ``data``, unless ``take`` is true and
    ``data`` is writable: then the caller hands the buffer over (it must not
    reuse it) and tensors and arrays are views into it, with no copy (used for
    big bodies fetched out of band). ``allow_pickle=None`` means
    ``MONARCH_PICKLE``. Raises DecodeError for malformed bytes, unknown ext
    codes, and pickled values when pickle is off. Either wire mode is accepted,
    whatever ``MONARCH_WIRE`` says. Thread-safe.
    """
    allow = settings().pickle if allow_pickle is None else bool(allow_pickle)
    if len(data) > 1 and data[0] < 0x80:  # JSON: no msgpack body of 2+ bytes starts so
        return json_wire.loads(data, allow_pickle=allow)
    try:
        if len(data) >= _FRAME_HEAD.size and data[0] == 0xD7 and data[1] == _FRAME:
            view = memoryview(data)
            end = _FRAME_HEAD.size + _FRAME_HEAD.unpack_from(view)[2]
            if end > len(view):
                raise DecodeError(f"truncated body: its frame says {end} bytes, got {len(view)}")
            dec, data = _Decoder(allow, view[end:], take), view[_FRAME_HEAD.size : end]
        else:
            dec = _plain_decoders[allow]
        return unpackb(
            data, ext_hook=dec.ext_hook, list_hook=dec.list_hook, raw=False, strict_map_key=False
        )
    except CodecError:
        raise
    except Exception as e:
        raise DecodeError(f"malformed message body: {type(e).__name__}: {e}") from e
