"""Request/reply with many peers at once, over one port (used for control messages)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from nats.aio.msg import Msg

from monarch.actors.messaging import messages as m
from monarch.core.runtime import Runtime


async def request_all(
    rt: Runtime,
    requests: Sequence[tuple[str, bytes, dict[str, str]]],
    timeout: float,
    abort: asyncio.Future | None = None,
    absent_ok: bool = False,
) -> list[Msg]:
    """Send each request with ``Mon-Rank`` = its index; return the replies in index order.

    Raises ``TimeoutError`` naming the peers that did not answer, or whatever
    ``abort`` is completed with (for example when a peer's process exits).

    ``absent_ok`` (stop requests): a peer with nobody listening any more (the
    broker answers "no responders") counts as answered, with that status
    message as its reply, instead of being waited for until the timeout: a
    process that has already stopped has nothing left to stop. Each request
    then has a reply port of its own, since the broker's answer does not say
    which request it is about. Other requests keep waiting: in a NATS cluster
    a process that has just subscribed may not be known to every node yet.
    """
    n = len(requests)
    replies: list[Msg | None] = [None] * n
    done = rt.loop.create_future()
    count = 0

    def take(i: int, msg: Msg) -> None:
        nonlocal count
        if 0 <= i < n and replies[i] is None:
            replies[i] = msg
            count += 1
            if count == n and not done.done():
                done.set_result(None)

    def on_reply(msg: Msg) -> None:
        try:
            i = int((msg.headers or {}).get(m.RANK, "-1"))
        except ValueError:
            return
        take(i, msg)

    def on_reply_to(i: int) -> Callable[[Msg], None]:
        def on(msg: Msg) -> None:
            headers = msg.headers or {}
            if headers.get("Status") == "503" or headers.get(m.RANK) == str(i):
                take(i, msg)

        return on

    ports = (
        [rt.open_port(on_reply_to(i)) for i in range(n)]
        if absent_ok
        else [rt.open_port(on_reply)] * n
    )
    try:
        for i, (target, body, headers) in enumerate(requests):
            rt.publish(target, body, {**headers, m.RANK: str(i)}, ports[i][1])
        if n == 0:
            return []
        waiters = [done] if abort is None else [done, abort]
        finished, _ = await asyncio.wait(
            waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if done in finished:
            return replies  # type: ignore[return-value]
        if abort is not None and abort in finished:
            abort.result()  # raises the reason
        missing = [requests[i][0] for i in range(n) if replies[i] is None]
        raise TimeoutError(f"no reply within {timeout} s from {', '.join(missing)}")
    finally:
        for port_id in {port_id for port_id, _ in ports}:
            rt.close_port(port_id)
