"""``Uid`` and ``ProcId``: Monarch 0.7's identity values, as plain Python values.

In Monarch they name hyperactor's actors and procs and route messages. Here
a message is routed by its NATS subject, so these route nothing: they are
the values Monarch's scripts and launchers make, print, parse, compare and
hand to workers through the environment (see ``monarch.job``'s
service-identity helpers), with the same constructors and properties.

Text form (what ``str()`` gives and ``from_string`` reads): an instance uid
is ``label<hex>`` (``service<00c0ffee12345678>``; no label: ``<hex>``), 64
bits in 16 hex digits; a singleton uid is its bare name (``service``). A
``ProcId``'s text is its uid's.
"""

from __future__ import annotations

import re
import secrets

_INSTANCE = re.compile(r"^([A-Za-z0-9_.-]*)<([0-9a-fA-F]{1,16})>$")
_SINGLETON = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_LABEL = re.compile(r"^[A-Za-z0-9_.-]*$")


def _check_label(label: str | None) -> str | None:
    if label is not None and (not isinstance(label, str) or not _LABEL.fullmatch(label)):
        raise ValueError(f"a uid label is letters, digits, '_', '.' and '-', got {label!r}")
    return label or None


class Uid:
    """A unique identifier: an instance (a 64-bit value, maybe labelled) or a singleton name."""

    __slots__ = ("_label", "_value")

    def __init__(self, label: str | None, value: int | None) -> None:
        self._label = label
        self._value = value

    @staticmethod
    def anonymous() -> Uid:
        """A fresh instance uid with no label."""
        return Uid(None, secrets.randbits(64))

    @staticmethod
    def instance(label: str | None = None) -> Uid:
        """A fresh instance uid (random 64-bit value) shown with ``label``."""
        return Uid(_check_label(label), secrets.randbits(64))

    @staticmethod
    def instance_from_value(value: int, label: str | None = None) -> Uid:
        """The instance uid of ``value`` (0 <= value < 2**64): the same value, the same uid."""
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
            raise ValueError(f"a uid value is an int in [0, 2**64), got {value!r}")
        return Uid(_check_label(label), value)

    @staticmethod
    def from_string(uid: str) -> Uid:
        """Parse ``str(uid)`` back; ValueError naming the text if it is not one."""
        if isinstance(uid, str):
            m = _INSTANCE.fullmatch(uid)
            if m:
                return Uid(m.group(1) or None, int(m.group(2), 16))
            if _SINGLETON.fullmatch(uid):
                return Uid(uid, None)
        raise ValueError(f"not a uid: {uid!r} (expected 'label<hex>', '<hex>' or a name)")

    @property
    def label(self) -> str | None:
        return self._label

    @property
    def is_instance(self) -> bool:
        return self._value is not None

    @property
    def is_singleton(self) -> bool:
        return self._value is None

    @property
    def instance_value(self) -> int | None:
        return self._value

    def __str__(self) -> str:
        if self._value is None:
            return str(self._label)
        return f"{self._label or ''}<{self._value:016x}>"

    def __repr__(self) -> str:
        return f"Uid({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Uid) and (self._label, self._value) == (other._label, other._value)

    def __hash__(self) -> int:
        return hash((Uid, self._label, self._value))

    def __reduce__(self) -> tuple:
        return (Uid, (self._label, self._value))


class ProcId:
    """The identity of a proc: a :class:`Uid`."""

    __slots__ = ("_uid",)

    def __init__(self, uid: Uid) -> None:
        if not isinstance(uid, Uid):
            raise TypeError(f"ProcId takes a Uid, got {type(uid).__name__}")
        self._uid = uid

    @staticmethod
    def from_string(proc_id: str) -> ProcId:
        """Parse ``str(proc_id)`` back; ValueError if it is not one."""
        return ProcId(Uid.from_string(proc_id))

    @property
    def uid(self) -> Uid:
        return self._uid

    @property
    def label(self) -> str | None:
        return self._uid.label

    def __str__(self) -> str:
        return str(self._uid)

    def __repr__(self) -> str:
        return f"ProcId({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcId) and self._uid == other._uid

    def __hash__(self) -> int:
        return hash((ProcId, self._uid))

    def __reduce__(self) -> tuple:
        return (ProcId, (self._uid,))
