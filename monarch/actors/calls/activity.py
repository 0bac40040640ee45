"""What each actor of this process is doing: the per-process activity book.

Viewers (``monarch top``, ``monarch dashboard``, ``monarch stacks``, stall
detection) need to know, for every actor here, whether it is starting,
serving, stalled, failed or stopped, and per endpoint how many calls finished,
how many raised, which are running now (since when, for whom, on which
thread) and how long they took. The book keeps that, written by the threads
that run endpoints (:class:`ActorActivity.begin` / :meth:`ActorActivity.end`)
and read by another one (the heartbeat thread answers ``mon.<ns>.ctl.stats``
while the proc's loop may be blocked), so:

* the cost per call is a few attribute operations: one ``Call`` object, one
  set insertion and removal, two clock reads, one histogram increment.
  Nothing is formatted until someone asks (the caller's uid is read from the
  message only when shown);
* readers copy the shared containers first and retry when a writer changed
  them meanwhile (:func:`copied`): writers never take a lock, except for the
  counters of a ``@concurrent_endpoint``, whose calls end on several threads
  at once and would otherwise lose increments.

Latency histograms have FIXED log2 buckets in microseconds: bucket ``i``
counts the calls that took less than ``2**i`` us (and at least
``2**(i-1)`` us), ``i = 0..31``; bucket 31 also takes everything longer
(overflow, >= ~18 min). :data:`BUCKET_BOUNDS_US` lists the upper bounds and
:func:`percentile` turns a histogram (or the sum of several) into seconds.

``calls`` counts finished calls, raised or not; ``errors`` those that raised.

Stopped and failed actors stay in the book :data:`KEEP_ENDED` seconds, so a
viewer that looks a moment later still sees them.

:data:`call_listeners`: callables given one raw record per finished call
(:data:`RAW_CALL_FIELDS`; on the thread that ran it, after its reply was
written; keep them quick, they must not raise), which :func:`call_record`
turns into a :class:`CallRecord`. Empty by default, and then a call costs
nothing more. The raw record is a plain tuple of what the thread already
holds: building a ``CallRecord`` there (parsing the caller out of a header,
two clock conversions) took ~7 us of the actor's thread per call with
telemetry on (benchmarks/NOTES.md 52); a reader converts a whole batch later.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from monarch.broker.vocabulary.headers import TRACE

BUCKETS = 32
BUCKET_BOUNDS_US: list[float] = [float(2**i) for i in range(BUCKETS - 1)] + [float("inf")]
"""Upper bound (exclusive) of each histogram bucket, in microseconds; the last: overflow."""

KEEP_ENDED = 60.0  # seconds a stopped or failed actor stays in the book
RECENT_FAILURES = 50  # failures (and stalls) kept for viewers, newest last

_monotonic = time.monotonic  # bound once: read on every call
_get_ident = threading.get_ident

# time.time() of a time.monotonic() reading: the book reads the monotonic
# clock only (one clock read per event), and shows wall times through this.
_WALL_OFFSET = time.time() - time.monotonic()

FLOW_MARKER = "_flow_marker"  # a sender's flow marker runs as an "endpoint": not shown


class CallRecord(NamedTuple):
    """One finished call, as :data:`call_listeners` receive it (times: ``time.time()``)."""

    actor_id: str
    mesh: str
    mesh_uid: str
    rank: int
    endpoint: str
    caller: str  # the calling process's uid ("" when unknown)
    t_delivered: float  # when the proc's intake handed the message to the actor (0: unknown)
    t_started: float
    t_ended: float
    ok: bool
    trace: str = ""  # the call's Mon-Trace header, set while the caller records telemetry


RAW_CALL_FIELDS = (
    "actor_id", "mesh", "mesh_uid", "rank", "endpoint", "headers", "reply", "delivered",
    "started", "ended", "ok",
)  # fmt: skip
"""A raw record's fields, as :data:`call_listeners` get them: ``headers`` the message's
(or None), ``reply`` its reply subject (or None), ``delivered`` a ``time.time()`` (0:
unknown), ``started``/``ended`` ``time.monotonic()`` readings of this process."""

call_listeners: list[Callable[[tuple], None]] = []
"""Called with each finished call's raw record (:data:`RAW_CALL_FIELDS`; the telemetry
hangs here); :func:`call_record` makes a :class:`CallRecord` of it."""


def wall_now() -> float:
    """Now, as :func:`wall` gives it: comparable with the book's other times (time.time()
    itself may step, or round differently, between two readings)."""
    return _monotonic() + _WALL_OFFSET


def wall(monotonic: float) -> float:
    """The ``time.time()`` of a ``time.monotonic()`` reading of this process."""
    return monotonic + _WALL_OFFSET


def bucket_of(seconds: float) -> int:
    """The histogram bucket of a call that took ``seconds``."""
    i = int(seconds * 1_000_000).bit_length() if seconds > 0 else 0
    return i if i < BUCKETS else BUCKETS - 1


def percentile(hist: list[int], q: float) -> float:
    """The ``q`` quantile (0..1) of a histogram's calls, in seconds (0.0 when empty).

    Interpolated linearly inside the bucket where it falls, so it is exact to
    within that bucket (a factor of two); an overflow bucket answers its lower bound.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"percentile: q must be within 0..1, not {q!r}")
    total = sum(hist)
    if total == 0:
        return 0.0
    want = q * total
    seen = 0
    for i, n in enumerate(hist):
        if n and seen + n >= want:
            low = 0.0 if i == 0 else 2.0 ** (i - 1)
            if i >= BUCKETS - 1:
                return low / 1e6
            return (low + (2.0**i - low) * max(0.0, want - seen) / n) / 1e6
        seen += n
    return 2.0 ** (BUCKETS - 2) / 1e6


