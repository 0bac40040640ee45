"""``monarch tail [SUBJECT]``: live traffic, one readable line per message.

Each line is the subject, the ``Mon-*`` headers (and the reply subject, if
any), and the body decoded with :func:`monarch.broker.bodies.codec.loads` (either
wire mode). Pickled values are shown as ``<pickle N bytes>`` unless
``--pickle`` says the traffic is trusted; bodies that are not monarch's
(heartbeat timestamps, reasons) print as text. Lines are cut to ``--width``.
A batch (``Mon-Kind=batch``, see :mod:`monarch.broker.bodies.batch`) prints its own
line, then one ``  > `` line per message inside it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, TextIO

import msgpack

from monarch.broker.bodies import batch
from monarch.broker.bodies.codec import CodecError, loads
from monarch.broker.vocabulary import headers as hdr
from monarch.cli.main import broker_url

_FRAME = b"\xd7\x07"  # the codec's out-of-band buffer frame (see monarch.broker.bodies.codec)


def decode_body(data: bytes, allow_pickle: bool = False) -> str:
    """The body as text: decoded value, placeholders for what cannot be decoded, or raw text."""
    if not data:
        return ""
    try:
        return repr(loads(data, allow_pickle=allow_pickle))
    except CodecError:
        pass
    except Exception as e:  # a registered type whose decoder needs this process's runtime
        return f"<{len(data)} bytes: {type(e).__name__}>"
    try:
        return repr(_placeholders(data))
    except Exception:
        pass
    try:
        return repr(data.decode())
    except UnicodeDecodeError:
        return f"<{len(data)} bytes: {data[:16].hex()}...>"


class _Mark:
    """An empty ext that starts a marker array (a tuple, tensor, registered type...)."""

    def __init__(self, code: int) -> None:
        self.code = code


def _placeholders(data: bytes) -> Any:
    """The msgpack body with what this process cannot rebuild shown as placeholders.

    Follows the codec's layout: marker arrays (tuples, tensors, registered
    types), pickles (code 4), out-of-band buffers after a frame header.
    """
    if data[:2] == _FRAME and len(data) >= 10:
        data = data[10 : 10 + int.from_bytes(data[2:10], "big")]

    def ext(code: int, payload: bytes) -> Any:
        if not payload:
            return _Mark(code)
        return f"<pickle {len(payload)} bytes>" if code == 4 else f"<ext {code}>"

    def array(items: list) -> Any:
        if not items or not isinstance(items[0], _Mark):
            return items
        code, fields = items[0].code, items[1:]
        if code == 1:
            return tuple(fields)
        if code in (2, 3):  # ndarray, tensor: dtype, shape, offset, length
            return f"<{'tensor' if code == 3 else 'ndarray'} {fields[0]} {fields[1]}>"
        if code == 5:
            return f"<bytearray {fields[-1]} bytes>"
        return f"<ext {code} {fields[0] if len(fields) == 1 else fields}>"

    return msgpack.unpackb(data, ext_hook=ext, list_hook=array, raw=False, strict_map_key=False)


def format_msg(msg: Any, width: int = 240, allow_pickle: bool = False) -> str:
    """``subject  Mon-Kind=call Mon-Endpoint=train ... reply=...  body``, cut to ``width``."""
    headers = msg.headers or {}
    parts = [msg.subject]
    parts += [f"{k}={v}" for k, v in headers.items() if k.startswith(hdr.PREFIX) or k == "Status"]
    if msg.reply:
        parts.append(f"reply={msg.reply}")
    if batch.is_batch(msg) and not msg.reply:
        # One line for the batch, then one per message inside it, in order.
        try:
            inner = batch.unpack(msg)
        except batch.MalformedBatchError as e:
            return _cut(" ".join(parts) + f"  <{e}>", width)
        return "\n".join(
            [" ".join(parts)] + ["  > " + format_msg(m, width - 4, allow_pickle) for m in inner]
        )
    return _cut("  ".join([" ".join(parts), decode_body(msg.data, allow_pickle)]), width)


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


async def tail(
    url: str,
    subject: str,
    *,
    out: TextIO = sys.stdout,
    count: int | None = None,
    seconds: float | None = None,
    width: int = 240,
    allow_pickle: bool = False,
    connect_timeout: float = 10.0,
) -> int:
    """Print messages on ``subject`` until ``count`` were printed, ``seconds`` passed, or Ctrl-C."""
    # Imported when the subcommand runs, so that `monarch --help` stays fast.
    from monarch.hosts.connect import connect

    nc = await connect(url, "monarch-tail", timeout=connect_timeout)
    done = asyncio.Event()
    seen = 0

    async def on_msg(msg: Any) -> None:
        nonlocal seen
        if done.is_set():
            return
        print(format_msg(msg, width, allow_pickle), file=out, flush=True)
        seen += 1
        if count is not None and seen >= count:
            done.set()

    sub = await nc.subscribe(subject, cb=on_msg)
    await nc.flush()
    print(f"# listening on {subject}", file=out, flush=True)
    try:
        await asyncio.wait_for(done.wait(), seconds)
    except asyncio.TimeoutError:
        pass
    finally:
        await sub.unsubscribe()
        await nc.close()
    return seen


def run(args: argparse.Namespace) -> int:
    # Imported when the subcommand runs, so that `monarch --help` stays fast.
    from monarch.settings import settings

    url = broker_url(args)
    subject = args.subject or f"mon.{settings().namespace}.>"
    try:
        asyncio.run(
            tail(
                url,
                subject,
                count=args.count,
                seconds=args.seconds,
                width=args.width,
                allow_pickle=args.pickle,
                connect_timeout=args.connect_timeout,
            )
        )
    except KeyboardInterrupt:
        pass
    return 0
