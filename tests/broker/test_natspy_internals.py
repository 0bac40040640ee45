"""The nats-py fast paths against the nats-py that is installed.

:mod:`monarch.broker.natspy_internals` reads and replaces nats-py's private
names; :data:`~monarch.broker.natspy_internals.names.PRIVATE_NAMES` lists them
all. These tests check that each listed name exists on this nats-py's
classes and objects (a connection to a real nats-server, one of its
subscriptions, its parser and transport), that the code of the subpackage
reads no private name the list leaves out, and that messages travel whole and
in order with each fast path switched off and on. ``.ci/natspy-range.sh`` runs
them with the oldest and the newest nats-py that pyproject.toml allows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import re
import threading
from typing import Any

import nats.aio.client as nats_client
import nats.protocol.parser as nats_parser
import pytest
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.aio.transport import TcpTransport

from monarch.broker import natspy_internals
from monarch.broker.connections.connect import connect
from monarch.broker.natspy_internals import fast_headers, sync_publish
from monarch.broker.natspy_internals.intake import subscribe_ordered
from monarch.broker.natspy_internals.names import OPTIONAL, OWNERS, PRIVATE_NAMES
from monarch.core.runtime import new_event_loop
from monarch.settings import settings

TIMEOUT = 30.0
# The fast paths' switches (MONARCH_<NAME>), each on by default.
SWITCHES = ("direct_read", "fast_delivery", "write_through", "sync_publish", "direct_write")


class LoopThread:
    """An event loop of the runtime's kind (uvloop where installed) on a thread of its own."""

    def __init__(self) -> None:
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT)
        self.loop.close()


@pytest.fixture
def loop_thread():
    lt = LoopThread()
    yield lt
    lt.close()


