"""The wire form of replies that answer for several ranks: ``Mon-Reduce``, ``Mon-Ranks``.

A call from an ``Accumulator`` given a reducer carries the reducer in its
``Mon-Reduce`` header; a reply merged on its proc names the ranks it answers
for in ``Mon-Ranks`` (:mod:`monarch.actors.hosting.reduce` merges, the caller's
:class:`~monarch.actors.calls.gather.Gather` folds). A reply to any other call
that names ``Mon-Ranks`` was *gathered* on its proc: its body is the list of
those ranks' values, in that order (:func:`gathered_body`).
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable, Iterable
from typing import Any

import msgpack

from monarch.broker.bodies.codec import dumps, loads

MAX_RANKS = 1 << 20  # a Mon-Ranks header naming more ranks than this is malformed


def encode_reducer(reducer: Callable[[Any, Any], Any]) -> str:
    """``Mon-Reduce``'s value: a readable name, a space, then the reducer encoded as a body
    (pickle, so ``MONARCH_PICKLE=0`` refuses it at the caller) in base64."""
    if not callable(reducer):
        raise TypeError(f"reducer must be callable, not {type(reducer).__name__}")
    name = getattr(reducer, "__qualname__", None) or type(reducer).__qualname__
    module = getattr(reducer, "__module__", None)
    label = f"{module}.{name}" if module else name
    label = "".join(c if c.isprintable() and not c.isspace() else "_" for c in label)
    return f"{label[:80]} {base64.b64encode(dumps(reducer, wire='msgpack')).decode('ascii')}"


@functools.lru_cache(maxsize=64)
def decode_reducer(text: str) -> Callable[[Any, Any], Any]:
    """The reducer a ``Mon-Reduce`` header carries (each distinct one decoded once)."""
    _, _, payload = text.rpartition(" ")
    reducer = loads(base64.b64decode(payload, validate=True))
    if not callable(reducer):
        raise TypeError(f"Mon-Reduce carries a {type(reducer).__name__}, not a function")
    return reducer


def encode_ranks(ranks: Iterable[int]) -> str:
    """Ranks as ``Mon-Ranks`` writes them: sorted, runs as ``a-b`` (``0-5,8``)."""
    parts: list[str] = []
    run: list[int] = []
    for r in sorted(ranks):
        if run and r == run[-1] + 1:
            run[-1] = r
            continue
        if run:
            parts.append(f"{run[0]}-{run[1]}" if run[1] != run[0] else str(run[0]))
        run = [r, r]
    if run:
        parts.append(f"{run[0]}-{run[1]}" if run[1] != run[0] else str(run[0]))
    return ",".join(parts)


def decode_ranks(text: str) -> list[int]:
    """The ranks of a ``Mon-Ranks`` header; ValueError if it is malformed (or absurdly long)."""
    ranks: list[int] = []
    ascending = True  # as encode_ranks writes them: then no rank can come twice
    for part in text.split(","):
        first, dash, last = part.partition("-")
        lo = int(first)
        hi = int(last) if dash else lo
        if lo < 0 or hi < lo or len(ranks) + hi - lo + 1 > MAX_RANKS:
            raise ValueError(f"bad Mon-Ranks entry {part!r}")
        if ranks and lo <= ranks[-1]:
            ascending = False
        ranks.extend(range(lo, hi + 1))
    if not ascending and len(set(ranks)) != len(ranks):
        raise ValueError("Mon-Ranks names a rank twice")
    return ranks


def gathered_body(bodies: list[bytes]) -> bytes:
    """One body whose value is the list of ``bodies``' values, each of them
    :func:`~monarch.broker.bodies.codec.plain_msgpack`: a msgpack array header, then
    the bodies as they are (nothing is decoded or encoded again)."""
    return msgpack.Packer().pack_array_header(len(bodies)) + b"".join(bodies)
