"""Request/reply with many peers at once, over one port (used for control messages)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from nats.aio.msg import Msg

from monarch.actors.messaging import messages as m
from monarch.core.runtime import Runtime


async def request_all(
    rt: Runtime,
    requests: Sequence[tuple[str, bytes, dict[str, str]]],
    timeout: float,
    abort: asyncio.Future | None = None,
) -> list[Msg]:
    """Send each request with ``Mon-Rank`` = its index; return the replies in index order.

    Raises ``TimeoutError`` naming the peers that did not answer, or whatever
    ``abort`` is completed with (for example when a peer's process exits).
    """
    n = len(requests)
    replies: list[Msg | None] = [None] * n
    done = rt.loop.create_future()
    count = 0

    def on_reply(msg: Msg) -> None:
        nonlocal count
        try:
            i = int((msg.headers or {}).get(m.RANK, "-1"))
        except ValueError:
            return
        if 0 <= i < n and replies[i] is None:
            replies[i] = msg
            count += 1
            if count == n and not done.done():
                done.set_result(None)

    port_id, subject = rt.open_port(on_reply)
    try:
        for i, (target, body, headers) in enumerate(requests):
            rt.publish(target, body, {**headers, m.RANK: str(i)}, subject)
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
        rt.close_port(port_id)