def caller_of(msg: Any) -> str:
    """The uid of the process that sent ``msg``: from ``Mon-Seq: <n>@<uid>``, else from
    its reply subject ``mon.<ns>.port.<uid>.<id>`` ("" when neither says)."""
    return caller_from(getattr(msg, "headers", None), getattr(msg, "reply", None))


def caller_from(headers: dict | None, reply: str | None) -> str:
    """:func:`caller_of` given a message's headers and reply subject."""
    seq = (headers or {}).get("Mon-Seq") or ""
    at = seq.find("@")
    if at >= 0:
        return seq[at + 1 :]
    parts = (reply or "").split(".")
    if len(parts) == 5 and parts[2] == "port":
        return parts[3]
    return ""


class EndpointStats:
    """Counters of one endpoint of one actor."""

    __slots__ = ("name", "calls", "errors", "hist", "lock")

    def __init__(self, name: str, shared: bool) -> None:
        self.name = name
        self.calls = 0
        self.errors = 0
        self.hist = [0] * BUCKETS
        # Calls of a concurrent endpoint end on several threads at once.
        self.lock = threading.Lock() if shared else None


class Call:
    """One call being handled now."""

    __slots__ = ("ep", "msg", "started", "thread", "stalled", "stall")

    def __init__(self, ep: EndpointStats, msg: Any, started: float, thread: int) -> None:
        self.ep = ep
        self.msg = msg
        self.started = started  # time.monotonic()
        self.thread = thread  # threading.get_ident() of the thread running it
        self.stalled = False  # reported as stalled (ActivityBook.newly_stalled)
        self.stall: dict | None = None  # its record in ActivityBook.stalls, once stalled


