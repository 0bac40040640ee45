"""Whole frames delivered past nats-py's parser arrive exactly as nats-py would deliver them.

The first test runs nats-py's real parser and client code against
:func:`monarch.broker.natspy_internals.fast_delivery.deliver_chunk` on any byte stream of
frames (every kind it must hand on: status headers, other subscriptions,
unknown subscriptions, frames cut anywhere) and compares what each
subscription received, message by message, and nats-py's counters. The
others run a real nats-server: a stream re-cut into small pieces by a proxy,
which path a message took, a request on the same connection, and the setting.
"""

from __future__ import annotations

import asyncio
import random

import nats
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from monarch.broker.connections.connect import connect
from monarch.broker.natspy_internals import direct_read, fast_delivery, intake
from monarch.broker.natspy_internals.intake import subscribe_ordered
from monarch.settings import settings
from tests.helpers import ForwardingProxy, run_in_own_loop, until

ORDERED, OTHER, GONE = (1, 2), 3, 4  # sids: ours, a plain nats-py one, an unsubscribed one

_HEADER_BLOCKS = [
    b"NATS/1.0\r\n\r\n",
    b"NATS/1.0\r\nMon-Kind: call\r\nMon-From: a.b[0]\r\n\r\n",
    b"NATS/1.0\r\nK:  spaced value \r\nBad Key: x\r\n\xc3\xa9: y\r\nv: \xff\r\n\r\n",
    b"NATS/1.0 503\r\n\r\n",
    b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Stream: 7\r\n\r\n",
    b"NATS/1.0\r\nK\x1c: v\x1c\r\n\r\n",
]
_PAYLOAD_PIECES = [b"", b"x", b"\r\n", b"MSG a 1 3\r\n", b"HMSG", b" ", b"\x00\xff", b"body" * 20]

frames = st.builds(
    lambda op, sid, subject, reply, block, payload: (op, sid, subject, reply, block, payload),
    st.sampled_from(["MSG", "HMSG", "+OK"]),
    st.sampled_from([*ORDERED, OTHER, GONE]),
    st.sampled_from([b"mon.a.b", b"x", b"mon.default.port.client-1.17"]),
    st.sampled_from([b"", b"_INBOX.r.1"]),
    st.sampled_from(_HEADER_BLOCKS),
    st.lists(st.sampled_from(_PAYLOAD_PIECES), max_size=4).map(b"".join),
)


def _wire(frame: tuple) -> bytes:
    op, sid, subject, reply, block, payload = frame
    args = [subject, str(sid).encode()] + ([reply] if reply else [])
    if op == "+OK":
        return b"+OK\r\n"
    if op == "MSG":
        return b"MSG " + b" ".join([*args, b"%d" % len(payload)]) + b"\r\n" + payload + b"\r\n"
    sizes = [b"%d" % len(block), b"%d" % (len(block) + len(payload))]
    return b"HMSG " + b" ".join([*args, *sizes]) + b"\r\n" + block + payload + b"\r\n"


def _client() -> tuple[Client, dict[int, list]]:
    """An unconnected nats-py client with two ordered subscriptions and a plain one."""
    nc = Client()
    got: dict[int, list] = {}
    for sid in (*ORDERED, OTHER):
        sub = Subscription(nc, sid, subject="s")
        got[sid] = []
        if sid in ORDERED:
            sub._pending_bytes_limit = 0
            sub._pending_queue = intake._DirectQueue(sub, got[sid].append, None, None)
        nc._subs[sid] = sub
    return nc, got


def _parse(nc: Client, data: bytes) -> None:
    coro = nc._ps.parse(data)
    try:
        coro.send(None)
    except StopIteration:
        return
    raise AssertionError("nats-py's parser waited")


def _what_arrived(nc: Client, got: dict[int, list]) -> dict:
    queue = nc._subs[OTHER]._pending_queue
    got[OTHER] = [queue.get_nowait() for _ in range(queue.qsize())]
    as_fields = {
        sid: [(m.subject, m.reply, m.data, m.headers, m._sid) for m in msgs]
        for sid, msgs in got.items()
    }
    received = {sid: nc._subs[sid]._received for sid in got}
    return {"msgs": as_fields, "received": received, "in": (nc.stats["in_msgs"],
            nc.stats["in_bytes"]), "pending": nc._subs[OTHER]._pending_size}  # fmt: skip


@hsettings(max_examples=300, deadline=None)
@given(st.lists(frames, max_size=12), st.lists(st.integers(0, 2000), max_size=6), st.booleans())
def test_any_stream_is_delivered_as_nats_pys_parser_delivers_it(batch, cuts, fast_headers_on):
    stream = b"".join(_wire(f) for f in batch)
    points = sorted({c % (len(stream) + 1) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)])]

    plain, plain_got = _client()
    fast, fast_got = _client()
    if fast_headers_on:  # the header parser a real connection has (same dictionaries)
        from monarch.broker.natspy_internals.fast_headers import parse_header_lines

        plain._parse_header_lines = fast._parse_header_lines = parse_header_lines
    for chunk in chunks:
        _parse(plain, chunk)
        rest = fast_delivery.deliver_chunk(fast, chunk)
        if rest or fast._ps.buf:
            _parse(fast, rest)
    assert _what_arrived(fast, fast_got) == _what_arrived(plain, plain_got)


