"""Fire-and-forget runs to one subject travel as one NATS message, and come back out in order."""

from __future__ import annotations

import asyncio

import msgpack
import pytest

from monarch.actor import this_host
from monarch.broker.bodies import batch
from monarch.settings import Settings
from tests.actors.actors_for_tests import Echo
from tests.helpers import captured_traffic


class Raw:
    def __init__(self, data: bytes, headers: dict, subject: str = "mon.t.act.x") -> None:
        self.subject, self.data, self.headers, self.reply = subject, data, headers, ""


def test_pack_and_unpack_keep_order_headers_and_bytes():
    items = [({"Mon-Kind": "send", "Mon-Seq": str(i)}, bytes([i]) * i) for i in range(5)]
    msgs = batch.unpack(Raw(batch.pack(items), batch.headers(5)))
    assert [(m.headers, m.data, m.reply, m.subject) for m in msgs] == [
        (h, p, "", "mon.t.act.x") for h, p in items
    ]


@pytest.mark.parametrize(
    "body, count",
    [
        (b"\xc1", "1"),  # not msgpack
        (msgpack.packb([[{}, b"a"]]), "2"),  # announces more than it holds
        (msgpack.packb([[{}, b"a", 3]]), "1"),  # not a pair
        (msgpack.packb([[[], b"a"]]), "1"),  # headers not a map
        (msgpack.packb([[{}, "text"]]), "1"),  # payload not bytes
        (msgpack.packb({"a": 1}), "1"),  # not an array
    ],
)
def test_malformed_batches_are_refused_with_a_reason(body, count):
    with pytest.raises(batch.MalformedBatchError, match="mon.t.act.x"):
        batch.unpack(Raw(body, {"Mon-Kind": "batch", "Mon-Count": count}))


def test_batch_size_is_a_validated_setting():
    assert Settings().batch_max == 1000
    with pytest.raises(ValueError):
        Settings(batch_max=-1)


def test_a_burst_of_sends_leaves_in_batches_and_arrives_in_order(nats_url):
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    n = 3000
    try:
        with captured_traffic(nats_url, "mon.default.act.batched.>") as captured:
            echo = procs.spawn("batched", Echo)
            for i in range(n):
                echo.record.broadcast("b", i)
            assert echo.seen_log.call_one().get(timeout=60) == [("b", i) for i in range(n)]
    finally:
        procs.stop().get(timeout=30)
    sends = [h for _, h, _ in captured if h.get("Mon-Kind") in ("send", "batch")]
    batches = [int(h["Mon-Count"]) for h in sends if h["Mon-Kind"] == "batch"]
    singles = sum(h["Mon-Kind"] == "send" for h in sends)
    assert sum(batches) + singles == n  # every send went through exactly once
    assert batches and max(batches) > 1  # and a burst shared NATS messages
    assert len(sends) < n


def test_headers_stay_strings_even_with_fast_mail_parser_installed(monkeypatch, caplog):
    import nats.aio.client as nats_client

    from monarch.broker.natspy_internals.intake import use_plain_header_parser

    # What nats-py does with fast_mail_parser present: values become lists.
    monkeypatch.setattr(nats_client, "parse_email", lambda raw: None)
    use_plain_header_parser()
    assert nats_client.parse_email is None
    assert "fast_mail_parser" in caplog.text
    parsed = asyncio.run(
        nats_client.Client()._process_headers(b"NATS/1.0\r\nMon-Kind: send\r\n\r\n")
    )
    assert parsed == {"Mon-Kind": "send"}
