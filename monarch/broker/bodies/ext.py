"""The one registry of extension types both wire modes share, and the codec errors.

A type registered here (:func:`register_ext`: a mesh reference, a port, an
error) travels as itself in either wire mode: the msgpack codec
(:mod:`monarch.broker.bodies.codec`) writes it as a marker array of its code, the JSON
mode (:mod:`monarch.broker.bodies.json_wire`) as ``{"$ext": code, "value": ...}``.
Neither codec keeps a registry of its own or reaches into the other's.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from msgpack import ExtType

__all__ = ["CodecError", "DecodeError", "EncodeError", "PicklingForbiddenError"]
__all__ += ["Ext", "by_class", "by_code", "for_value", "register_ext", "type_name"]

FIRST_CODE, LAST_CODE = 16, 127  # 1..15 are the msgpack codec's own
# Types both codecs encode themselves: they cannot be registered.
NATIVE = frozenset((type(None), bool, int, float, str, bytes, bytearray, list, tuple, dict))


class CodecError(Exception):
    """Base of the errors ``dumps`` and ``loads`` raise."""


class EncodeError(CodecError, TypeError):
    """The value cannot be turned into a message body; the message names the type and why."""


class PicklingForbiddenError(EncodeError):
    """The value needs cloudpickle, which ``MONARCH_PICKLE=0`` (or ``allow_pickle=False``) forbids."""


class DecodeError(CodecError, ValueError):
    """The bytes are not a body this codec (with its current settings) can decode."""


@dataclass(frozen=True)
class Ext:
    """One registered type: its code, and how its value is turned into fields and back."""

    code: int
    cls: type
    encode: Callable[[Any], Any]  # the value -> anything the codecs can encode
    decode: Callable[[Any], Any]  # that, decoded -> the value
    marker: ExtType  # the empty ext that opens the msgpack marker array


_by_class: dict[type, Ext] = {}
_by_code: dict[int, Ext] = {}
_lock = threading.Lock()
# Read-only view for the codecs' hot path: the registration of exactly this class.
by_class: Mapping[type, Ext] = MappingProxyType(_by_class)


def register_ext(
    code: int, cls: type, encode: Callable[[Any], Any], decode: Callable[[Any], Any]
) -> None:
    """Give ``cls`` (and its subclasses, unless registered themselves) its own ext code.

    ``encode(obj)`` returns any value the codecs can encode (tuples, tensors and
    other registered types included); ``decode`` receives that value back, decoded.
    Raises ValueError if ``code`` is outside 16..127 or taken, or if ``cls`` is
    registered already or is a type the codecs encode natively.
    """
    if type(code) is not int or not FIRST_CODE <= code <= LAST_CODE:
        raise ValueError(
            f"ext code must be an int in 16..127 (1..15 are the codec's), got {code!r}"
        )
    if not isinstance(cls, type) or cls in NATIVE:
        raise ValueError(f"cannot register {cls!r}: not a class, or one the codec encodes itself")
    with _lock:
        if code in _by_code or cls in _by_class:
            raise ValueError(f"cannot register {cls.__qualname__} as {code}: already registered")
        ext = Ext(code, cls, encode, decode, ExtType(code, b""))
        _by_class[cls] = ext
        _by_code[code] = ext


def for_value(obj: Any) -> Ext | None:
    """The registration that encodes ``obj``: its class's, else its first registered base's."""
    ext = _by_class.get(type(obj))
    if ext is None:
        base = next((c for c in list(_by_class) if isinstance(obj, c)), None)
        ext = _by_class.get(base) if base is not None else None
    return ext


# Where each of monarch's own codes is registered. A receiver may meet one before it
# has imported that module (a proc whose first message carries a ProcMesh): the
# module is imported then, by name, as pickle imports a class's module. By name so
# that this layer depends on none of them (the import-linter contracts).
HOME_MODULES: Mapping[int, str] = MappingProxyType(
    {
        16: "monarch.actors.calls.actor_mesh",
        17: "monarch.actors.calls.ports",
        18: "monarch.actors.procs.proc_mesh",
        19: "monarch.actors.procs.host_mesh",
        20: "monarch.rdma.buffer",
        21: "monarch.rdma.bulk",
        48: "monarch.tensors.wire",
        49: "monarch.tensors.wire",
        50: "monarch.tensors.tensor",
    }
)


def by_code(code: Any) -> Ext | None:
    """The registration of ``code`` (None for an unknown one); imports the module that
    registers one of monarch's own codes if nobody has yet (:data:`HOME_MODULES`)."""
    if type(code) is not int:
        return None
    registered = _by_code.get(code)
    if registered is None and code in HOME_MODULES:
        importlib.import_module(HOME_MODULES[code])
        registered = _by_code.get(code)
    return registered


def type_name(obj: Any) -> str:
    """``obj``'s type as error messages name it (``dict``, ``mymod.Point``)."""
    t = type(obj)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
