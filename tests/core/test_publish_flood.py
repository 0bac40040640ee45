"""Publishing more in one loop turn than nats-py buffers: every message arrives, none is failed.

Past nats-py's pending-bytes limit (2 MiB by default) a publish waits for its
flusher: it suspends. The runtime finishes such a publish in a task of its
own, which once raised "await wasn't used with future" for every one of them:
the bytes were already queued and went out, but each publish reported an
error (a warning for sends, a failed call for calls). Seen when a client
alternated fire-and-forget sends between two meshes.
"""

from __future__ import annotations

from monarch.core.process_runtime import runtime
from tests.helpers import captured_traffic, wait_until

COUNT = 3_000
PAD = b"x" * 2048  # 3,000 x 2 KiB: three times nats-py's 2 MiB of pending bytes


def test_a_flood_in_one_loop_turn_arrives_whole_and_in_order(nats_url):
    rt = runtime()
    subject = "mon.default.flood.test"

    errors: list[BaseException] = []

    async def flood() -> None:
        for i in range(COUNT):  # one loop turn: the flusher cannot drain meanwhile
            rt.publish(subject, b"%d " % i + PAD, {"Mon-Kind": "send"}, on_error=errors.append)

    with captured_traffic(nats_url, subject) as captured:
        rt.run_coro(flood()).result(60)
        assert wait_until(lambda: len(captured) >= COUNT, timeout=30), len(captured)
    assert [int(data.split()[0]) for _, _, data in captured] == list(range(COUNT))
    assert errors == []
