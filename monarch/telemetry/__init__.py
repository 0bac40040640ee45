"""Telemetry you can query: per-message spans, endpoint metrics and user meters.

Off by default. With ``MONARCH_TELEMETRY=1`` each process records a span for
every call's send (caller), deliver and handle (the actor) and reply (caller),
counts calls, errors and durations per endpoint, and takes the points of
:func:`get_meter`'s instruments; it publishes them in batches to a bounded
JetStream stream that ``monarch query "SELECT ..."`` reads into SQLite, and
the client exports them to OpenTelemetry when an OTLP endpoint is configured.
docs/telemetry.md has the whole story.

Layer: beside :mod:`monarch.core`; it uses only :mod:`monarch.broker`. The
actor layer hands it what it publishes with (``monarch.actors.hosting.telemetry``)
and calls its hooks.
"""

from monarch.telemetry.meter import Counter, Histogram, Meter, UpDownCounter, get_meter
from monarch.telemetry.recorder import Recorder, current_recorder

__all__ = [
    "Counter",
    "Histogram",
    "Meter",
    "Recorder",
    "UpDownCounter",
    "current_recorder",
    "get_meter",
]