def test_a_plain_frame_for_another_subscription_stops_the_pass_there():
    nc, got = _client()
    stream = b"".join(
        _wire(f)
        for f in [
            ("MSG", 1, b"a", b"", b"", b"first"),
            ("MSG", OTHER, b"b", b"", b"", b"nats-py's"),
            ("MSG", 1, b"a", b"", b"", b"after"),
        ]
    )
    rest = fast_delivery.deliver_chunk(nc, stream)
    assert [m.data for m in got[1]] == [b"first"]  # taken here
    assert rest == stream[len(_wire(("MSG", 1, b"a", b"", b"", b"first"))) :]  # the rest, whole


def _recut(seed: int):  # type: ignore[no-untyped-def]
    """A proxy's ``to_client``: what the server sends arrives in 1-40 byte pieces."""
    rng = random.Random(seed)

    async def recut(data: bytes, dst: asyncio.StreamWriter) -> None:
        while data:
            n = rng.randint(1, 40)
            dst.write(data[:n])
            data = data[n:]
            await dst.drain()
            await asyncio.sleep(0)

    return recut


def test_a_stream_cut_into_small_pieces_arrives_whole_and_in_order(nats_url):
    upstream = int(nats_url.rsplit(":", 1)[1])
    token = nats_url.split("//", 1)[1].split("@", 1)[0] if "@" in nats_url else None
    sent = [
        (
            f"cut.{i % 2}",
            b"%d:" % i + b"\r\nMSG x 1 1\r\n" * (i % 3),
            {"Mon-N": str(i)} if i % 4 else None,
        )
        for i in range(300)
    ]

    async def main() -> dict[str, list]:
        async with ForwardingProxy(upstream, _recut(seed=18)) as proxy:
            url = f"nats://{token + '@' if token else ''}127.0.0.1:{proxy.port}"
            nc = await connect(url, settings(), name="fast-cut")
            sender = await nats.connect(nats_url)
            got: dict[str, list] = {"cut.0": [], "cut.1": []}
            try:
                for name in got:
                    await subscribe_ordered(nc, name, lambda m, n=name: got[n].append(m))
                await nc.flush()
                for subject, body, headers in sent:
                    await sender.publish(subject, body, headers=headers)
                await sender.flush()
                await until(lambda: sum(map(len, got.values())) == len(sent), "all 300", timeout=30)
            finally:
                await sender.close()
                await nc.close()
        return got

    got = run_in_own_loop(main())
    for name, msgs in got.items():
        want = [(b, h) for s, b, h in sent if s == name]
        assert [(m.data, m.headers) for m in msgs] == want


def test_whole_frames_skip_nats_pys_parser_and_a_request_still_gets_its_answer(
    nats_url, monkeypatch
):
    """Messages that arrive one by one are all delivered past nats-py's parser (its
    ``_process_msg`` never runs for them); a request inbox on the same connection is
    nats-py's and is answered; with the setting off every message goes through nats-py."""

    async def main() -> tuple[int, int, bytes]:
        nc = await connect(nats_url, settings(), name="fast-path")
        replier = await nats.connect(nats_url)
        through_nats_py = 0
        original = nc._process_msg

        async def counted(*args):  # type: ignore[no-untyped-def]
            nonlocal through_nats_py
            through_nats_py += 1
            await original(*args)

        nc._process_msg = counted
        got: list[bytes] = []
        try:
            await subscribe_ordered(nc, "fast.one", lambda m: got.append(m.data))

            async def answer(msg):  # type: ignore[no-untyped-def]
                await msg.respond(b"answer:" + msg.data)

            await replier.subscribe("fast.ask", cb=answer)
            await nc.flush()
            await replier.flush()
            for i in range(50):  # one at a time: each arrives as a chunk of its own
                await replier.publish("fast.one", b"%d" % i, headers={"Mon-I": str(i)})
                await until(lambda i=i: len(got) == i + 1, f"message {i}")
            answer = await nc.request("fast.ask", b"q", timeout=5)
        finally:
            await replier.close()
            await nc.close()
        assert got == [b"%d" % i for i in range(50)]
        return through_nats_py, len(got), answer.data

    through, n, answer = run_in_own_loop(main())
    assert (through, n, answer) == (1, 50, b"answer:q")  # only the request's answer

    monkeypatch.setenv("MONARCH_FAST_DELIVERY", "0")
    settings.cache_clear()
    try:
        through, n, answer = run_in_own_loop(main())
    finally:
        monkeypatch.undo()
        settings.cache_clear()
    assert (through, n, answer) == (51, 50, b"answer:q")


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_a_bad_setting_is_refused_by_name(value, monkeypatch):
    monkeypatch.setenv("MONARCH_FAST_DELIVERY", value)
    with pytest.raises(ValueError, match="MONARCH_FAST_DELIVERY"):
        type(settings()).from_env()


def test_a_nats_py_without_the_internals_it_reads_keeps_its_own_parser(nats_url, monkeypatch):
    """A nats-py whose subscriptions lack a name fast delivery reads (here ``_jsi``) must
    not get it: every chunk would fail and drop the socket. A connection's reader asks."""
    assert fast_delivery.usable(Client()) is True
    assert fast_delivery.usable(object()) is False  # type: ignore[arg-type]
    original = Subscription.__init__

    def without_jsi(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)
        del self._jsi

    with monkeypatch.context() as patched:
        patched.setattr(Subscription, "__init__", without_jsi)
        assert fast_delivery.usable(Client()) is False

    async def reader_is_fast() -> bool:
        nc = await connect(nats_url, settings(), name="fast-usable")
        try:
            return nc._monarch_direct_read.fast
        finally:
            await nc.close()

    assert run_in_own_loop(reader_is_fast()) is True
    monkeypatch.setattr(direct_read, "usable", lambda nc: False)
    assert run_in_own_loop(reader_is_fast()) is False
