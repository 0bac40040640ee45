"""User metrics: ``get_meter(name).create_counter(...)``, as in Monarch 0.7.

Monarch 0.7's ``monarch.actor.get_meter`` hands out OpenTelemetry instruments
(counters, up-down counters, histograms). These follow the same API
(``add(amount, attributes)``, ``record(amount, attributes)``), without needing
the OpenTelemetry packages: each instrument sums what it is given per set of
attributes, and at every telemetry interval the process's recorder publishes
one point per (instrument, attributes) with what came in during the interval
(delta temporality, as Monarch's telemetry tables hold them), into the same
stream as the spans. ``monarch query`` shows them in its ``metrics`` table; the
client's OTLP exporter (when configured) replays them into the OpenTelemetry SDK.

While telemetry is off an instrument is a no-op; instruments may be made
before the runtime starts (at import time, as is usual) and record once it is on.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from monarch.telemetry import recorder as _rec

DEFAULT_BOUNDS: tuple[float, ...] = (
    0, 5, 10, 25, 50, 75, 100, 250, 500, 750, 1000, 2500, 5000, 7500, 10000,
)  # fmt: skip
"""OpenTelemetry's default explicit histogram bucket boundaries."""

_VALUES_CAP = 2048  # raw histogram values kept per point for an OTLP exporter

Attributes = Mapping[str, Any] | None


def key_of(attributes: Attributes) -> tuple:
    """The key a set of attributes is summed under (see ``Counter.add_keyed``)."""
    return _key(attributes)


def _key(attributes: Attributes) -> tuple:
    if not attributes:
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in attributes.items()))


class _Instrument:
    kind = ""

    def __init__(self, meter: Meter, name: str, unit: str = "", description: str = "") -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"an instrument needs a non-empty name, not {name!r}")
        self.meter = meter
        self.name = name
        self.unit = unit
        self.description = description
        self._lock = threading.Lock()
        self._points: dict[tuple, Any] = {}

    def __reduce__(self) -> tuple:
        # An actor class defined in a script travels by value, with the instruments its
        # module holds: each process gets (or makes) its own instrument of that name.
        bounds = getattr(self, "bounds", None)
        return (
            _instrument,
            (self.meter.name, self.kind, self.name, self.unit, self.description, bounds),
        )

    def _point(self, key: tuple, state: Any, now: float) -> dict[str, Any]:
        return {
            "time": now,
            "scope": self.meter.name,
            "name": self.name,
            "kind": self.kind,
            "unit": self.unit,
            "labels": dict(key),
            "value": state,
        }

    def collect(self, now: float) -> list[dict[str, Any]]:
        """The points of the interval that ends now, and a fresh interval."""
        with self._lock:
            points, self._points = self._points, {}
        return [self._point(key, state, now) for key, state in points.items()]


class _Sum(_Instrument):
    """What a counter and an up-down counter share: a running sum per attribute set."""

    def add_keyed(self, amount: float, key: tuple) -> None:
        """``add`` with the attributes already made a key (``key_of``): the runtime's own
        per-call counters skip sorting them each time."""
        with self._lock:
            self._points[key] = self._points.get(key, 0) + amount


class Counter(_Sum):
    """A monotonic sum: ``add`` takes non-negative amounts."""

    kind = "counter"

    def add(self, amount: float, attributes: Attributes = None, context: Any = None) -> None:
        if amount < 0:
            raise ValueError(f"counter {self.name!r} only goes up: add({amount}) is negative")
        if _rec.ON:
            self.add_keyed(amount, _key(attributes))


class UpDownCounter(_Sum):
    """A sum that may go down (queue lengths, things in use)."""

    kind = "up_down_counter"

    def add(self, amount: float, attributes: Attributes = None, context: Any = None) -> None:
        if _rec.ON:
            self.add_keyed(amount, _key(attributes))