class ActorActivity:
    """The activity of one actor of this process (see the module docstring)."""

    def __init__(
        self, actor_id: str, mesh: str, mesh_uid: str, rank: int, cls: str, sizes: dict[str, int]
    ) -> None:
        self.actor_id = actor_id
        self.mesh = mesh
        self.mesh_uid = mesh_uid
        self.rank = rank
        self.cls = cls
        self.sizes = sizes
        self.state = "starting"  # starting, serving, failed, stopped ("stalled" is derived)
        self.failure: str | None = None
        self.ended: float | None = None  # monotonic time it stopped or failed
        self.endpoints: dict[str, EndpointStats] = {}
        self.in_flight: set[Call] = set()

    # -- written by the threads that run endpoints --------------------------------

    def begin(self, name: str, concurrent: bool, msg: Any) -> Call:
        """A call of endpoint ``name`` starts on this thread."""
        ep = self.endpoints.get(name)
        if ep is None:
            ep = self.endpoints[name] = EndpointStats(name, concurrent)
        call = Call(ep, msg, _monotonic(), _get_ident())
        self.in_flight.add(call)
        return call

    def end(self, call: Call, ok: bool, later: list[tuple] | None = None) -> None:
        """``call`` is over (``ok``: it returned rather than raised).

        ``later``: where a listened-to call's record waits, to be told with
        :func:`tell_later` once its reply is written (the record is off the
        reply's latency path); None: told now.
        """
        now = _monotonic()
        self.in_flight.discard(call)
        ep = call.ep
        i = int((now - call.started) * 1_000_000).bit_length()
        if ep.lock is None:
            ep.hist[i if i < BUCKETS else BUCKETS - 1] += 1
            ep.calls += 1
            if not ok:
                ep.errors += 1
        else:
            with ep.lock:
                ep.hist[i if i < BUCKETS else BUCKETS - 1] += 1
                ep.calls += 1
                if not ok:
                    ep.errors += 1
        if call.stalled and call.stall is not None:  # the stall is over
            call.stall["finished_after"] = round(now - call.started, 3)
        if call_listeners:
            msg = call.msg
            raw = (self.actor_id, self.mesh, self.mesh_uid, self.rank, ep.name,
                   getattr(msg, "headers", None), getattr(msg, "reply", None),
                   getattr(msg, "_mon_delivered", 0.0), call.started, now, ok)  # fmt: skip
            if later is None:
                _tell(raw)
            else:
                later.append(raw)

    # -- life ------------------------------------------------------------------------

    def serving(self) -> None:
        """``__init__`` returned."""
        if self.state == "starting":
            self.state = "serving"

    def failed(self, reason: str) -> None:
        """The actor failed (or its ``__init__`` raised): ``reason`` says why."""
        if self.state == "failed":
            return
        self.state = "failed"
        self.failure = reason
        book.failures.append({"actor_id": self.actor_id, "reason": reason, "time": time.time()})

    def stopped(self) -> None:
        """The actor is gone from the process (a failed one stays ``failed``)."""
        if self.state != "failed":
            self.state = "stopped"
        if self.ended is None:
            self.ended = time.monotonic()

    # -- read by viewers, on any thread ------------------------------------------------

    def calls_now(self) -> list[Call]:
        """The calls in flight, copied."""
        return copied(self.in_flight)

    def describe(self, threshold: float, now: float, thread_names: dict[int, str]) -> dict:
        """This actor as the stats answer shows it (see monarch.actors.hosting.stats)."""
        flying = []
        for call in sorted(self.calls_now(), key=lambda c: c.started):
            seconds = max(0.0, now - call.started)
            flying.append({
                "endpoint": call.ep.name,
                "seconds": round(seconds, 6),
                "started_at": wall(call.started),
                "caller": caller_of(call.msg),
                "thread": thread_names.get(call.thread, str(call.thread)),
                "stalled": call.stalled or seconds > threshold,
            })  # fmt: skip
        endpoints = {
            ep.name: {
                "calls": ep.calls,
                "errors": ep.errors,
                "in_flight": sum(1 for f in flying if f["endpoint"] == ep.name),
                "hist": list(ep.hist),
            }
            for ep in copied(self.endpoints)
            if ep.name != FLOW_MARKER
        }
        flying = [f for f in flying if f["endpoint"] != FLOW_MARKER]
        state = self.state
        if state == "serving" and any(f["stalled"] for f in flying):
            state = "stalled"
        return {
            "actor_id": self.actor_id,
            "mesh": self.mesh,
            "mesh_uid": self.mesh_uid,
            "rank": self.rank,
            "class": self.cls,
            "sizes": dict(self.sizes),
            "state": state,
            "failure": self.failure,
            "endpoints": endpoints,
            "in_flight": flying,
        }


