"""Where an async actor's ``__init__`` runs: a thread of its own, not the proc's loop.

An actor whose endpoints are all ``async`` is served on its proc's event loop
(:class:`~monarch.actors.hosting.mailbox.LoopRunner`: no thread hop per
message). Its ``__init__`` is plain Python, though, and may block: wait on an
event, call ``.get()`` on another mesh, never return. On the loop that would
freeze every other actor of the proc and the proc's own control messages
(its spawn answers, stops). Monarch gives each actor a loop of its own, so
there the rest of the proc goes on; here the constructor alone gets a short
lived thread, and the endpoints stay on the loop, so no message pays for it.

Two things an ``__init__`` may rely on are carried over, so it sees what it
would see on the loop:

* ``asyncio.get_running_loop()`` gives the proc's loop (through
  :class:`LoopFromThread`, which hands ``create_task``, ``call_soon`` and the
  like over to the loop's thread safely), so a background task started in
  ``__init__`` runs where the endpoints run;
* per-thread state the endpoints read: ``threading.local`` objects the
  constructor keeps on the actor carry their values to the loop's thread, and
  so does torch's current CUDA device (``torch.cuda.set_device`` in
  ``__init__``) (:class:`ThreadState`).

What differs from Monarch: ``threading.get_ident()`` in an async actor's
``__init__`` is not the endpoints' thread, and other per-thread state made
there (not held by the actor) stays on the constructor's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import sys
import threading
from collections.abc import Callable
from typing import Any

_ON_LOOP = frozenset(
    {
        "call_later", "call_at", "run_in_executor", "add_reader", "add_writer",
        "remove_reader", "remove_writer", "add_signal_handler", "remove_signal_handler",
    }
)  # fmt: skip


class LoopFromThread:
    """The proc's loop as seen from a constructor's thread: calls that schedule go
    through the loop's own thread (an event loop is not thread-safe)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def _on_loop(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        done: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn(*args, **kwargs))
            except BaseException as e:  # handed back to the constructor's thread
                done.set_exception(e)

        self._loop.call_soon_threadsafe(run)
        return done.result()

    def create_task(self, coro: Any, **kwargs: Any) -> asyncio.Task:
        return self._on_loop(self._loop.create_task, coro, **kwargs)

    def call_soon(self, callback: Callable[..., Any], *args: Any, context: Any = None) -> Any:
        return self._loop.call_soon_threadsafe(callback, *args, context=context)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._loop, name)
        if name in _ON_LOOP:
            return lambda *a, **k: self._on_loop(attr, *a, **k)
        return attr

    def __eq__(self, other: object) -> bool:
        return other is self or other is self._loop

    def __hash__(self) -> int:
        return hash(self._loop)


class ThreadState:
    """What the constructor's thread holds that the endpoints' thread must hold too."""

    __slots__ = ("locals", "cuda_device")

    def __init__(self, obj: Any) -> None:
        try:
            attrs = list(vars(obj).values())
        except TypeError:  # __slots__ only
            attrs = []
        self.locals = [(v, dict(v.__dict__)) for v in attrs if isinstance(v, threading.local)]
        self.cuda_device: int | None = None
        torch = sys.modules.get("torch")
        if torch is not None:
            try:
                if torch.cuda.is_initialized():
                    self.cuda_device = torch.cuda.current_device()
            except Exception:  # a torch without CUDA support
                pass

    def restore(self) -> None:
        """On the thread that will run the endpoints: what the constructor set."""
        for local, values in self.locals:
            local.__dict__.update(values)
        if self.cuda_device is not None:
            import torch

            if torch.cuda.current_device() != self.cuda_device:
                torch.cuda.set_device(self.cuda_device)


async def construct_on_thread(
    loop: asyncio.AbstractEventLoop, build: Callable[[], Any], label: str
) -> Any:
    """Run ``build()`` on a new daemon thread and wait for it without holding the loop.

    The thread runs in a copy of the caller's context (the actor's ``context()``)
    with :class:`LoopFromThread` as its running loop. If ``build`` never returns,
    the thread stays, as a daemon: it does not keep the process alive.
    """
    done = loop.create_future()
    ctx = contextvars.copy_context()
    seen = LoopFromThread(loop)

    def settle(ok: bool, value: Any) -> None:
        if done.done():
            return
        if ok:
            done.set_result(value)
        else:
            done.set_exception(value)

    def main() -> None:
        asyncio.events._set_running_loop(seen)  # type: ignore[arg-type]
        try:
            obj = build()
            result: tuple[bool, Any] = (True, (obj, ThreadState(obj)))
        except BaseException as e:  # handed back to the loop, which raises it
            result = (False, e)
        finally:
            asyncio.events._set_running_loop(None)
        try:
            loop.call_soon_threadsafe(settle, *result)
        except RuntimeError:  # the loop closed while __init__ ran: nobody waits
            pass

    threading.Thread(target=ctx.run, args=(main,), name=f"{label} __init__", daemon=True).start()
    obj, state = await done
    state.restore()
    return obj
