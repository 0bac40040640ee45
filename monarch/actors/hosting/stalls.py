"""Stalled calls: an endpoint call that runs longer than ``MONARCH_STALL_THRESHOLD`` seconds.

Checked off the loop, at each heartbeat, on the heartbeat thread
(:attr:`monarch.supervision.heartbeat.Heartbeater.beat_listeners`), against
the start times in the activity book (:mod:`monarch.actors.calls.activity`):
an async endpoint that blocks the proc's loop is caught as well as a sync one
that waits. When a call passes the threshold:

* the book marks it stalled: the stats answer (``mon.<ns>.ctl.stats``) shows
  it with ``"stalled": true``, its actor as ``"stalled"`` until it ends, and
  a record in ``"stalls"`` (with ``finished_after`` once it ends);
* once per call, its caller's process is told, on the side channel, on
  ``mon.<ns>.ctl.proc.<caller proc uid>`` with ``Mon-Kind: stall`` and a JSON
  body (:func:`notice`); there the runtime logs one warning (logger
  ``monarch.stalls``) naming the actor, its rank, the endpoint and how long
  it has run, so the person waiting on the call learns why on stderr.

Only the caller warns: the proc that runs the call logs it at INFO (its log
lines reach the client too, and one warning per stall is enough).
"""

from __future__ import annotations

import json
import logging
import os
import socket
from typing import Any

from monarch.actors.calls import activity
from monarch.actors.process_state import actor_process
from monarch.broker.vocabulary import headers as hdr
from monarch.broker.vocabulary import subjects
from monarch.core.runtime import Runtime

log = logging.getLogger("monarch.stalls")


def notice(rt: Runtime, act: activity.ActorActivity, record: dict[str, Any]) -> bytes:
    """The JSON body a caller's process is sent about a stalled call."""
    return json.dumps({
        **record,
        "class": act.cls,
        "proc": rt.proc_uid,
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "threshold": rt.settings.stall_threshold,
    }).encode()  # fmt: skip


def watch_stalls(rt: Runtime) -> None:
    """Report this process's stalled calls, and warn of stalls of calls it made.

    After supervision started (the checks run on its heartbeat thread).
    """
    rt.handle_ctl_kind("stall", _on_notice)
    sup = actor_process(rt).supervisor
    if sup is None:
        return
    heartbeater = sup.heartbeater
    threshold = rt.settings.stall_threshold

    def check() -> None:  # on the heartbeat thread, at each beat
        for act, _call, record in activity.book.newly_stalled(threshold):
            log.info(
                "actor %s: %s has run for %.1f s (over MONARCH_STALL_THRESHOLD=%g s)",
                act.actor_id, record["endpoint"], record["seconds"], threshold,
            )  # fmt: skip
            caller = record["caller"]
            if caller:
                heartbeater.publish(
                    subjects.ctl_proc(rt.namespace, caller),
                    notice(rt, act, record),
                    {hdr.KIND: "stall", hdr.FROM: rt.proc_uid},
                )

    heartbeater.beat_listeners.append(check)

    def stop_checking() -> None:
        if check in heartbeater.beat_listeners:
            heartbeater.beat_listeners.remove(check)

    rt.on_close(stop_checking)


def _on_notice(msg: Any) -> None:
    """A call this process made has stalled where it runs: one warning for the user."""
    try:
        n = json.loads(msg.data)
        log.warning(
            "actor %s (mesh %r, rank %s): its call of %r has been running for %.1f s, "
            "over MONARCH_STALL_THRESHOLD=%g s (proc %s, pid %s on %s). To see what it is "
            "doing: monarch stacks %s[%s]",
            n["actor_id"], n["mesh"], n["rank"], n["endpoint"], n["seconds"], n["threshold"],
            n["proc"], n["pid"], n["hostname"], n["mesh"], n["rank"],
        )  # fmt: skip
    except (ValueError, KeyError, TypeError) as e:
        log.debug("malformed stall notice on %s: %r", msg.subject, e)