def _owners(nc: Any, sub: Subscription, loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    """The live object (or class, or module) each owner of :data:`OWNERS` names."""
    return {
        "Client": nc,
        "client_module": nats_client,
        "Subscription": sub,
        "Parser": nc._ps,
        "parser_module": nats_parser,
        "TcpTransport": nc._transport,
        "Msg": {f.name for f in dataclasses.fields(Msg)},
        "StreamReader": nc._transport._io_reader,
        "Future": loop.create_future(),
    }


def test_every_listed_private_name_exists_on_the_installed_nats_py(nats_url, loop_thread):
    async def check() -> tuple[list[str], list[str]]:
        nc = nats_client.Client()
        await nc.connect(nats_url)
        try:
            sub = await nc.subscribe("natspy.names")
            assert isinstance(nc._transport, TcpTransport)
            owners = _owners(nc, sub, asyncio.get_running_loop())
            missing, optional_missing = [], []
            for key in PRIVATE_NAMES:
                owner, name = key.split(".", 1)
                obj = owners[owner]
                there = name in obj if isinstance(obj, set) else hasattr(obj, name)
                if not there:
                    (optional_missing if key in OPTIONAL else missing).append(key)
            return missing, optional_missing
        finally:
            await nc.close()

    missing, _optional_missing = loop_thread.run(check())
    assert missing == [], f"this nats-py lacks private names the fast paths need: {missing}"


def test_every_owner_is_described_and_every_entry_says_what_it_is_for():
    for key, why in PRIVATE_NAMES.items():
        owner, _, name = key.partition(".")
        assert owner in OWNERS, key
        assert name.startswith("_") or name.isupper(), key
        assert len(why) > 20, key
    assert OPTIONAL <= set(PRIVATE_NAMES)


# Attribute reads of our own objects (``self._x``) and of our own marks on nats-py's
# objects (``_monarch_*``) are not nats-py's names.
_OWN = re.compile(r"(?<![\w.])self\._\w+|\._monarch_\w+")
_PRIVATE_READ = re.compile(r"\.(_[a-z]\w*)\b|\"(_[a-z]\w*)\"|\b(AWAITING_CONTROL_LINE)\b")
# Names in the source that are this package's own (methods and module-level helpers).
_OWN_NAMES = {
    "_finish", "_checked_key", "_parse_header_bytes", "_ordered_delivery", "_has_internals",
    "_plain_tcp_writer", "_take_over", "_take_over_soon", "_release_fd", "_wrap",
    "_flush_rest", "_write_rest", "_sub", "_handler", "_on_message", "_auth", "_build",
    "_transport", "_writer", "_fd", "_rest", "_taking_over", "_mon_delivered",
}  # fmt: skip


def test_the_subpackage_reads_no_private_name_the_list_leaves_out():
    listed = {key.split(".", 1)[1] for key in PRIVATE_NAMES}
    folder = pathlib.Path(natspy_internals.__file__).parent
    unlisted: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        if path.name == "names.py":
            continue
        code = "\n".join(
            line.split("#")[0]
            for line in path.read_text().splitlines()
            if not line.lstrip().startswith(("#", '"', "``", ":"))
        )
        code = _OWN.sub("", code)
        for match in _PRIVATE_READ.finditer(code):
            name = next(g for g in match.groups() if g)
            if name not in listed and name not in _OWN_NAMES and not name.startswith("_monarch_"):
                unlisted.setdefault(path.name, set()).add(name)
    assert unlisted == {}


def _set_switch(monkeypatch: pytest.MonkeyPatch, name: str, on: bool) -> None:
    for other in SWITCHES:
        monkeypatch.delenv("MONARCH_" + other.upper(), raising=False)
    monkeypatch.setenv("MONARCH_" + name.upper(), "1" if on else "0")
    settings.cache_clear()


def _installed(nc: Any) -> dict[str, bool]:
    """Which fast paths ``nc`` has."""
    reader = getattr(nc, "_monarch_direct_read", None)
    return {
        "fast_headers": fast_headers.installed(nc),
        "direct_read": reader is not None,
        "fast_delivery": bool(reader is not None and reader.fast),
        "write_through": getattr(nc, "_monarch_write_through", None) is not None,
        "sync_publish": sync_publish.publisher(nc) is not None,
        "direct_write": getattr(nc, "_monarch_direct_write", None) is not None,
    }


@pytest.mark.parametrize("on", [False, True], ids=["off", "on"])
@pytest.mark.parametrize("switch", SWITCHES)
def test_messages_travel_whole_and_in_order_with_each_fast_path_off_and_on(
    nats_url, loop_thread, monkeypatch, switch, on
):
    _set_switch(monkeypatch, switch, on)
    subject = f"natspy.{switch}.{'on' if on else 'off'}"
    got: list[tuple[bytes, str | None]] = []
    count = 60  # per way of sending: through nats-py's publish, in one plain call, from a thread

    async def start() -> tuple[Any, Any]:
        sender = await connect(nats_url, settings(), name="natspy-sender")
        receiver = await connect(nats_url, settings(), name="natspy-receiver")

        def handle(msg: Any) -> None:
            got.append((msg.data, (msg.headers or {}).get("Mon-Seq")))

        def answer(msg: Any) -> None:
            receiver.publish_task = asyncio.ensure_future(
                receiver.publish(msg.reply, msg.data.upper(), headers={"Mon-Kind": "reply"})
            )

        await subscribe_ordered(receiver, subject, handle)
        await subscribe_ordered(receiver, subject + ".ask", answer)
        await receiver.flush()
        return sender, receiver

    async def send_through_nats_py(sender: Any) -> None:
        for n in range(count):
            await sender.publish(subject, b"p%d" % n, headers={"Mon-Seq": str(n)})
        await sender.flush()

    async def send_in_one_call(sender: Any) -> bool:
        publish = sync_publish.publisher(sender)
        for n in range(count, 2 * count):
            body, headers = b"p%d" % n, {"Mon-Seq": str(n)}
            if publish is None or not publish(subject, body, "", headers):
                await sender.publish(subject, body, headers=headers)
        await sender.flush()
        return publish is not None

    async def ask(sender: Any) -> bytes:
        reply = await sender.request(subject + ".ask", b"hello", timeout=TIMEOUT)
        assert reply.headers == {"Mon-Kind": "reply"}
        return reply.data

    sender, receiver = loop_thread.run(start())
    try:
        installed = _installed(sender)
        assert installed == _installed(receiver)
        loop_thread.run(send_through_nats_py(sender))
        plain = loop_thread.run(send_in_one_call(sender))
        # From this (non-loop) thread: written directly where direct_write is on and
        # nothing waits, else handed to the loop, as the runtime does.
        direct = getattr(sender, "_monarch_direct_write", None)
        written_here = 0
        for n in range(2 * count, 3 * count):
            body, headers = b"p%d" % n, {"Mon-Seq": str(n)}
            if direct is not None and direct.try_write(subject, body, "", headers, lambda: True):
                written_here += 1
            else:
                loop_thread.run(sender.publish(subject, body, headers=headers))
        loop_thread.run(sender.flush())
        assert loop_thread.run(ask(sender)) == b"HELLO"
        loop_thread.run(_until(lambda: len(got) >= 3 * count))
    finally:
        loop_thread.run(sender.close())
        loop_thread.run(receiver.close())
        monkeypatch.undo()
        settings.cache_clear()

    assert got == [(b"p%d" % n, str(n)) for n in range(3 * count)]
    # The switch decides its own path; the others stay on, but for those built on it.
    expected = {path: True for path in ("fast_headers", *SWITCHES)}
    expected[switch] = on
    if switch == "direct_read" and not on:
        expected["fast_delivery"] = False  # it runs inside direct_read's callback
    if switch == "write_through" and not on:
        expected["sync_publish"] = expected["direct_write"] = False  # both build on it
    assert installed == expected
    assert plain is installed["sync_publish"]
    assert (written_here > 0) is installed["direct_write"]


async def _until(predicate: Any, timeout: float = TIMEOUT) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout} s")
        await asyncio.sleep(0.01)


def test_install_is_idempotent_and_gives_a_connection_every_fast_path(nats_url, loop_thread):
    async def twice() -> tuple[dict[str, bool], dict[str, bool]]:
        nc = nats_client.Client()
        await nc.connect(nats_url)
        try:
            natspy_internals.install(nc)
            first = _installed(nc)
            reader = nc._monarch_direct_read
            natspy_internals.install(nc, thread_writes=True)
            assert nc._monarch_direct_read is reader
            return first, _installed(nc)
        finally:
            await nc.close()

    settings.cache_clear()
    first, second = loop_thread.run(twice())
    assert first == {
        "fast_headers": True,
        "direct_read": True,
        "fast_delivery": True,
        "write_through": True,
        "sync_publish": True,
        "direct_write": False,  # only with thread_writes
    }
    assert second == {**first, "direct_write": True}
