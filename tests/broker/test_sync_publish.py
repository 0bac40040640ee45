"""The plain publish sends what nats-py's publish sends, or steps aside for it.

Each test runs a real nats-server. A message published by
:func:`monarch.broker.natspy_internals.sync_publish.publisher` must leave as the same bytes,
with the same counters and (where the job has a key) a tag the receiver
accepts; whatever nats-py would refuse or make wait must be left to nats-py,
untouched, so that its own precise error or back-pressure applies; and mixing
the two paths must keep the order of publication.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
from collections.abc import Callable

import nats
import pytest
from nats import errors
from nats.aio.client import Client

from monarch.broker.connections.connect import connect
from monarch.broker.connections.server import EmbeddedBroker
from monarch.broker.natspy_internals import sync_publish, write_through
from monarch.broker.natspy_internals.intake import subscribe_ordered
from monarch.settings import Settings, settings
from tests.helpers import run_in_own_loop, until

# (subject, payload, reply, headers): what the runtime sends, and header values
# that nats-py rewrites on the way (spaces stripped, newlines made spaces).
MESSAGES = [
    ("mon.t.port.p-1.7", b"body", "", None),
    ("mon.t.port.p-1.7", b"", "mon.t.reply.c-1", {"Mon-Kind": "call", "Mon-Seq": "12"}),
    ("mon.t.port.p-1.7", b"\r\nMSG x 1 1\r\n", "", {"Mon-Note": "  two\r\nlines  "}),
    ("plain.subject", b"x" * 70_000, "", {}),
    ("plain.subject", b"y", "", {" Spaced-Key ": "v", "": "empty key skipped"}),
]


def _publish_through_nats_py(nc: Client, subject, payload, reply, headers) -> None:  # type: ignore[no-untyped-def]
    """nats-py's publish, run to its end without yielding (as the runtime runs it)."""
    coro = nc.publish(subject, payload, reply=reply, headers=headers)
    try:
        coro.send(None)
    except StopIteration:
        return
    raise AssertionError("publish waited")


def _record_writes(nc: Client) -> list[bytes]:
    """What the connection writes to its socket from now on, one entry per write."""
    written: list[bytes] = []
    transport = nc._transport
    writelines = transport.writelines

    def recorded(parts):  # type: ignore[no-untyped-def]
        written.append(b"".join(parts))
        return writelines(parts)

    transport.writelines = recorded
    return written


def _reading_state(nc: Client) -> str:
    """Where the receiver's reading stands: what a failure of the test below must tell apart
    (bytes the parser holds, a parse that waits, a socket not read, or nothing arrived)."""
    ps, direct = nc._ps, getattr(nc, "_monarch_direct_read", None)
    transport = nc._transport._io_writer.transport
    parsing = None if direct is None else direct.parsing
    return (
        f"its parser in state {ps.state} holding {len(ps.buf)} byte(s) "
        f"(first {bytes(ps.buf[:60])!r}, needed {ps.needed}), direct read "
        f"{'off' if direct is None else 'on'}, a parse waiting: {parsing!r}, reading paused: "
        f"{direct is not None and direct.paused}, socket read: {transport.is_reading()}"
    )


async def _arrives(condition: Callable[[], bool], within: float = 2.0) -> bool:
    try:
        await until(condition, "the probes", timeout=within)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("key", [None, secrets.token_urlsafe(24)], ids=["open", "job-key"])
