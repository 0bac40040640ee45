"""``MONARCH_WIRE=json``: message bodies as JSON a person can read in ``nats sub``.

A debugging mode: slower and bigger than msgpack (tensors become base64), but
every body prints as text. JSON lacks tuples, bytes, tensors and non-string
keys, so those become one-key objects tagged with ``$``:

===============================  ============================================
``{"$tuple": [...]}``            a tuple
``{"$bytes": "<base64>"}``       bytes (``$bytearray`` for a bytearray)
``{"$tensor": {...}}``           a torch tensor: ``dtype``, ``shape``, base64 ``data``
``{"$ndarray": {...}}``          a numpy array, the same way
``{"$ext": code, "value": v}``   a type registered with ``ext.register_ext``
``{"$pickle": "<base64>"}``      anything else (cloudpickle; ``MONARCH_PICKLE=0`` forbids)
``{"$dict": [[k, v], ...]}``     a dict with a non-string key or a key starting with ``$``
===============================  ============================================

A JSON body always ends with a newline, which makes it at least two bytes
long and starting below 0x80; no msgpack body does both (a msgpack value
that starts below 0x80 is a one-byte integer), so :func:`monarch.broker.bodies.codec.loads`
tells the two apart by looking, and a deployment may mix both modes.
"""

from __future__ import annotations

import base64
import ctypes
import json
import sys
from typing import Any

import cloudpickle

from monarch.broker.bodies import ext
from monarch.broker.bodies.ext import CodecError, DecodeError, EncodeError, PicklingForbiddenError


def _b64(raw: bytes | bytearray | memoryview) -> str:
    return base64.b64encode(raw).decode("ascii")


class _Encoder:
    def __init__(self, allow_pickle: bool) -> None:
        self.allow_pickle = allow_pickle

    def enc(self, obj: Any) -> Any:
        t = type(obj)
        if obj is None or t in (bool, int, float, str):
            return obj
        if t is list:
            return [self.enc(v) for v in obj]
        if t is dict:
            if all(type(k) is str and not k.startswith("$") for k in obj):
                return {k: self.enc(v) for k, v in obj.items()}
            return {"$dict": [[self.enc(k), self.enc(v)] for k, v in obj.items()]}
        if t is tuple:
            return {"$tuple": [self.enc(v) for v in obj]}
        if t is bytes:
            return {"$bytes": _b64(obj)}
        if t is bytearray:
            return {"$bytearray": _b64(obj)}
        torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
        if torch is not None and t in (torch.Tensor, torch.nn.Parameter):
            if obj.layout == torch.strided and not obj.is_quantized and not obj.is_meta:
                return {"$tensor": _tensor(obj)}
        if np is not None and t is np.ndarray:
            if not obj.dtype.hasobject and obj.dtype.fields is None:
                return {"$ndarray": _ndarray(np, obj)}
        registered = ext.for_value(obj)
        if registered is not None:
            return {"$ext": registered.code, "value": self.enc(registered.encode(obj))}
        return {"$pickle": self._pickle(obj)}

    def _pickle(self, obj: Any) -> str:
        if not self.allow_pickle:
            raise PicklingForbiddenError(
                f"cannot send a {ext.type_name(obj)}: it needs pickle, which is off "
                "(MONARCH_PICKLE=0 or allow_pickle=False)"
            )
        try:
            return _b64(cloudpickle.dumps(obj, protocol=5))
        except Exception as e:
            raise EncodeError(
                f"cannot send a {ext.type_name(obj)}: cloudpickle failed: {type(e).__name__}: {e}"
            ) from e


def _tensor(t: Any) -> dict[str, Any]:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    nbytes = t.numel() * t.element_size()
    raw = ctypes.string_at(t.data_ptr(), nbytes) if nbytes else b""
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "data": _b64(raw)}


def _ndarray(np: Any, a: Any) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    return {"dtype": a.dtype.str, "shape": list(a.shape), "data": _b64(a.tobytes())}


def dumps(obj: Any, *, allow_pickle: bool) -> bytes:
    """``obj`` as a JSON body (see the module docstring); raises the codec's errors."""
    try:
        text = json.dumps(
            _Encoder(allow_pickle).enc(obj), ensure_ascii=False, separators=(",", ":")
        )
    except CodecError:
        raise
    except Exception as e:
        raise EncodeError(
            f"cannot encode a {ext.type_name(obj)} as JSON: {type(e).__name__}: {e}"
        ) from e
    return text.encode() + b"\n"


class _Decoder:
    def __init__(self, allow_pickle: bool) -> None:
        self.allow_pickle = allow_pickle

    def hook(self, d: dict[str, Any]) -> Any:
        if len(d) == 1:
            ((tag, v),) = d.items()
            if tag == "$tuple":
                return tuple(v)
            if tag == "$bytes":
                return base64.b64decode(v)
            if tag == "$bytearray":
                return bytearray(base64.b64decode(v))
            if tag == "$dict":
                return {k: val for k, val in v}  # tuple keys arrive decoded already
            if tag == "$tensor":
                return _build_tensor(v)
            if tag == "$ndarray":
                import numpy as np

                dtype = np.dtype(v["dtype"])
                if dtype.hasobject:
                    raise DecodeError("bad array payload: object dtype")
                data = bytearray(base64.b64decode(v["data"]))
                return np.frombuffer(data, dtype).reshape(v["shape"])
            if tag == "$pickle":
                if not self.allow_pickle:
                    raise DecodeError(
                        "the body holds a pickled value and this receiver forbids pickle"
                        " (MONARCH_PICKLE=0 or allow_pickle=False)"
                    )
                return cloudpickle.loads(base64.b64decode(v))
        if "$ext" in d:
            registered = ext.by_code(d["$ext"])
            if registered is None:
                raise DecodeError(f"unknown ext code {d['$ext']!r}")
            return registered.decode(d.get("value"))
        if any(type(k) is str and k.startswith("$") for k in d):
            raise DecodeError(f"unknown tagged object {sorted(d)!r}")
        return d


def _build_tensor(v: dict[str, Any]) -> Any:
    import torch

    dtype = getattr(torch, v["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise DecodeError(f"bad tensor payload: unknown dtype {v['dtype']!r}")
    data = bytearray(base64.b64decode(v["data"]))
    if not data:
        return torch.empty(v["shape"], dtype=dtype)
    return torch.frombuffer(data, dtype=dtype).reshape(v["shape"])


def loads(data: bytes | bytearray | memoryview, *, allow_pickle: bool) -> Any:
    """The value of a JSON body made by :func:`dumps`; raises the codec's DecodeError."""
    try:
        return json.loads(bytes(data), object_hook=_Decoder(allow_pickle).hook)
    except CodecError:
        raise
    except Exception as e:
        raise DecodeError(f"malformed JSON body: {type(e).__name__}: {e}") from e
