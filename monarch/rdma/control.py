"""The ibverbs queue-pair exchange, over NATS: ``mon.<ns>.rdma.<proc-uid>``.

A reader that wants RDMA to a buffer's owner sends its queue pair's details
(number, PSN, LID, GID, MTU) as a request to the owner's subject; the owner
(which subscribed when it opened its device) creates its side, connects it,
and answers with its own details. Only these few bytes go through the
broker; the data never does. NOT VERIFIED ON HARDWARE (see
:mod:`monarch.rdma.transports.ibverbs`).
"""

from __future__ import annotations

import logging

from monarch.broker.bodies.codec import dumps, loads
from monarch.broker.connections.auth import auth_of
from monarch.core.process_runtime import runtime
from monarch.core.runtime import Runtime
from monarch.rdma.errors import OwnerGoneError
from monarch.rdma.handle import BufferHandle
from monarch.rdma.transports import set_ibverbs_exchange
from monarch.rdma.transports.ibverbs import Verbs

log = logging.getLogger(__name__)
EXCHANGE_TIMEOUT = 10.0


def subject(namespace: str, proc_uid: str) -> str:
    return f"mon.{namespace}.rdma.{proc_uid}"


def serve_queue_pairs(rt: Runtime, verbs: Verbs) -> None:
    """Owner side: answer queue-pair requests for as long as the runtime lives."""

    auth = auth_of(rt.nc)

    async def on_request(msg) -> None:
        if auth is not None and not auth.accepts(msg):
            return  # not from this job (counted by accepts)
        try:
            answer = verbs.accept(loads(msg.data))
        except Exception as e:
            log.warning("queue pair for %s failed: %s", msg.subject, e)
            answer = {"error": f"{type(e).__name__}: {e}"}
        await rt.nc.publish(msg.reply, dumps(answer))

    async def subscribe() -> None:
        sub = await rt.nc.subscribe(subject(rt.namespace, rt.proc_uid), cb=on_request)
        rt.on_close(sub.unsubscribe)

    if rt.on_loop_thread():
        rt.loop.create_task(subscribe())
    else:
        rt.run_coro(subscribe()).result(EXCHANGE_TIMEOUT)


def exchange(handle: BufferHandle, request: dict) -> dict:
    """Reader side: send our queue pair's details to the owner, return its own. Not on the loop."""
    rt = runtime()
    coro = rt.nc.request(
        subject(rt.namespace, handle.owner), dumps(request), timeout=EXCHANGE_TIMEOUT
    )
    try:
        msg = rt.run_coro(coro).result(EXCHANGE_TIMEOUT + 2)
    except Exception as e:
        raise OwnerGoneError(f"{handle.describe()}: queue-pair exchange failed: {e!r}") from e
    auth = auth_of(rt.nc)
    if auth is not None and not auth.accepts(msg):
        raise OwnerGoneError(f"{handle.describe()}: the queue-pair answer is not from this job")
    return loads(msg.data)


set_ibverbs_exchange(exchange)
