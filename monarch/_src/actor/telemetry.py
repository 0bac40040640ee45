"""Alias for ``monarch._src.actor.telemetry`` (see :mod:`monarch._src`).

``TracingForwarder`` is our :class:`monarch.telemetry.log_events.TracingForwarder`:
a ``logging.Handler`` whose records become ``log`` telemetry records (the
``logs`` table of ``monarch query``, span events in OTLP) when
``MONARCH_TELEMETRY=1``, and which does nothing otherwise. Code written for
Monarch adds it to a logger to send its logs to Monarch's tracing.
"""

from monarch.telemetry.log_events import TracingForwarder

__all__ = ["TracingForwarder"]
