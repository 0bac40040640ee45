"""Gathering the replies to one call: :class:`Gather`, one per call in flight.

The caller's proc receives replies on a port of its own; a Gather takes at
most one per expected rank, from the right actor, fetches a big one's bytes
out of band off the loop, and completes the call's future (or fails it with
the error the replies or supervision give).
"""

from __future__ import annotations

import collections
import copy
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from monarch.actors.calls.no_responders import no_responders
from monarch.actors.errors import MalformedMessageError, MessageLostError, SupervisionError
from monarch.actors.meshes.shape import View
from monarch.actors.meshes.value_mesh import ValueMesh
from monarch.actors.messaging import messages as m
from monarch.actors.messaging.flow import FLOW_ENDPOINT
from monarch.actors.messaging.reduction import decode_ranks
from monarch.core.future import Future
from monarch.core.runtime import LocalMsg
from monarch.rdma.bulk import fetch_async, is_reference
from monarch.telemetry import recorder as _tel

if TYPE_CHECKING:  # annotations only: actor_mesh builds on this module
    from nats.aio.msg import Msg

    from monarch.actors.calls.mesh_state import MeshState

_log = logging.getLogger(__name__)


class Gather:
    """Collects the replies to one call on a port of the caller's proc (on the loop;
    :meth:`open` also on the caller's thread, see ``MeshState.send_from_thread``).

    It takes at most one reply per expected rank, and only from the actor the
    call went to for that rank (its ``Mon-From`` is that actor's id). Anything
    else that reaches the port (a second reply for a rank, a rank that was not
    asked, a reply from someone else, one without a rank) is dropped, counted
    in :attr:`dropped` (process-wide, by reason) and logged (a warning at most
    every 10 s per reason, debug otherwise and for duplicates, which can be
    innocent). An endpoint that answers through an explicit response port may
    hand that port on, so there (and for ad hoc endpoints, whose kind is not
    known here) only the rank is checked. On an open broker a forger can still
    copy the right ``Mon-From``; a job key (:mod:`monarch.broker.connections.auth`) stops
    that.
    """

    dropped: collections.Counter[str] = collections.Counter()
    """Replies dropped by any gather of this process: ``duplicate``, ``unexpected_rank``,
    ``wrong_sender``, ``no_rank``."""
    _last_warning: dict[str, float] = {}
    _log = logging.getLogger(__name__)
    # Set by the call while telemetry is on (monarch.actors.calls.tracing): its trace id,
    # and when it went out, the start of each reply span.
    trace: str | None = None
    t_sent = 0.0

    def __init__(
        self,
        state: MeshState,
        view: View,
        expected: list[int],
        mode: str,
        endpoint: str,
        fold: tuple[Any, Callable[[Any, Any], Any]] | None = None,
    ) -> None:
        self.state = state
        self.view = view
        self.expected = expected
        self._expected = set(expected)
        self.mode = mode  # "mesh" | "one" | "choose" | "stream" | "fold"
        # mode "fold" (an Accumulator given a reducer): the value so far and how a reply
        # (one rank's, or several merged on their proc) is folded into it
        self.acc, self._combine = fold if fold is not None else (None, None)
        self.endpoint = endpoint
        self.values: dict[int, Any] = {}
        # Ranks whose reply came as a reference and is being fetched: answered. A copy of
        # the reply sent again meanwhile is a duplicate (the bytes are kept for one reader).
        self.fetching: set[int] = set()
        self.port_id: int | None = None
        self.subject = ""
        n = len(expected)
        self.futures = [Future() for _ in range(n if mode == "stream" else 1)]
        self._arrived = 0
        # (subject, body, headers) of a call sent to one subject: sent again when the
        # broker says nobody heard it (monarch.actors.calls.no_responders)
        self.resend: tuple[str, bytes, dict] | None = None
        self.waiting: Any = None  # no_responders' state, while it waits for a reconnect
        prop = state.endpoints.get(endpoint)
        self._check_sender = (
            prop is not None and not prop.explicit_response_port
        ) or endpoint == FLOW_ENDPOINT

    def open(self) -> None:
        """Open the reply port and count the call in flight; once (a call that the
        caller's thread could not write itself is opened again on the loop)."""
        if self.port_id is not None:
            return
        self.port_id, self.subject = self.state.rt.open_port(self.on_msg)
        self.state.inflight.add(self)

    def waiting_on(self, ranks: list[int]) -> bool:
        return any(
            r in self.expected and r not in self.values and r not in self.fetching for r in ranks
        )

    def _close(self) -> None:
        if self.port_id is not None:
            self.state.rt.close_port(self.port_id)
        self.state.inflight.discard(self)

    def fail(self, exc: BaseException) -> None:
        self._close()
        exc = self._for_this_call(exc)
        for f in self.futures:
            f.set_exception(exc)

    def _for_this_call(self, exc: BaseException) -> BaseException:
        """A failed actor's error as this call raises it: Monarch's "Endpoint call
        <mesh>.<endpoint>() failed, " first. A copy: the mesh keeps the error for
        every later call."""
        if not isinstance(exc, SupervisionError) or str(exc).startswith("Endpoint call "):
            return exc
        try:
            mine = copy.copy(exc)
        except Exception:
            return exc
        mine.args = (f"Endpoint call {self.state.name}.{self.endpoint}() failed, {exc}",)
        mine.__cause__ = exc.__cause__
        return mine

    def on_msg(self, msg: Msg) -> None:
        headers = msg.headers or {}
        if headers.get("Status") == "503":  # (msg.subject is our reply port: the broker's answer)
            no_responders(self)  # nobody heard it: a reconnect under way, or no actor
            return
        try:
            rank = int(headers[m.RANK])
        except (KeyError, ValueError):
            self._drop("no_rank", msg)
            return
        covered = self._covered(rank, headers)
        if covered is None:
            self._drop("unexpected_rank", msg)
            return
        if not self.values.keys().isdisjoint(covered) or not self.fetching.isdisjoint(covered):
            self._drop("duplicate", msg)
            return
        if self._check_sender and headers.get(m.FROM) != self.state.actor_id(rank):
            self._drop("wrong_sender", msg)
            return
        if headers.get(m.KIND) != "error" and is_reference(msg.data):
            # A big reply is a reference to bytes kept by the replier: fetch them
            # off the loop, then come back here with the real body.
            self.fetching.update(covered)
            self.state.rt.loop.create_task(self._fetch_then_take(msg))
            return
        self._take(rank, msg, covered)

    def _covered(self, rank: int, headers: Any) -> list[int] | None:
        """The ranks a reply answers for: its own, or those of a reply merged or gathered
        on its proc (``Mon-Ranks``, all of one proc); None: not for this call."""
        text = headers.get(m.RANKS)
        if text is None:
            return [rank] if rank in self._expected else None
        try:
            ranks = decode_ranks(text)
        except ValueError:
            return None
        if rank not in ranks or not self._expected.issuperset(ranks):
            return None
        uids = self.state.proc_uids
        if uids:  # merged on one proc: ranks of several procs are a forgery
            if max(ranks) < len(uids):
                procs = set(map(uids.__getitem__, ranks))  # (a C loop: ~1,000 ranks a proc)
            else:
                procs = {uids[r] if r < len(uids) else None for r in ranks}
            if len(procs) != 1:
                return None
        return ranks

    async def _fetch_then_take(self, msg: Msg) -> None:
        headers = msg.headers or {}
        rank = int(headers[m.RANK])
        covered = self._covered(rank, headers) or [rank]
        try:
            data = await fetch_async(msg.data)
        except Exception as e:
            if rank in self.values:  # a reply sent again, whose bytes the first copy took
                self._drop("duplicate", msg)
            else:
                self.fail(e)
            return
        finally:
            self.fetching.difference_update(covered)
        self._take(rank, LocalMsg(msg.subject, data, msg.reply, msg.headers, owned=True), covered)

    def _drop(self, reason: str, msg: Msg) -> None:
        Gather.dropped[reason] += 1
        headers = msg.headers or {}
        now = time.monotonic()
        level = logging.DEBUG
        # A duplicate can be innocent (a reply sent again for a caller that asked twice).
        if reason != "duplicate" and now - Gather._last_warning.get(reason, -1e9) >= 10.0:
            Gather._last_warning[reason] = now
            level = logging.WARNING
        self._log.log(
            level,
            "dropped a reply to a call of %s.%s (%s: Mon-Rank %r, Mon-From %r; %d so far): "
            "a reply must come once from the actor the call went to",
            self.state.name,
            self.endpoint,
            reason.replace("_", " "),
            headers.get(m.RANK),
            headers.get(m.FROM),
            Gather.dropped[reason],
        )

    def _refused_here(self, exc: MessageLostError, rank: int) -> MessageLostError:
        """Rank ``rank`` refused a call to several ranks (messages before it were lost):
        say where else it ran, so that nobody repeats the whole call blindly."""
        ran = sorted(r for r, v in self.values.items() if not isinstance(v, BaseException))
        unknown = sorted(r for r in self.expected if r != rank and r not in self.values)
        text = str(exc)
        if ran:
            text += f". It ran on rank(s) {', '.join(map(str, ran))}"
        if unknown:
            text += f". Whether it ran on rank(s) {', '.join(map(str, unknown))} is not known yet"
        if ran or unknown:
            text += ": calling the whole mesh again may run it twice there"
        return MessageLostError(
            text, mesh=exc.mesh, counts=exc.counts, ran=ran, not_run=[rank], unknown=unknown
        )

    def _take(self, rank: int, msg: Msg, covered: list[int]) -> None:
        """``msg``, the reply of ``rank`` and of the ranks it ``covered`` (:meth:`_covered`)."""
        if rank in self.values:  # two big replies for one rank, both fetched
            self._drop("duplicate", msg)
            return
        try:
            ok, value = m.decode_reply(msg)
            if not ok:
                value = m.decode_error(
                    value, actor_id=self.state.actor_id(rank), rank=rank, endpoint=self.endpoint
                )
                if isinstance(value.exception, (SupervisionError, MessageLostError)):
                    value = value.exception  # not an endpoint error: a failed actor, a lost message
                if isinstance(value, MessageLostError) and len(self.expected) > 1:
                    value = self._refused_here(value, rank)
        except Exception as e:  # an undecodable reply fails the call, not the loop
            ok, value = False, e
        if self.mode == "fold":
            self._fold(covered, ok, value)
            return
        headers = msg.headers or {}
        if m.RANKS not in headers:
            self._settle(rank, ok, value)
            return
        # Gathered on its proc (monarch.actors.hosting.reduce): the ranks' values, in order.
        if ok and (type(value) is not list or len(value) != len(covered)):
            count = len(value) if type(value) is list else type(value).__name__
            value = MalformedMessageError(
                f"a reply gathered on its proc for ranks {headers[m.RANKS]} of "
                f"{self.state.name} carries {count} values, not {len(covered)}"
            )
            ok = False
        if ok and self.mode == "mesh" and self.trace is None:
            # what _settle does rank by rank, for a whole proc's ranks at once
            self.values.update(zip(covered, value, strict=True))
            self._settle_if_complete()
            return
        for r, v in zip(covered, value if ok else [value] * len(covered), strict=True):
            if not self._settle(r, ok, v):
                return

    def _settle(self, rank: int, ok: bool, value: Any) -> bool:
        """Rank ``rank`` answered ``value`` (or failed with it); False: the call is over."""
        self.values[rank] = value
        if self.trace is not None:
            st = self.state
            _tel.span("reply", self.trace, self.t_sent, time.time(), st.actor_id(rank), st.name,
                      rank, self.endpoint, ok)  # fmt: skip
        if self.mode == "stream":
            fut = self.futures[self._arrived]
            fut.set_result(value) if ok else fut.set_exception(value)
            self._arrived += 1
            if self._arrived == len(self.expected):
                self._close()
                return False
            return True
        if not ok:
            self.fail(value)
            return False
        return not self._settle_if_complete(value)

    def _settle_if_complete(self, value: Any = None) -> bool:
        """Modes other than ``stream``: end the call once every rank answered (mode
        ``mesh``: with every value; the others: with ``value``, the last)."""
        if len(self.values) != len(self.expected):
            return False
        self._close()
        if self.mode == "mesh":
            result = ValueMesh(self.view, list(map(self.values.__getitem__, self.view.ranks)))
        else:
            result = value
        self.futures[0].set_result(result)
        return True

    def _fold(self, covered: list[int], ok: bool, value: Any) -> None:
        """Mode ``fold``: combine one reply (of the ranks it ``covered``: a rank's, or
        several merged on their proc) into the accumulated value; the call ends when
        every rank is accounted for."""
        if ok:
            try:
                self.acc = self._combine(self.acc, value)  # type: ignore[misc]
            except Exception as e:  # the user's combine raised: the call raises it
                ok, value = False, e
        for r in covered:  # the values live in the fold; kept here: which ranks ran
            self.values[r] = None if ok else value
            if self.trace is not None:
                st = self.state
                _tel.span("reply", self.trace, self.t_sent, time.time(), st.actor_id(r),
                          st.name, r, self.endpoint, ok)  # fmt: skip
        if not ok:
            self.fail(value)
        elif len(self.values) == len(self.expected):
            self._close()
            self.futures[0].set_result(self.acc)
