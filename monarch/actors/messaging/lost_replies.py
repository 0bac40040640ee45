"""Lost calls and replies: a call whose request or reply vanished with a broker node ends anyway.

NATS core delivers at most once. When the broker node a proc is connected to
dies, the replies that proc had just published, and the calls routed through
that node to it, are gone; the proc reconnects to another node of the cluster
and nobody knows. The caller itself is still connected, so nothing tells it
either: it would wait until its own timeout, or forever.

Two halves close that gap:

* The replier (:class:`ReplyLedger`, one per process) remembers which calls
  it received and not yet answered, and the replies it sent, for
  ``REPLY_TTL`` seconds and at most ``REPLY_CACHE_BYTES`` (a big reply is a
  small reference to bytes kept out of band, so the cache stays small). When
  its own connection comes back after a drop, it publishes again the replies
  of the ``RESEND_WINDOW`` seconds before the drop: those that died with the
  node arrive now, the others are duplicates that the caller drops.
* The caller (:class:`CallProber`, one per process) asks about every call
  still unanswered ``PROBE_AFTER`` seconds after it left, and again at twice
  that age, and so on, then every ``PROBE_EVERY`` seconds: one ``probe``
  control message per proc that hosts a missing rank, listing ``[reply
  subject, rank]`` pairs. The proc answers each with ``replied`` (and
  publishes that reply again), ``pending`` (received, not answered yet) or
  ``unknown`` (never received: the request was lost). Once every proc asked
  has answered (or stayed silent for ``PROBE_REPLY_TIMEOUT``), a call that
  some rank never received fails with :class:`MessageLostError`, which says
  where it ran (``.ran``), where not (``.not_run``) and where nobody knows
  (``.unknown``): safe to send again only when it ran nowhere. A probe the
  broker answers "no responders" (the proc is reconnecting, or gone) is no
  answer: asked again later.

A call therefore completes or raises within ``PROBE_EVERY`` seconds (plus a
round trip) of the loss, whichever node died, while the procs asked answer
(``PROBE_REPLY_TIMEOUT`` more when one is silent; a new round waits for the
last one to end); a reply that arrives twice is
taken once (a gather takes one reply per rank). Calls that fail when the
caller's *own* connection drops are handled by supervision
(:class:`~monarch.actors.errors.BrokerLostError`), not here. A proc that dies
is the heartbeat watcher's business: a probe nobody answers is simply asked
again in the next round.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import weakref
from typing import Any

from monarch.actors.errors import MessageLostError
from monarch.actors.messaging import messages as m
from monarch.actors.process_state import actor_process
from monarch.broker.bodies.codec import dumps, loads
from monarch.broker.vocabulary import subjects

log = logging.getLogger(__name__)

REPLY_TTL = 60.0  # seconds a sent reply is kept for a caller that did not get it
REPLY_CACHE_BYTES = 64 * 1024 * 1024  # bodies and each entry's own overhead, below
# What one kept reply takes beyond its body: its key, headers and tuple (450-600
# bytes measured with tracemalloc). Counted, so that many small replies (17,000 a
# second at S2's rate) are bounded by the cap too, not only by REPLY_TTL (~600 MB).
ENTRY_OVERHEAD = 512
# What each rank adds to a reply kept for several ranks at once (gathered or merged on
# a per_proc proc): its place in the reply's set of ranks (~56 bytes measured
# with tracemalloc); the body, headers and tuple are one for all of them (NOTES 64).
RANK_ENTRY_OVERHEAD = 64
MAX_PENDING = 100_000  # received calls not answered yet that are remembered (by rank)
RESEND_WINDOW = 1.0  # seconds before a connection drop whose replies are sent again
PROBE_AFTER = 1.0  # a call unanswered this long is asked about (then at 2x, 4x...)
PROBE_EVERY = 4.0  # ...up to this interval
PROBE_REPLY_TIMEOUT = 5.0  # a probe's own answer port stays open this long
TICK = 0.25

# A reply kept: (when sent, body, headers, its rank or set of ranks, its subject, the
# bytes it is counted for).
_Kept = tuple[float, bytes, dict, "int | set[int]", str, int]


def _answers(kept: _Kept, rank: int) -> bool:
    ranks = kept[3]
    return ranks == rank if type(ranks) is int else rank in ranks


class ReplyLedger:
    """The replier's memory of the calls it received and the replies it sent.

    On the loop, except :meth:`sent`, which a sync actor's thread also calls for
    a reply it writes itself (``ActorInstance._reply_from_thread``): one lock
    guards the two tables.
    """

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self._lock = threading.Lock()
        # By reply subject (one per call), not by (subject, rank): a call to a per_proc
        # group is received and answered for its k ranks with a few set operations
        # instead of k entries in a big table each way (~14% of a group's handling at
        # 1,024 actors a proc, NOTES 64).
        # reply subject -> the ranks here that received the call and did not answer yet
        self._pending: dict[str, set[int]] = {}
        self._pending_count = 0
        # reply subject -> the replies kept for it, each a _Kept: (when sent, body,
        # headers, its rank or set of ranks, subject, the bytes it is counted for)
        self._sent: dict[str, list[_Kept]] = {}
        # The same replies in the order they left; eviction takes the oldest, with all
        # its ranks. (One tuple a reply, in both: each container more is more for the
        # garbage collector to walk: a single call's sent() took 2.5 us, not 1.2, with three.)
        self._order: collections.deque[_Kept] = collections.deque()
        self._bytes = 0
        self._dropped_at: float | None = None
        self.resent = 0  # replies published again (after a reconnect or on a probe)

    def received(self, reply: str, rank: int | list[int]) -> None:
        """A call that wants a reply at ``reply`` reached the actor of ``rank`` here
        (a list: the actors of a ``per_proc`` group it reached together, one lock)."""
        with self._lock:
            waiting = self._pending.get(reply)
            if waiting is None:
                waiting = self._pending[reply] = set()
            before = len(waiting)
            if type(rank) is list:
                waiting.update(rank)
            else:
                waiting.add(rank)
            self._pending_count += len(waiting) - before
            while self._pending_count > MAX_PENDING:  # forget the oldest calls
                oldest = next(iter(self._pending))
                self._pending_count -= len(self._pending.pop(oldest))

    def sent(self, subject: str, rank: int | list[int], body: bytes, headers: dict) -> None:
        """A reply left; remembered only when it answers a call received here.

        ``rank`` a list: one reply that answers for all of them (gathered or merged on
        this proc, :mod:`monarch.actors.hosting.reduce`), kept once for them and counted
        for its body and entry once and each rank on top (:data:`RANK_ENTRY_OVERHEAD`;
        counted whole under each rank, the cap filled ~k times too fast and every call
        of a sustained broadcast evicted ~k entries, NOTES 64)."""
        now = time.monotonic()
        with self._lock:
            waiting = self._pending.get(subject)
            if waiting is None:
                return  # a stream port's later values, a control reply: nothing to recover
            if type(rank) is list:
                answered: int | set[int] = waiting.intersection(rank)
                if not answered:
                    return
                waiting.difference_update(answered)
                self._pending_count -= len(answered)
                weight = len(body) + ENTRY_OVERHEAD + len(answered) * RANK_ENTRY_OVERHEAD
            elif rank in waiting:
                waiting.discard(rank)
                self._pending_count -= 1
                answered, weight = rank, len(body) + ENTRY_OVERHEAD
            else:
                return
            if not waiting:
                del self._pending[subject]
            reply = (now, body, headers, answered, subject, weight)
            kept = self._sent.get(subject)
            if kept is None:
                self._sent[subject] = [reply]
            else:
                kept.append(reply)
            order = self._order
            order.append(reply)
            self._bytes += weight
            while order:
                old = order[0]
                if now - old[0] <= REPLY_TTL and self._bytes <= REPLY_CACHE_BYTES:
                    break
                order.popleft()
                self._bytes -= old[5]
                kept = self._sent[old[4]]
                kept.remove(old)  # the oldest of its subject: the first
                if not kept:
                    del self._sent[old[4]]

    def status(self, subject: str, rank: int) -> str:
        """``replied`` (and sent again), ``pending`` or ``unknown``."""
        with self._lock:
            kept = [k for k in self._sent.get(subject, ()) if _answers(k, rank)]
            pending = rank in self._pending.get(subject, ())
        if kept:
            self._resend(subject, kept[-1])
            return "replied"
        return "pending" if pending else "unknown"

    def answer_probe(self, msg: Any) -> None:
        """A caller asks about calls it got no reply to (a ``probe`` control message)."""
        try:
            entries = loads(msg.data)
            statuses = [self.status(str(subject), int(rank)) for subject, rank in entries]
        except Exception as e:
            log.warning("malformed probe on %s: %r", msg.subject, e)
            return
        if msg.reply:
            headers = {m.KIND: "ok", m.FROM: self.rt.proc_uid}
            self.rt.publish(msg.reply, dumps(statuses), headers)

    def connection_changed(self, connected: bool) -> None:
        if not connected:
            if self._dropped_at is None:
                self._dropped_at = time.monotonic()
            return
        dropped, self._dropped_at = self._dropped_at, None
        if dropped is None:
            return
        since = dropped - RESEND_WINDOW
        with self._lock:  # a reply for several ranks: once
            again = [(kept[4], kept) for kept in self._order if kept[0] >= since]
        for subject, kept in again:
            self._resend(subject, kept)
        if again:
            log.info(
                "%s: sent %d recent replies again after a reconnect", self.rt.proc_uid, len(again)
            )

    def _resend(self, subject: str, kept: _Kept) -> None:
        self.resent += 1
        self.rt.publish(subject, kept[1], kept[2])


class CallProber:
    """Asks the repliers about calls unanswered for too long (loop only).

    One round of probes asks, for each call due, the proc of every rank that
    has not answered. A call fails once a round that found a rank that never
    received it is complete (every proc asked has answered, or stayed silent
    for ``PROBE_REPLY_TIMEOUT``), so that its :class:`MessageLostError` names
    every rank it did not reach, and those it reached, not only the first.
    """

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        # gather -> [next probe time, interval]; weak: a finished call's values (tensor
        # handles, say) must not outlive it here until the next sweep.
        self._due: weakref.WeakKeyDictionary[Any, list[float]] = weakref.WeakKeyDictionary()
        # gather -> {rank asked in its current round: the answer, None until it comes}
        self._rounds: weakref.WeakKeyDictionary[Any, dict[int, str | None]] = (
            weakref.WeakKeyDictionary()
        )
        self.probes = 0  # probe messages sent
        self.lost = 0  # calls failed because their request never reached some rank

    def start(self) -> None:
        self.rt.every(TICK, self.sweep, "probing calls in flight")

    def restart(self, gather: Any) -> None:
        """``gather``'s call was just sent again: ask about it ``PROBE_AFTER`` from now."""
        self._due.pop(gather, None)
        self._rounds.pop(gather, None)

    def sweep(self) -> None:
        """Probe the gathers that are due; forget those that ended."""
        now = time.monotonic()
        live: list[Any] = []
        asks: dict[str, list[tuple[list, Any]]] = collections.defaultdict(list)
        for st in list(actor_process(self.rt).mesh_states.values()):
            if not st.inflight or st.local is not None or not st.ready or not st.proc_uids:
                continue  # nothing out, delivered in-process, or still queued here
            for gather in list(st.inflight):
                live.append(gather)
                due = self._due.get(gather)
                if due is None:  # first seen now: it left at most one tick ago
                    self._due[gather] = [now + PROBE_AFTER, PROBE_AFTER]
                    continue
                if now < due[0]:
                    continue
                current = self._rounds.get(gather)
                if current is not None and None in current.values():
                    continue  # its last round still waits on a proc (at most PROBE_REPLY_TIMEOUT)
                due[1] = min(due[1] * 2, PROBE_EVERY)
                due[0] = now + due[1]
                asked: dict[int, str | None] = {}
                for rank in gather.expected:
                    if (
                        rank in gather.values
                        or rank in gather.fetching  # answered: its bytes are on their way
                        or rank in st.dead
                        or rank >= len(st.proc_uids)
                    ):
                        continue
                    asked[rank] = None
                    asks[st.proc_uids[rank]].append(([gather.subject, rank], gather))
                self._rounds[gather] = asked
        live_ids = {id(g) for g in live}
        for gather in [g for g in self._due if id(g) not in live_ids]:
            del self._due[gather]
            self._rounds.pop(gather, None)
        for proc_uid, entries in asks.items():
            self._probe(proc_uid, entries)

    def _probe(self, proc_uid: str, entries: list[tuple[list, Any]]) -> None:
        rt = self.rt
        timer: asyncio.TimerHandle | None = None
        rounds = [(gather, self._rounds.get(gather)) for _, gather in entries]

        def on_answer(msg: Any) -> None:
            if (msg.headers or {}).get("Status") == "503":
                # The broker's "no responders": the proc is not connected right now (a
                # reconnect under way, or it is gone: the heartbeat watcher's business).
                # No answer yet; the timer ends this round, a later one asks again.
                return
            rt.close_port(port_id)
            if timer is not None:
                timer.cancel()
            try:
                statuses = loads(msg.data)
                if not isinstance(statuses, list) or len(statuses) != len(entries):
                    raise ValueError(f"{len(entries)} answers expected")
            except Exception as e:
                log.warning(
                    "malformed probe answer from %s: %r (headers %r, %d bytes)",
                    proc_uid, e, msg.headers, len(msg.data),
                )  # fmt: skip
                return
            self._answered(entries, rounds, [str(s) for s in statuses])

        def on_timeout() -> None:
            rt.close_port(port_id)
            self._answered(entries, rounds, ["silent"] * len(entries))

        port_id, reply = rt.open_port(on_answer)
        timer = rt.loop.call_later(PROBE_REPLY_TIMEOUT, on_timeout)
        body = dumps([entry for entry, _ in entries])
        self.probes += 1
        rt.publish(
            subjects.ctl_proc(rt.namespace, proc_uid),
            body,
            {m.KIND: "probe", m.FROM: rt.proc_uid},
            reply,
        )

    def _answered(
        self,
        entries: list[tuple[list, Any]],
        rounds: list[tuple[Any, dict[int, str | None] | None]],
        statuses: list[str],
    ) -> None:
        """Note one proc's answers; a call whose round is complete is decided."""
        touched: dict[int, tuple[Any, dict[int, str | None]]] = {}
        for (entry, gather), (_, asked), status in zip(entries, rounds, statuses):
            if asked is None or self._rounds.get(gather) is not asked:
                continue  # a later round (or none) is under way for this call
            if asked.get(entry[1], "") is None:
                asked[entry[1]] = status
            touched[id(gather)] = (gather, asked)
        for gather, asked in touched.values():
            if all(status is not None for status in asked.values()):
                self._decide(gather, asked)

    def _decide(self, gather: Any, asked: dict[int, str | None]) -> None:
        """Fail the call if its round found a rank that never received it."""
        st = gather.state
        not_run = [r for r, s in asked.items() if s == "unknown" and r not in gather.values]
        if gather not in st.inflight or not not_run:
            return  # answered meanwhile, or nothing is known lost: wait on
        ran = set(gather.values) | {r for r, s in asked.items() if s in ("replied", "pending")}
        unknown = [
            r for r in gather.expected if r not in ran and r not in not_run and r not in st.dead
        ]
        self.lost += 1
        gather.fail(lost_call_error(st, gather.endpoint, sorted(ran), not_run, unknown))


def lost_call_error(
    st: Any, endpoint: str, ran: list[int], not_run: list[int], unknown: list[int]
) -> MessageLostError:
    """A call that did not reach some ranks, saying exactly where it ran and where not."""
    lost = ", ".join(map(str, sorted(not_run)))
    text = (
        f"the call to {st.class_name}.{endpoint} on actor mesh {st.name!r} was lost on its "
        f"way to rank(s) {lost}: their procs never received it (a broker node on its path "
        "died?), so it did not run there."
    )
    if ran:
        text += (
            f" It ran (or is running) on rank(s) {', '.join(map(str, ran))}: calling the "
            "whole mesh again runs it twice there; repeat it on the ranks where it did not run."
        )
    if unknown:
        text += (
            f" Whether it ran on rank(s) {', '.join(map(str, unknown))} is unknown (their "
            "procs did not answer)."
        )
    if not ran and not unknown:
        text += " It ran nowhere; it is safe to call again."
    return MessageLostError(
        text,
        mesh=st.name,
        counts={r: 1 for r in not_run},
        ran=ran,
        not_run=not_run,
        unknown=unknown,
    )
