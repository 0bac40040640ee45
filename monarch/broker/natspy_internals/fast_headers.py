"""NATS headers written and read with fewer Python steps than nats-py takes.

Every message here carries a few ``Mon-*`` headers, and on this project's
hot paths (a ``call_one`` round trip, a broadcast answered by every proc)
nats-py's own header code was a large Python cost per message
(benchmarks/NOTES.md entry 29): building a four-header block took ~8 us
(a regular-expression match, a ``translate`` and two ``bytearray.extend``
per header) and parsing one ~8 us (a generator step per character of each
key to look for whitespace). The functions here produce the same bytes and
the same dictionaries in about half (building) and two thirds (parsing) of
the time:

* :func:`build_hpub` keeps nats-py's checks (a key must be an HTTP token, a
  value loses surrounding blanks and any CR/LF) but remembers the keys it
  has checked, and joins one string to encode once;
* :func:`parse_header_lines` splits the same way and tests a key for
  whitespace with one regular-expression search.

:func:`install` puts them on one nats-py connection (instance attributes,
so nats-py itself and other clients in the process are untouched). The two
methods it replaces are nats-py internals (``Client._send_publish``,
``Client._parse_header_lines``). Before the first install a process checks,
once, that the installed nats-py writes and reads a sample message exactly as
these functions do; where it lacks either method or differs, connections keep
nats-py's own code, which is slower but cannot disagree with itself.
``tests/broker/test_fast_headers.py`` checks byte for byte against the
installed nats-py over many more cases.
"""

from __future__ import annotations

import functools
import re
from types import MethodType
from typing import Any

import nats.aio.client as nats_client
from nats import errors
from nats.aio.client import Client
from nats.protocol import command

# What nats-py accepts as a key (an HTTP token); its own pattern where it has one.
_HEADER_KEY = getattr(nats_client, "_HEADER_KEY_RE", None) or re.compile(
    r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
)
_WHITESPACE = re.compile(r"\s")  # in a str pattern: exactly what str.isspace() says
_CRLF = b"\r\n"
_checked_keys: dict[str, str] = {}  # a key as given -> as sent (stripped), once checked
_plain_keys: dict[str, bool] = {}  # a key read -> whether it holds no whitespace
_ASCII_WHITESPACE = " \t\n\r\x0b\x0c"  # what bytes.strip() strips


def _checked_key(k: str) -> str:
    """The key as it goes on the wire ('' = skipped, as nats-py skips blank keys)."""
    key = _checked_keys.get(k)
    if key is not None:
        return key
    key = k.strip()
    if key and not _HEADER_KEY.fullmatch(key):
        raise errors.BadHeaderError(key)
    if len(_checked_keys) < 4096:  # our keys are a handful; a stranger's must not grow this
        _checked_keys[k] = key
    return key


def header_block(headers: dict[str, Any]) -> bytes:
    """``NATS/1.0\\r\\n`` + ``Key: value\\r\\n`` per header + ``\\r\\n``, as nats-py writes it."""
    parts = ["NATS/1.0\r\n"]
    for k, v in headers.items():
        key = _checked_key(k)
        if not key:
            continue
        value = v.strip()
        if "\r" in value or "\n" in value:
            value = value.replace("\r", " ").replace("\n", " ")
        parts.append(f"{key}: {value}\r\n")
    parts.append("\r\n")
    return "".join(parts).encode()


def build_hpub(subject: str, reply: str, payload: bytes, headers: dict[str, Any]) -> bytes:
    """The HPUB command nats-py would send for this message."""
    return command.hpub_cmd(subject, reply, header_block(headers), payload)


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """What nats-py's ``Client._parse_header_lines`` returns for ``raw``."""
    if not raw.isascii():
        return _parse_header_bytes(raw)
    # All ASCII (ours always are): decode once and work on str. ``bytes.strip()``
    # strips ASCII whitespace only, so the str is stripped of exactly that.
    out: dict[str, str] = {}
    for line in raw.decode("ascii").split("\r\n"):
        name, sep, value = line.partition(":")
        if not sep:
            continue
        key = name.strip(_ASCII_WHITESPACE)
        plain = _plain_keys.get(key)
        if plain is None:
            plain = _WHITESPACE.search(key) is None
            if len(_plain_keys) < 4096:  # our keys are a handful; a stranger's must not grow this
                _plain_keys[key] = plain
        if plain:
            out[key] = value.strip(_ASCII_WHITESPACE)
    return out


def _parse_header_bytes(raw: bytes) -> dict[str, str]:
    """:func:`parse_header_lines` for a block that is not all ASCII: line by line, as nats-py."""
    out: dict[str, str] = {}
    for line in raw.split(_CRLF):
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        try:
            key = name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue  # nats-py skips a key that is not ASCII
        if _WHITESPACE.search(key):
            continue  # nor may a key hold whitespace
        out[key] = value.strip().decode("utf-8", "replace")
    return out


async def _send_publish(
    self: Client,
    subject: str,
    reply: str,
    payload: bytes,
    payload_size: int,
    headers: dict[str, Any] | None,
) -> None:
    """nats-py's ``Client._send_publish`` (as of 2.16), with the header block built here."""
    if subject == "":
        raise errors.BadSubjectError
    if headers is None:
        pub = command.pub_cmd(subject, reply, payload)
    else:
        pub = build_hpub(subject, reply, payload, headers)
    self.stats["out_msgs"] += 1
    self.stats["out_bytes"] += payload_size
    await self._send_command(pub)
    if self._flush_queue is not None and self._flush_queue.empty():
        await self._flush_pending()


_SAMPLE_HEADERS = {" Mon-Kind": "reply ", "Mon-Rank": "0", "Mon-From": "a.b[0]", "X": "c\r\nd"}


@functools.cache
def agrees_with_nats_py() -> bool:
    """Whether the installed nats-py writes and reads a sample message as this module does."""
    try:
        nc = Client()
        sent: list[bytes] = []

        async def capture(cmd: bytes) -> None:
            sent.append(cmd)

        nc._send_command = capture  # type: ignore[method-assign]
        nc._flush_queue = None
        coro = Client._send_publish(nc, "mon.x", "_INBOX.y", b"body", 4, _SAMPLE_HEADERS)
        try:
            coro.send(None)
        except StopIteration:
            pass
        else:  # it waited for something: not the nats-py this module knows
            coro.close()
            return False
        ours = build_hpub("mon.x", "_INBOX.y", b"body", _SAMPLE_HEADERS)
        block = header_block(_SAMPLE_HEADERS)[len(b"NATS/1.0\r\n") :]
        return sent == [ours] and Client._parse_header_lines(block) == parse_header_lines(block)
    except Exception:
        return False


def installed(nc: Client) -> bool:
    """Whether :func:`install` gave ``nc`` this module's header code."""
    return getattr(getattr(nc, "_send_publish", None), "__func__", None) is _send_publish


def install(nc: Client) -> bool:
    """Give ``nc`` the faster header code; False (and nc untouched) if nats-py differs."""
    needed = ("_send_publish", "_parse_header_lines", "_send_command", "_flush_queue", "stats")
    if not all(hasattr(nc, name) for name in needed) or not agrees_with_nats_py():
        return False
    nc._send_publish = MethodType(_send_publish, nc)  # type: ignore[method-assign]
    nc._parse_header_lines = parse_header_lines  # type: ignore[method-assign]
    return True
