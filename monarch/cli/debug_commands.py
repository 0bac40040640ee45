"""The ``monarch_dbg>`` command language (Monarch's), parsed, and which sessions a command names.

::

    list | l                         the paused sessions
    attach [ACTOR] RANK | a ...      a pdb console on one session
    cast [ACTOR] ranks(SEL) CMD      one pdb command to several sessions
    continue | c                     clear breakpoints everywhere and continue all
    help | h,   quit | q | exit

``SEL`` is ``all``, a rank (``1``), ranks (``0,2``), a range
(``start:stop:step``, each part optional: ``1:3``, ``:``), or coordinates by
dimension (``hosts=0, gpus=1:3`` or ``gpus=(0,2)``). ``ACTOR`` is a mesh's
name (or an actor id as ``list`` shows it); without one every actor mesh is
meant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Union

Values = Union[range, frozenset]  # what one selector allows: a range of ranks, or a set
Selection = Union[None, Values, dict]  # None: all; dict: dimension -> Values


class ParseError(ValueError):
    """A command line the debugger does not understand; the message says what is wrong."""


@dataclass
class ListSessions:
    pass


@dataclass
class Attach:
    rank: int
    actor: str | None = None


@dataclass
class Cast:
    command: str
    ranks: Selection = None
    actor: str | None = None


@dataclass
class ContinueAll:
    pass


@dataclass
class Help:
    pass


@dataclass
class Quit:
    pass


@dataclass
class Detach:
    pass


Command = Union[ListSessions, Attach, Cast, ContinueAll, Help, Quit, Detach]

HELP = """monarch_dbg commands:
  list                       list the paused debug sessions (actor, rank, proc, host, where stopped)
  attach [ACTOR] RANK        attach a pdb console to a session; `detach` (or Ctrl-D) comes back,
                             and so does a pdb `continue` that ends it
  cast [ACTOR] ranks(SEL) CMD
                             send one pdb command to several sessions; each rank's output is
                             printed with its rank. SEL: all | 1 | 0,2 | 1:3 | start:stop:step
                             | dim=1:3, dim2=(0,2)   e.g. cast ranks(0,2) p x   cast ranks(all) c
  continue                   clear every breakpoint and continue every session
  help                       this help
  quit                       leave the debugger; the sessions stay paused for the next one
"""

_NAME = r"[-_A-Za-z0-9.\[\]]+"
_ATTACH = re.compile(rf"^(?:a|attach)(?:\s+(?P<actor>{_NAME}))?\s+(?P<rank>-?\d+)\s*$")
_CAST = re.compile(rf"^cast\s+(?:(?P<actor>{_NAME})\s+)?ranks\((?P<rest>.*)$")
_WORDS = {
    ("l", "list"): ListSessions,
    ("c", "continue", "cont"): ContinueAll,
    ("h", "help", "?"): Help,
    ("q", "quit", "exit"): Quit,
    ("detach",): Detach,
}


def parse(line: str) -> Command | None:
    """The command on ``line``; None for an empty line. Raises :class:`ParseError`."""
    text = line.strip()
    if not text:
        return None
    for words, kind in _WORDS.items():
        if text in words:
            return kind()
    m = _ATTACH.match(text)
    if m:
        return Attach(int(m["rank"]), m["actor"])
    if text.split()[0] in ("a", "attach"):
        raise ParseError("usage: attach [ACTOR] RANK   (e.g. attach 1, or attach trainers 1)")
    if text.split()[0] == "cast":
        m = _CAST.match(text)
        close = _closing(m["rest"]) if m else -1
        if m is None or close < 0:
            raise ParseError("usage: cast [ACTOR] ranks(SEL) CMD   (e.g. cast ranks(0,2) p x)")
        sel, cmd = m["rest"][:close], m["rest"][close + 1 :].strip()
        if not cmd:
            raise ParseError("cast: which pdb command? e.g. cast ranks(all) c")
        return Cast(cmd, parse_ranks(sel), m["actor"])
    raise ParseError(f"unknown command {text.split()[0]!r}; `help` lists the commands")


def _closing(text: str) -> int:
    """Where the parenthesis opened before ``text`` closes; -1 if it does not."""
    depth = 1
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return i
    return -1


def parse_ranks(text: str) -> Selection:
    """``ranks(...)``'s inside (see the module's docstring); None means every rank."""
    text = text.strip()
    if text in ("all", "*", ":", "::"):
        return None
    if not text:
        raise ParseError("ranks(): say which, e.g. ranks(0), ranks(0,2), ranks(1:3), ranks(all)")
    if "=" in text:
        dims: dict[str, Values] = {}
        for part in _split_dims(text):
            name, _, value = part.partition("=")
            name = name.strip()
            if not re.fullmatch(r"[A-Za-z_]\w*", name):
                raise ParseError(f"ranks({text}): {name!r} is not a dimension name")
            dims[name] = _values(value.strip().removeprefix("(").removesuffix(")"), text)
        return dims
    return _values(text, text)


def _split_dims(text: str) -> list[str]:
    """``a=1:3, b=(0,2)`` -> ``["a=1:3", "b=(0,2)"]`` (commas inside parentheses stay)."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p for p in (p.strip() for p in parts) if p]


def _values(text: str, whole: str) -> Values:
    try:
        if ":" in text:
            bits = [b.strip() for b in text.split(":")]
            if len(bits) > 3:
                raise ValueError
            start = int(bits[0]) if bits[0] else 0
            stop = int(bits[1]) if len(bits) > 1 and bits[1] else 1 << 62
            step = int(bits[2]) if len(bits) > 2 and bits[2] else 1
            if step <= 0:
                raise ValueError
            return range(start, stop, step)
        return frozenset(int(v) for v in text.split(","))
    except ValueError:
        raise ParseError(
            f"ranks({whole}): not a rank selection; e.g. 1, or 0,2, or 1:3, or all"
        ) from None


def actor_matches(info: dict[str, Any], actor: str | None) -> bool:
    return actor is None or actor in (info.get("mesh"), info.get("actor"))


def selected(info: dict[str, Any], ranks: Selection, actor: str | None = None) -> bool:
    """Whether the session ``info`` (as ``list`` answers it) is among ``ranks`` of ``actor``."""
    if not actor_matches(info, actor):
        return False
    if ranks is None:
        return True
    if isinstance(ranks, dict):
        coords = info.get("coords") or {}
        return all(dim in coords and coords[dim] in vals for dim, vals in ranks.items())
    return info.get("rank") in ranks