class ActivityBook:
    """Every actor of this process, and its recent failures and stalls (one per process)."""

    def __init__(self) -> None:
        self.actors: dict[str, ActorActivity] = {}  # actor id -> its activity (the latest)
        self.failures: collections.deque[dict] = collections.deque(maxlen=RECENT_FAILURES)
        self.stalls: collections.deque[dict] = collections.deque(maxlen=RECENT_FAILURES)

    def add(self, actor_id: str, mesh: str, mesh_uid: str, rank: int, cls: str,
            sizes: dict[str, int]) -> ActorActivity:  # fmt: skip
        """A new actor (``__init__`` about to run): its activity, state ``starting``."""
        act = ActorActivity(actor_id, mesh, mesh_uid, rank, cls, sizes)
        self.actors[actor_id] = act
        return act

    def current(self) -> list[ActorActivity]:
        """The actors to show: live ones, and those ended less than KEEP_ENDED s ago."""
        now = time.monotonic()
        acts = copied(self.actors)
        for act in acts:
            if act.ended is not None and now - act.ended > KEEP_ENDED:
                if self.actors.get(act.actor_id) is act:
                    self.actors.pop(act.actor_id, None)
        return [a for a in acts if a.ended is None or now - a.ended <= KEEP_ENDED]

    def newly_stalled(self, threshold: float) -> list[tuple[ActorActivity, Call, dict]]:
        """Calls running longer than ``threshold`` seconds that were not stalled before:
        each is marked stalled and recorded in :attr:`stalls` (``finished_after`` is
        added once it ends). Call from one thread only (the heartbeat thread)."""
        now = time.monotonic()
        found = []
        for act in self.current():
            for call in act.calls_now():
                seconds = now - call.started
                if call.stalled or seconds <= threshold or call.ep.name == FLOW_MARKER:
                    continue
                record = {
                    "actor_id": act.actor_id,
                    "mesh": act.mesh,
                    "mesh_uid": act.mesh_uid,
                    "rank": act.rank,
                    "endpoint": call.ep.name,
                    "caller": caller_of(call.msg),
                    "seconds": round(seconds, 3),
                    "time": time.time(),
                    "finished_after": None,
                }
                call.stall = record
                call.stalled = True
                if call not in act.in_flight:  # it ended meanwhile, unseen by end()
                    record["finished_after"] = record["seconds"]
                self.stalls.append(record)
                found.append((act, call, record))
        return found

    def describe(self, threshold: float) -> list[dict]:
        """Every current actor as the stats answer shows it."""
        names = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
        now = time.monotonic()
        return [a.describe(threshold, now, names) for a in self.current()]


book = ActivityBook()
"""This process's book."""


def _forget_after_fork() -> None:
    """A forked child has none of its parent's actors (their threads did not survive)."""
    global book
    book = ActivityBook()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def copied(container: Any) -> list:
    """A list of a dict's values or a set's members, while other threads change it."""
    values = container.values() if isinstance(container, dict) else container
    for _ in range(100):
        try:
            return list(values)
        except RuntimeError:  # changed size while being copied: try again
            continue
    return []


def tell_later(later: list[tuple]) -> None:
    """Tell :data:`call_listeners` the raw records :meth:`ActorActivity.end` left in ``later``."""
    for raw in later:
        _tell(raw)
    later.clear()


def _tell(raw: tuple) -> None:
    for listener in call_listeners:
        try:
            listener(raw)
        except Exception:  # a viewer's hook must not break the actor's call
            pass


def call_record(raw: tuple) -> CallRecord:
    """The :class:`CallRecord` of a raw record (:data:`RAW_CALL_FIELDS`); any thread."""
    actor_id, mesh, mesh_uid, rank, endpoint, headers, reply, delivered, started, ended, ok = raw
    return CallRecord(
        actor_id, mesh, mesh_uid, rank, endpoint, caller_from(headers, reply), delivered,
        started + _WALL_OFFSET, ended + _WALL_OFFSET, ok, (headers or {}).get(TRACE, ""),
    )  # fmt: skip
