"""``span(name)`` and ``@traced``: spans of the user's own code, as in Monarch 0.7.

``with span("load batch"):`` records one span named ``load batch`` around the
block, with the running actor's id, mesh and rank (none in the client), into
the same telemetry stream as the message spans (``monarch query``:
``SELECT * FROM spans WHERE span = 'load batch'``); ``@traced`` (or
``@traced(name=...)``) wraps a sync or async function in one. ``ok`` is 0
when the block raised. While telemetry is off both cost a boolean check.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar, overload

from monarch.actors.calls.context import actor_context
from monarch.telemetry import recorder as tel

F = TypeVar("F", bound=Callable[..., Any])


class Span:
    """A context manager that records one span of the code inside it."""

    __slots__ = ("name", "_start")

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a span needs a non-empty name, not {name!r}")
        self.name = name
        self._start = 0.0

    def __enter__(self) -> Span:
        if tel.ON:
            self._start = time.time()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self._start:
            return
        start, self._start = self._start, 0.0
        ctx = actor_context()
        actor_id = mesh = rank = None
        if ctx is not None:
            ins = ctx.actor_instance
            actor_id, mesh, rank = ins.actor_id, ins.name, ins.rank.rank
        tel.span(self.name, None, start, time.time(), actor_id, mesh, rank, None, exc_type is None)


def span(name: str) -> Span:
    """A span around a ``with`` block (Monarch 0.7's ``monarch.actor.span``)."""
    return Span(name)


@overload
def traced(fn: F) -> F: ...


@overload
def traced(*, name: str | None = None) -> Callable[[F], F]: ...


def traced(fn: Any = None, *, name: str | None = None) -> Any:
    """Record a span around each call of the function (its ``__name__``, or ``name``)."""

    def wrap(fn: Any) -> Any:
        label = name or fn.__name__
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with Span(label):
                    return await fn(*args, **kwargs)

            return run_async

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with Span(label):
                return fn(*args, **kwargs)

        return run

    return wrap(fn) if fn is not None else wrap