def test_a_message_leaves_with_the_bytes_counts_and_tag_of_nats_pys_publish(key, nats_url):
    cfg = Settings(nats_job_key=key)

    async def main() -> tuple[list, list, list, list]:
        sender = await connect(nats_url, cfg, name="sync-sender")
        receiver = await connect(nats_url, cfg, name="sync-receiver")  # checks tags with a key
        got: list = []
        try:
            publish = sync_publish.publisher(sender)
            assert publish is not None
            # with a key, only our subjects are signed (and checked): the others are not ours
            received = [m for m in MESSAGES if key is None or m[0].startswith("mon.")]
            for subject in {m[0] for m in received}:
                await subscribe_ordered(receiver, subject, got.append)
            await receiver.flush()
            written = _record_writes(sender)
            sync_bytes, nats_py_bytes, counts = [], [], []
            for subject, payload, reply, headers in MESSAGES:
                given = dict(headers) if headers is not None else None
                for path, out in ((publish, sync_bytes), (_publish_through_nats_py, nats_py_bytes)):
                    before = dict(sender.stats)
                    if path is publish:
                        assert publish(subject, payload, reply, headers) is True
                    else:
                        path(sender, subject, payload, reply, headers)
                    await asyncio.sleep(0)  # a turn: each message is the first of its turn
                    out.append(written.pop())
                    assert not written
                    counts.append({k: sender.stats[k] - before[k] for k in before})
                assert headers == given  # the caller's dictionary is not touched (the tag)
            try:
                await until(lambda: len(got) >= 2 * len(received), "every message, twice")
            except AssertionError as e:  # say what came, and whether the socket brought it
                arrived = [(m.subject, len(m.data)) for m in got]
                brought = receiver.stats["in_msgs"]  # (taken before the probes below)
                state = _reading_state(receiver)
                # does a message sent now arrive? (no: the subscription or the socket is stuck)
                probes = {s: f"probe {s}".encode() for s in {m[0] for m in received}}
                for subject, body in probes.items():
                    await sender.publish(subject, body)
                await sender.flush()
                came = await _arrives(lambda: {m.data for m in got} >= set(probes.values()))
                raise AssertionError(
                    f"{e}; received {len(arrived)} of {2 * len(received)}: {arrived}; the "
                    f"receiver's socket brought {brought} message(s), the "
                    f"sender's stats {sender.stats}; last errors: sender "
                    f"{sender.last_error!r}, receiver {receiver.last_error!r}; sender "
                    f"connected {sender.is_connected} to {sender.connected_url}; receiver "
                    f"subscribed to {sorted(sub.subject for sub in receiver._subs.values())}; "
                    f"{state}; a probe sent on each subject afterwards arrived: {came}"
                ) from None
        finally:
            await sender.close()
            await receiver.close()
        fields = [(m.subject, m.reply, m.data, m.headers) for m in got]
        return sync_bytes, nats_py_bytes, counts, fields

    sync_bytes, nats_py_bytes, counts, fields = run_in_own_loop(main())
    assert sync_bytes == nats_py_bytes
    assert counts[::2] == counts[1::2]  # stats: the same counts, message by message
    assert [(c["out_msgs"], c["out_bytes"]) for c in counts[::2]] == [
        (1, len(m[1])) for m in MESSAGES
    ]
    assert len(fields) == 2 * len([m for m in MESSAGES if key is None or m[0].startswith("mon.")])
    assert fields[::2] == fields[1::2]  # and the receiver (with a key: its check) took both
    if key is not None:
        assert all(b"Mon-Auth: " in b for b in sync_bytes if b.startswith(b"HPUB mon."))


def test_what_nats_py_refuses_is_left_to_it_untouched_and_it_raises_its_own_error(nats_url):
    async def main() -> dict:
        nc = await connect(nats_url, settings(), name="sync-refused")
        try:
            publish = sync_publish.publisher(nc)
            assert publish is not None
            nc._max_payload = 1000  # (the server's limit is large; nats-py checks this one)
            cases = {
                "bad subject": (("a b", b"x", "", None), errors.BadSubjectError),
                "bad reply": (("ok", b"x", "r\tq", None), errors.BadSubjectError),
                "empty subject": (("", b"x", "", None), errors.BadSubjectError),
                "oversized": (("ok", b"x" * 1001, "", None), errors.MaxPayloadError),
                "bad header key": (("ok", b"x", "", {"Bad Key": "v"}), errors.BadHeaderError),
            }
            outcome = {}
            for name, ((subject, payload, reply, headers), error) in cases.items():
                before = (dict(nc.stats), list(nc._pending), nc._pending_data_size)
                taken = publish(subject, payload, reply, headers)
                after = (dict(nc.stats), list(nc._pending), nc._pending_data_size)
                with pytest.raises(error):
                    await nc.publish(subject, payload, reply=reply, headers=headers)
                outcome[name] = (taken, before == after)
            nc._max_payload = 1 << 20
            nc._skip_subject_validation = True  # (a connect option) nats-py still refuses ""
            outcome["empty subject, unchecked"] = (publish("", b"x", "", None), not nc._pending)
            with pytest.raises(errors.BadSubjectError):
                await nc.publish("", b"x")
            nc._skip_subject_validation = False

            nc._max_pending_size = 10  # over it: nats-py forces a flush and waits on it
            before = (dict(nc.stats), list(nc._pending))
            outcome["over the pending limit"] = (publish("ok", b"x" * 20, "", None),
                                                 before == (dict(nc.stats), list(nc._pending)))  # fmt: skip
            await nc.publish("ok", b"x" * 20)  # nats-py's forced flush writes it
            assert not nc._pending
            nc._max_pending_size = 2 * 1024 * 1024  # nats-py's default again
        finally:
            await nc.close()
        outcome["closed"] = (publish("ok", b"x", "", None), not nc._pending)
        with pytest.raises(errors.ConnectionClosedError):
            await nc.publish("ok", b"x")
        return outcome

    outcome = run_in_own_loop(main())
    assert outcome == {name: (False, True) for name in outcome}


