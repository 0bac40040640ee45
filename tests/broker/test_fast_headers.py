"""Our header code says exactly what nats-py's says, in fewer steps.

Each check compares with the installed nats-py's own code, so a nats-py that
changes its header format fails here rather than drifting apart from ours.
"""

from __future__ import annotations

import types

import nats
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats import errors
from nats.aio.client import Client

from monarch.broker.natspy_internals import fast_headers
from tests.helpers import run_in_own_loop


def _hpub_by(install: bool, subject: str, reply: str, payload: bytes, headers: dict) -> bytes:
    """The bytes a nats-py client (ours installed or not) queues for one publish."""
    nc = Client()
    if install:
        assert fast_headers.install(nc)
    sent: list[bytes] = []

    async def capture(cmd: bytes) -> None:
        sent.append(cmd)

    nc._send_command = capture  # type: ignore[method-assign]
    nc._flush_queue = None
    run_in_own_loop(nc._send_publish(subject, reply, payload, len(payload), headers))
    (cmd,) = sent
    return cmd


HEADER_SETS = [
    {"Mon-Kind": "reply", "Mon-Rank": "0", "Mon-From": "echo.ab12cd34[0]", "Mon-Seq": "17"},
    {"Mon-Kind": "call", "Mon-Wait": "one", "Mon-Auth": "x" * 64},
    {" Spaced-Key ": "  padded value\t", "Other": ""},  # stripped as nats-py strips
    {"Injected": "a\r\nMon-Kind: forged", "Lf": "x\ny", "Cr": "x\ry"},  # no header smuggling
    {"Unicode": "naïve ☃", "Empty-Key-Next": "v", "": "dropped", "   ": "dropped too"},
    {},
]


@pytest.mark.parametrize("headers", HEADER_SETS)
@pytest.mark.parametrize("reply", ["", "_INBOX.abc.1"])
def test_a_publish_queues_the_same_bytes_as_nats_py(headers, reply):
    args = ("mon.default.act.echo.ab12cd34", reply, b"\x93\x01\x02\x03", headers)
    assert _hpub_by(True, *args) == _hpub_by(False, *args)


@pytest.mark.parametrize("key", ["Bad Key", "Colon:", "Ünï", "new\nline"])
def test_a_key_nats_py_refuses_is_refused_too(key):
    for install in (False, True):
        with pytest.raises(errors.BadHeaderError):
            _hpub_by(install, "mon.x", "", b"", {key: "v"})


# Bytes from a small alphabet that holds every case the parsers branch on:
# separators, whitespace of each kind str.isspace knows, non-ASCII and bad UTF-8.
_PIECES = [b"\r\n", b":", b" ", b"\t", b"\x0b", b"\x1c", b"\x85", b"a", b"K", b"-", b"\xc3\xa9",
           b"\xff", b"Mon-Kind", b"reply", b"\r", b"\n"]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=40))
def test_any_header_block_parses_to_what_nats_py_parses(pieces):
    raw = b"".join(pieces)
    assert fast_headers.parse_header_lines(raw) == Client._parse_header_lines(raw)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([p for p in _PIECES if p.isascii()]), max_size=40))
def test_any_ascii_header_block_parses_to_what_nats_py_parses(pieces):
    raw = b"".join(pieces)  # all ASCII: the parser's str path (whitespace \x0b and \x1c included)
    assert fast_headers.parse_header_lines(raw) == Client._parse_header_lines(raw)


def test_every_ascii_character_in_a_key_is_judged_as_nats_py_judges_it():
    for code in range(128):
        raw = b"Ke" + bytes([code]) + b"y: v\r\nOk: w\r\n"
        assert fast_headers.parse_header_lines(raw) == Client._parse_header_lines(raw), code


def test_a_nats_py_without_the_internals_keeps_its_own_code():
    stranger = types.SimpleNamespace(_parse_header_lines=None)  # no _send_publish, no stats
    assert fast_headers.install(stranger) is False  # type: ignore[arg-type]
    assert stranger._parse_header_lines is None


def test_a_nats_py_that_writes_differently_keeps_its_own_code(monkeypatch):
    """A future nats-py that changed its format: the self-check at first install says no."""
    original = Client._send_publish

    async def differently(self, subject, reply, payload, size, headers):  # type: ignore[no-untyped-def]
        await original(self, subject, reply, payload + b"!", size + 1, headers)

    monkeypatch.setattr(Client, "_send_publish", differently)
    fast_headers.agrees_with_nats_py.cache_clear()
    try:
        nc = Client()
        assert fast_headers.install(nc) is False
        assert "_send_publish" not in vars(nc) and "_parse_header_lines" not in vars(nc)
    finally:
        fast_headers.agrees_with_nats_py.cache_clear()  # the real nats-py is checked anew
    monkeypatch.undo()
    assert fast_headers.install(Client()) is True


def test_headers_cross_the_broker_between_our_code_and_plain_nats_py(nats_url):
    """Through a real nats-server, each way: what one side sends the other reads alike."""

    async def main() -> list[tuple[dict, dict]]:
        ours, plain = await nats.connect(nats_url), await nats.connect(nats_url)
        assert fast_headers.install(ours)
        got: list[tuple[dict, dict]] = []
        try:
            for sender, receiver in ((ours, plain), (plain, ours)):
                sub = await receiver.subscribe("fast.headers.test")
                await receiver.flush()
                for headers in HEADER_SETS[:5]:
                    await sender.publish("fast.headers.test", b"body", headers=headers)
                    msg = await sub.next_msg(timeout=5)
                    got.append((headers, msg.headers))
                await sub.unsubscribe()
        finally:
            await ours.close()
            await plain.close()
        return got

    pairs = run_in_own_loop(main())
    assert len(pairs) == 10
    for (sent, ours_to_plain), (_, plain_to_ours) in zip(pairs[:5], pairs[5:]):
        expected = {
            k.strip(): v.strip().replace("\r", " ").replace("\n", " ")
            for k, v in sent.items()
            if k.strip()
        }
        assert ours_to_plain == plain_to_ours == expected
    assert "Mon-Kind" not in pairs[3][1]  # the CR/LF in a value did not make a second header
