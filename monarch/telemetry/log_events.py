"""Log records as telemetry: :class:`TracingForwarder`, a ``logging.Handler``.

Monarch 0.7's ``TracingForwarder`` hands each record to its tracing backend,
tagged with the running actor's id. Ours hands it to this process's telemetry
recorder (:mod:`monarch.telemetry.recorder`): it travels in the process's
telemetry batches as a ``log`` record, is read back by
:func:`monarch.telemetry.stream.decode_batch`, is the ``logs`` table of
``monarch query`` and is exported by the OTLP exporter as a span event.

The handler is added by user code to a logger, so it is off every message
path; with telemetry off it costs one check per record. It never raises out of
:meth:`TracingForwarder.emit`: a log call must not fail an actor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from monarch.telemetry import recorder as tel

_actor_id: Callable[[], str | None] = lambda: None  # noqa: E731


def set_actor_id_source(fn: Callable[[], str | None]) -> None:
    """How to learn the running actor's id (the actor layer sets it; this floor knows no actors)."""
    global _actor_id
    _actor_id = fn


class TracingForwarder(logging.Handler):
    """Turns each log record into a ``log`` telemetry record of this process.

    Inside an actor the record also gets ``record.actor_id`` (as Monarch's does),
    which the telemetry record carries; elsewhere the id is ``None``.
    """

    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(level)

    def emit(self, record: logging.LogRecord) -> None:
        rec = tel._recorder
        if rec is None:  # telemetry off: the one check
            return
        try:
            actor_id = getattr(record, "actor_id", None) or _actor_id()
            if actor_id is not None:
                record.actor_id = actor_id
            message = record.getMessage()
            prefix = getattr(record, "actor_prefix", None)  # "[actor=...] ": a column here
            if prefix and message.startswith(prefix):
                message = message[len(prefix) :]
            rec.log((record.created, actor_id, record.levelname, record.name, message,
                     record.pathname, record.lineno))  # fmt: skip
        except Exception:
            self.handleError(record)