class Histogram(_Instrument):
    """A distribution: count, sum, min, max and explicit buckets per interval."""

    kind = "histogram"

    def __init__(
        self,
        meter: Meter,
        name: str,
        unit: str = "",
        description: str = "",
        bounds: Sequence[float] | None = None,
    ) -> None:
        super().__init__(meter, name, unit, description)
        self.bounds = tuple(bounds) if bounds is not None else DEFAULT_BOUNDS

    def record(self, amount: float, attributes: Attributes = None, context: Any = None) -> None:
        if _rec.ON:
            self.record_keyed(amount, _key(attributes))

    def record_keyed(self, amount: float, key: tuple) -> None:
        """``record`` with the attributes already made a key (``key_of``)."""
        self.record_many((amount,), key)

    def record_many(self, amounts: Sequence[float], key: tuple) -> None:
        """Several values under one key (``key_of``), taking the lock once."""
        if not amounts:
            return
        bounds = self.bounds
        with self._lock:
            st = self._points.get(key)
            if st is None:
                first = amounts[0]
                st = self._points[key] = [0, 0.0, first, first, [0] * (len(bounds) + 1), []]
            buckets, values = st[4], st[5]
            for amount in amounts:
                st[0] += 1
                st[1] += amount
                if amount < st[2]:
                    st[2] = amount
                if amount > st[3]:
                    st[3] = amount
                buckets[bisect.bisect_left(bounds, amount)] += 1
                if len(values) < _VALUES_CAP:
                    values.append(amount)

    def _point(self, key: tuple, state: Any, now: float) -> dict[str, Any]:
        count, total, lo, hi, buckets, values = state
        point = super()._point(key, total, now)
        point.update(count=count, min=lo, max=hi, buckets=buckets, bounds=list(self.bounds))
        rec = _rec.current_recorder()
        if rec is not None and rec.keep_values:
            point["values"] = values
        return point


class Meter:
    """Makes instruments whose points go to the telemetry stream (``monarch query``).

    Create instruments once and reuse them; keep attributes to bounded sets
    (operation, outcome), as each distinct set is its own series.
    """

    def __init__(self, name: str, version: str | None = None, schema_url: str | None = None):
        self.name = name
        self.version = version
        self.schema_url = schema_url
        self._instruments: dict[tuple[str, str], _Instrument] = {}
        self._lock = threading.Lock()
        _meters.append(self)

    def __reduce__(self) -> tuple:
        return (get_meter, (self.name, self.version, self.schema_url))

    def _get(self, cls: type, name: str, *args: Any) -> Any:
        """The instrument of this kind and name: made once, as OpenTelemetry's are."""
        with self._lock:
            inst = self._instruments.get((cls.kind, name))
            if inst is None:
                inst = self._instruments[(cls.kind, name)] = cls(self, name, *args)
            return inst

    def create_counter(self, name: str, unit: str = "", description: str = "") -> Counter:
        return self._get(Counter, name, unit, description)

    def create_up_down_counter(
        self, name: str, unit: str = "", description: str = ""
    ) -> UpDownCounter:
        return self._get(UpDownCounter, name, unit, description)

    def create_histogram(
        self,
        name: str,
        unit: str = "",
        description: str = "",
        *,
        explicit_bucket_boundaries_advisory: Sequence[float] | None = None,
    ) -> Histogram:
        return self._get(Histogram, name, unit, description, explicit_bucket_boundaries_advisory)

    def _unsupported(self, what: str) -> NotImplementedError:
        return NotImplementedError(
            f"{what} is not implemented (as in Monarch 0.7): use create_counter, "
            "create_up_down_counter or create_histogram"
        )

    def create_gauge(self, name: str, unit: str = "", description: str = "") -> Any:
        raise self._unsupported("create_gauge")

    def create_observable_counter(self, name: str, callbacks: Any = None, **kw: Any) -> Any:
        raise self._unsupported("create_observable_counter")

    def create_observable_gauge(self, name: str, callbacks: Any = None, **kw: Any) -> Any:
        raise self._unsupported("create_observable_gauge")

    def create_observable_up_down_counter(self, name: str, callbacks: Any = None, **kw: Any) -> Any:
        raise self._unsupported("create_observable_up_down_counter")


_meters: list[Meter] = []
_by_name: dict[str, Meter] = {}
_lock = threading.Lock()


def get_meter(
    name: str = "monarch", version: str | None = None, schema_url: str | None = None
) -> Meter:
    """The process's meter called ``name`` (Monarch 0.7: ``get_meter()``, scope ``monarch``).

    Its instruments publish only while telemetry is on (``MONARCH_TELEMETRY=1``).
    """
    with _lock:
        meter = _by_name.get(name)
        if meter is None:
            meter = _by_name[name] = Meter(name, version, schema_url)
        return meter


def _instrument(
    scope: str, kind: str, name: str, unit: str, description: str, bounds: Any = None
) -> _Instrument:
    meter = get_meter(scope)
    if kind == "histogram":
        return meter.create_histogram(
            name, unit, description, explicit_bucket_boundaries_advisory=bounds
        )
    if kind == "counter":
        return meter.create_counter(name, unit, description)
    return meter.create_up_down_counter(name, unit, description)


def collect_all(now: float) -> list[dict[str, Any]]:
    """Every instrument's points for the interval that ends now (the recorder's collector)."""
    points: list[dict[str, Any]] = []
    for meter in list(_meters):
        for inst in list(meter._instruments.values()):
            points.extend(inst.collect(now))
    return points