def test_a_burst_mixed_with_nats_pys_publish_leaves_in_order_one_write_then_the_rest(nats_url):
    async def main() -> tuple[list[int], list[int], list[bytes]]:
        sender = await connect(nats_url, settings(), name="sync-burst")
        receiver = await nats.connect(nats_url)
        got: list[bytes] = []
        try:
            publish = sync_publish.publisher(sender)
            assert publish is not None
            await subscribe_ordered(sender, "sync.burst", lambda m: got.append(m.data))
            await sender.flush()
            written = _record_writes(sender)
            writes_per_turn = []
            for turn in range(40):
                for n in range(turn % 7 + 1):  # bursts of 1-7 in one loop turn
                    body = b"%d.%d" % (turn, n)
                    if (turn + n) % 3:
                        assert publish("sync.burst", body, "", {"Mon-N": str(n)})
                    else:
                        _publish_through_nats_py(sender, "sync.burst", body, "", None)
                writes_per_turn.append(len(written))
                await asyncio.sleep(0)
            queued_after_turn = len(sender._pending)
            await until(lambda: len(got) == sum(t % 7 + 1 for t in range(40)), "every message")
        finally:
            await receiver.close()
            await sender.close()
        return writes_per_turn, [queued_after_turn], got

    writes_per_turn, queued, got = run_in_own_loop(main())
    want = [b"%d.%d" % (t, n) for t in range(40) for n in range(t % 7 + 1)]
    assert got == want
    # within each turn one write (its first message); the rest of the burst at the next turn
    per_turn = [b - a for a, b in zip([0, *writes_per_turn], writes_per_turn)]
    assert per_turn[0] == 1 and all(w in (1, 2) for w in per_turn[1:])
    assert queued == [0]


def test_a_broker_that_stops_reading_makes_the_plain_publish_step_aside_and_nothing_is_lost():
    """A broker frozen mid-flood (SIGSTOP): once more than the write-through limit waits in
    the transport, the plain publish declines and nats-py's publish (its flusher, its
    forced flush) takes over; after SIGCONT every message arrives once, in order."""
    broker = EmbeddedBroker().start()

    async def main() -> tuple[list[int], int, int]:
        receiver = await connect(broker.url, settings(), name="sync-flood-receiver")
        sender = await connect(broker.url, settings(), name="sync-flood-sender")
        got: list[int] = []
        taken = declined = 0
        try:
            publish = sync_publish.publisher(sender)
            assert publish is not None
            await subscribe_ordered(receiver, "sync.flood", lambda m: got.append(int(m.data[:8])))
            await receiver.flush()
            filler = b"z" * 100_000

            async def flood() -> None:
                nonlocal taken, declined
                for n in range(300):  # as the runtime publishes: plain first, else nats-py
                    body = b"%08d" % n + filler
                    if publish("sync.flood", body, "", None):
                        taken += 1
                    else:
                        declined += 1
                        await sender.publish("sync.flood", body)
                    if n % 10 == 9:
                        await asyncio.sleep(0)

            os.kill(broker.pid, signal.SIGSTOP)
            try:
                flooding = asyncio.ensure_future(flood())
                await asyncio.sleep(1.0)
            finally:
                os.kill(broker.pid, signal.SIGCONT)
            await asyncio.wait_for(flooding, 10)
            await until(lambda: len(got) == 300, "300 messages of 100 kB")
            return got, taken, declined
        finally:
            await sender.close()
            await receiver.close()

    try:
        got, taken, declined = run_in_own_loop(main())
    finally:
        broker.stop()
    assert got == list(range(300))
    assert taken > 0 and declined > 0  # both paths wrote part of the flood


def test_no_plain_publish_where_it_cannot_be_one(nats_url, monkeypatch):
    async def main() -> list:
        plain = await nats.connect(nats_url)  # nats-py's own: no write-through, no header code
        through_only = await nats.connect(nats_url)
        tuned = await connect(nats_url, settings(), name="sync-off")
        try:
            write_through.install(through_only)
            return [sync_publish.publisher(nc) for nc in (plain, through_only, tuned)]
        finally:
            for nc in (plain, through_only, tuned):
                await nc.close()

    assert [p is None for p in run_in_own_loop(main())] == [True, True, False]
    monkeypatch.setenv("MONARCH_SYNC_PUBLISH", "0")
    settings.cache_clear()
    try:
        assert run_in_own_loop(main()) == [None, None, None]
    finally:
        monkeypatch.undo()
        settings.cache_clear()


@pytest.mark.parametrize("value", ["sure", "2"])
def test_a_bad_setting_is_refused_by_name(value, monkeypatch):
    monkeypatch.setenv("MONARCH_SYNC_PUBLISH", value)
    with pytest.raises(ValueError, match="MONARCH_SYNC_PUBLISH"):
        type(settings()).from_env()
