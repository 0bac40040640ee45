"""The owner tree: failures flow from where they are seen to the mesh's owner.

Every mesh has one owner actor (the client is the root). Whoever notices a
failure (the proc whose actor failed, the reaper of an exited process, a
heartbeat watcher) builds a :class:`MeshFailure` and sends it to the owner's
process on ``mon.<ns>.sup.<owner-proc-uid>`` (captured by the supervision
JetStream stream, so it can be read back), or hands it over directly when
the owner lives in the same process. There:

* the mesh's ranks are marked dead, so calls in flight or new raise
  :class:`SupervisionError`;
* an owner actor's ``__supervise__(failure)`` runs (in its mailbox order);
  truthy means handled; otherwise the owner fails too, its own meshes stop,
  and the failure moves up, with this one as its cause;
* at the root, ``monarch.actor.unhandled_fault_hook(failure)`` runs (by
  default: print the report and exit non-zero).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from monarch.actors.errors import (
    BrokerLostError,
    SupervisionError,
    actor_failed_message,
    describe_actor,
)
from monarch.actors.meshes.shape import Point
from monarch.actors.process_state import actor_process
from monarch.broker.bodies.codec import dumps, loads
from monarch.broker.connections.connect import connect
from monarch.broker.vocabulary import headers as hdr
from monarch.broker.vocabulary import subjects
from monarch.core.runtime import Runtime
from monarch.supervision.failure import MeshFailure, SupervisionFailure
from monarch.supervision.heartbeat import Heartbeater
from monarch.supervision.streams import ensure_streams
from monarch.supervision.watcher import Watcher, announce_dead

log = logging.getLogger(__name__)

ROOT_ACTOR = "client"

# Called at each failure that reaches the root, it gives the hook to run (the
# client hands in a lookup of monarch.actor.unhandled_fault_hook).
FaultHookSource = Callable[[], Callable[[MeshFailure], Any]]


class Supervisor:
    """One per runtime: heartbeats, liveness watching, and failure routing."""

    def __init__(
        self,
        rt: Runtime,
        find_actor: Callable[[str], Any],
        fault_hook: FaultHookSource | None = None,
        on_unhandled: Callable[[], None] | None = None,
    ) -> None:
        self.rt = rt
        # The live actor of this process with an actor id (the proc's server, handed in).
        self.find_actor = find_actor
        # At the root: where the hook for failures nobody handled is looked up, and
        # what ends the client when the hook leaves one unhandled (by raising).
        self.fault_hook = fault_hook
        self.on_unhandled = on_unhandled
        cfg = rt.settings
        # Off the loop, on a connection of its own: a busy loop is not a dead process.
        own_connection = functools.partial(
            connect, rt.nats_url, cfg, name=f"monarch-{rt.proc_uid}-heartbeat"
        )
        self.heartbeater = Heartbeater(
            rt.namespace, rt.proc_uid, cfg.heartbeat_interval, own_connection
        )
        # Heartbeats are heard on that connection too: a backlog of calls on the main
        # one must not delay them (monarch.supervision.heartbeat).
        # (A reaper's "dead" announcement is taken from the main connection, where
        # it comes after the exit report it follows.)
        self.watcher = Watcher(
            rt.nc,
            rt.namespace,
            cfg.heartbeat_timeout,
            self.heartbeater.listen,
            announcements=rt.subscribe_mesh,
        )
        self.watcher.follow(self.heartbeater, rt.loop)
        self._reported: set[tuple[str, int]] = set()
        self._sub: Any = None
        self._lost_timer: Any = None

    async def start(self, *, create_streams: bool) -> None:
        if create_streams:
            await ensure_streams(self.rt.nc, self.rt.namespace)
        self._sub = await self.rt.subscribe_mesh(
            subjects.supervision(self.rt.namespace, self.rt.proc_uid), self._on_event
        )
        self.heartbeater.start()

    async def stop(self) -> None:
        await self.heartbeater.stop()
        await self.watcher.stop()

    # -- reporting ------------------------------------------------------------

    def report(self, owner_proc: str, owner_actor: str, failure: MeshFailure) -> None:
        """Send ``failure`` to its owner (loop only). Each (mesh, rank) is reported once."""
        fresh = [r for r in failure.ranks if (failure.mesh_uid, r) not in self._reported]
        if not fresh:
            return
        self._reported.update((failure.mesh_uid, r) for r in fresh)
        failure.ranks = fresh
        failure.owner = owner_actor
        body = dumps(failure.to_wire())
        headers = {
            hdr.KIND: "failure",
            hdr.MESH: failure.mesh_name,
            hdr.REASON: failure.reason,
            hdr.OWNER: owner_actor,
            hdr.FROM: self.rt.proc_uid,
        }
        subject = subjects.supervision(self.rt.namespace, owner_proc)
        if owner_proc == self.rt.proc_uid:
            # Same process: handle now, and record it in the stream for inspection.
            self.rt.publish(subject, body, headers)
            self.dispatch(failure)
        else:
            self.rt.publish(subject, body, headers)

    def connection_changed(self, connected: bool) -> None:
        """Broker lost: fail calls in flight (their messages may be lost) and start the clock."""
        if connected:
            self.watcher.resume()
            if self._lost_timer is not None:
                self._lost_timer.cancel()
                self._lost_timer = None
            return
        self.watcher.pause()
        lost = BrokerLostError(
            f"the connection to the broker dropped while this call was in flight "
            f"({self.rt.proc_uid}); it may or may not have been handled"
        )
        for st in list(actor_process(self.rt).mesh_states.values()):
            if st.local is None:
                for gather in list(st.inflight):
                    gather.fail(lost)
        if self._lost_timer is None:
            self._lost_timer = self.rt.loop.call_later(
                self.rt.settings.broker_lost_timeout, self._broker_gone
            )

    def _broker_gone(self) -> None:
        timeout = self.rt.settings.broker_lost_timeout
        message = (
            f"the broker has been unreachable for {timeout:.0f} s (MONARCH_BROKER_LOST_TIMEOUT)"
        )
        if not self.rt.is_client:
            print(
                f"monarch proc {self.rt.proc_uid}: {message}; exiting", file=sys.stderr, flush=True
            )
            os._exit(4)
        self._at_root([MeshFailure("broker", "", [], "broker_lost", message)])

    def announce_exit(self, proc_uid: str, reason: str) -> None:
        """Whoever reaped a process tells its watchers at once (loop only).

        Calls of this process in flight to actors on it fail first, here, with
        Monarch's words and the exit reason (the same text later calls get).
        """
        for st in list(actor_process(self.rt).mesh_states.values()):
            for rank, uid in enumerate(st.proc_uids or ()):
                if uid == proc_uid and rank not in st.dead:
                    actor = describe_actor(st.cls, st.class_name, st.name, Point(rank, st.base))
                    why = (
                        f"the process this actor was running on failed: {reason} (proc {proc_uid})"
                    )
                    err = SupervisionError(
                        actor_failed_message(actor, why), actor_id=st.actor_id(rank), rank=rank
                    )
                    st.mark_dead([rank], err)
        self.rt.loop.create_task(announce_dead(self.rt.nc, self.rt.namespace, proc_uid, reason))

    def _on_event(self, msg: Any) -> None:
        if (msg.headers or {}).get(hdr.FROM) == self.rt.proc_uid:
            return  # our own record of a failure we already handled here
        try:
            failure = MeshFailure.from_wire(loads(msg.data))
        except Exception as e:
            log.warning("malformed supervision event on %s: %r", msg.subject, e)
            return
        self.dispatch(failure)

    # -- handling at the owner ------------------------------------------------------

    def dispatch(self, failure: MeshFailure) -> None:
        st = actor_process(self.rt).mesh_states.get(failure.mesh_uid)
        actors: dict[int, str] = {}
        if st is not None:
            reason = failure.message
            if failure.traceback:
                reason += "\n" + failure.traceback
            if failure.cause is not None:  # an owner that did not handle its child's failure
                reason += ":\n" + failure.cause.report()
            for rank in failure.ranks:  # each rank's error names that rank, as in Monarch
                actor = describe_actor(st.cls, st.class_name, st.name, Point(rank, st.base))
                actors[rank] = actor
                st.mark_dead(
                    [rank],
                    SupervisionError(
                        actor_failed_message(actor, reason),
                        actor_id=st.actor_id(rank),
                        rank=rank,
                    ),
                )
        if not failure.actor and failure.ranks and failure.ranks[0] in actors:
            failure.actor = actors[failure.ranks[0]]
        # One event per failed rank, as in Monarch: the hook or __supervise__ runs once each.
        each = [failure]
        if len(failure.ranks) > 1:
            each = [_one_rank(failure, r, actors.get(r, "")) for r in failure.ranks]
        owner = failure.owner
        if st is not None and st.internal:  # the library's own mesh: its next use replaces it
            log.info("internal actor mesh %s failed: %s", failure.mesh_name, failure.message)
            return
        if owner == ROOT_ACTOR or not owner:
            self._at_root(each)
            return
        inst = self.find_actor(owner)
        if inst is None:
            log.error(
                "owner %s of failed mesh %s is gone:\n%s",
                owner,
                failure.mesh_name,
                failure.report(),
            )
            return
        for one in each:
            inst.supervise(one)

    def _at_root(self, each: list[MeshFailure]) -> None:
        """Run the hook for each failure, in order, off the loop."""
        if self.fault_hook is None:  # not the root: nothing above us to tell
            for one in each:
                log.error("unhandled failure with no fault hook here:\n%s", one.report())
            return
        hook = self.fault_hook()

        def run() -> None:
            for one in each:
                try:
                    hook(one)
                except BaseException as e:  # as Monarch: raising (sys.exit too) leaves it unhandled
                    if not isinstance(e, SystemExit):
                        traceback.print_exc()
                    if self.on_unhandled is not None:
                        self.on_unhandled()
                    return

        threading.Thread(target=run, name="monarch-fault-hook", daemon=True).start()

    def actor_failed(self, inst: Any, exc: BaseException) -> None:
        """An actor of this proc failed: tell its owner."""
        cause = exc.failure if isinstance(exc, SupervisionFailure) else None
        tb = ""
        if cause is None:
            tb = getattr(exc, "_monarch_traceback", None) or "".join(
                traceback.format_exception(type(exc), exc, exc.__traceback__)
            )
        failure = MeshFailure(
            inst.name,
            inst.uid,
            [inst.rank],
            "owner_failed" if cause is not None else "actor_failed",
            f"{inst.actor_id} failed: {type(exc).__name__}: {exc}"
            if cause is None
            else f"{inst.actor_id} did not handle a failure of a mesh it owns",
            cause=cause,
            exception=exc,
            traceback=tb,
            actor=describe_actor(inst.cls, "", inst.name, inst.point),
        )
        self.report(inst.owner_proc, inst.owner_actor, failure)


def _one_rank(failure: MeshFailure, rank: int, actor: str) -> MeshFailure:
    return MeshFailure(
        failure.mesh_name, failure.mesh_uid, [rank], failure.reason, failure.message,
        owner=failure.owner, cause=failure.cause, exception=failure.exception,
        traceback=failure.traceback, actor=actor or failure.actor,
    )  # fmt: skip


def supervisor_of(rt: Runtime) -> Supervisor | None:
    return actor_process(rt).supervisor


async def start_supervision(
    rt: Runtime,
    *,
    create_streams: bool,
    owner_proc: str | None,
    find_actor: Callable[[str], Any],
    fault_hook: FaultHookSource | None = None,
    on_unhandled: Callable[[], None] | None = None,
) -> Supervisor:
    """Heartbeat, route failures, and (in a proc) exit when the owner's process is gone.

    ``find_actor(actor_id)`` finds an owner actor of this process (the proc's
    server); ``fault_hook`` is the root's (the client's): where failures nobody
    handled end, and ``on_unhandled`` what ends the client when that hook raises.
    """
    sup = Supervisor(rt, find_actor, fault_hook, on_unhandled)
    actor_process(rt).supervisor = sup
    await sup.start(create_streams=create_streams)
    rt.on_close(sup.stop)
    rt.connection_listeners.append(sup.connection_changed)
    if owner_proc:

        def owner_gone(uid: str, reason: str) -> None:
            # No orphans: a proc whose owner died has nobody to serve.
            print(f"monarch proc {rt.proc_uid}: owner {uid} is gone ({reason}); exiting",
                  file=sys.stderr, flush=True)  # fmt: skip
            os._exit(3)

        await sup.watcher.watch(owner_proc, owner_gone)
        # Before this proc says it is ready: the owner may import torch right after,
        # and the beat that announces it must reach us (Watcher.listening).
        await sup.watcher.listening([owner_proc])
    return sup
