"""Run a coroutine right here, up to its first real wait; a task finishes the rest.

Some of nats-py's coroutines almost never wait (``publish`` queues bytes,
``Parser.parse`` hands messages to their subscriptions) yet are ``async``.
Giving each one a task of its own would cost a trip round the event loop per
message and would let two of them interleave; driving it with ``send(None)``
costs neither and fixes its effects in call order. In the rare case that it
does wait (a forced flush, an error callback), the task made here finishes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


def run_inline(
    coro: Coroutine[Any, Any, Any],
    loop: asyncio.AbstractEventLoop,
    on_error: Callable[[Exception], None],
) -> asyncio.Task[None] | None:
    """Run ``coro`` until it ends or first waits.

    Returns None if it ended here (an exception it raised went to
    ``on_error``), else the task that finishes it (keep a reference to it).
    """
    try:
        waiting_on = coro.send(None)
    except StopIteration:
        return None
    except Exception as e:
        on_error(e)
        return None
    return loop.create_task(_finish(coro, waiting_on, on_error))


async def _finish(
    coro: Coroutine[Any, Any, Any], waiting_on: Any, on_error: Callable[[Exception], None]
) -> None:
    try:
        while True:
            if waiting_on is None:  # a bare yield (asyncio.sleep(0))
                await asyncio.sleep(0)
            else:
                # We stand where asyncio's Task would: the future came from the
                # coroutine's own await, which marked it blocking; clear that (as
                # Task does) or awaiting it here raises "await wasn't used with
                # future" at once.
                waiting_on._asyncio_future_blocking = False
                try:
                    await waiting_on
                except GeneratorExit:  # this coroutine is being closed (its task destroyed
                    coro.close()  # pending): close the one it drives too, resume nothing
                    raise
                except BaseException:
                    pass  # the coroutine sees the outcome when resumed
            waiting_on = coro.send(None)
    except StopIteration:
        return
    except Exception as e:
        on_error(e)
