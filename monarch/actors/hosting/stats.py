"""A process's answer to ``mon.<ns>.ctl.stats``: what its actors are doing, right now.

Every process that hosts actors (each proc, and the client, which hosts
``this_proc()`` actors) answers a request on :func:`stats_subject` with one
JSON document. It is answered from the process's *side channel* (the
heartbeat thread and its own connection, see
:meth:`monarch.supervision.heartbeat.Heartbeater.publish`), so a proc whose
event loop is blocked (an async endpoint calling ``time.sleep``) still
answers, and says so in ``loop_stall``. Only a C call that holds the GIL
keeps it from answering (use ``monarch stacks --py-spy`` there).

The answer (``nats req mon.default.ctl.stats ''`` shows the first one)::

    {"uid": proc uid, "pid": int, "hostname": str, "host_uid": str|null,
     "owner": str|null, "rank": int, "root": root client's proc uid,
     "started_at": unix time the answers started,
     "time": unix time of this answer,
     "cpu_seconds": user + system CPU of the whole process,
     "rss_bytes": resident memory, "threads": OS threads of the process,
     "loop_stall": seconds the proc's event loop has not turned (0: it turns),
     "stall_threshold": MONARCH_STALL_THRESHOLD, seconds,
     "actors": [{"actor_id", "mesh", "mesh_uid", "rank", "class", "sizes": {label: size},
                 "state": "starting"|"serving"|"stalled"|"failed"|"stopped",
                 "failure": str|null (why it failed, with the traceback),
                 "endpoints": {name: {"calls": finished calls, "errors": of those, raised,
                                      "in_flight": int, "hist": [32 ints]}},
                 "in_flight": [{"endpoint", "seconds", "started_at": unix,
                                "caller": calling proc's uid, "thread": thread name,
                                "stalled": bool}]}],
     "recent_failures": [{"actor_id", "reason", "time": unix}],
     "stalls": [{"actor_id", "mesh", "mesh_uid", "rank", "endpoint", "caller",
                 "seconds": how long it had run when found stalled, "time": unix then,
                 "finished_after": seconds it ran in all, null while it runs}]}

``hist``: calls by duration, bucket ``i`` counting those under ``2**i``
microseconds (:data:`monarch.actors.calls.activity.BUCKET_BOUNDS_US`; turn
one into seconds with :func:`monarch.actors.calls.activity.percentile`).
Stopped and failed actors stay listed for a minute. An answer that would not
fit in one broker message lists the first actors only, and says how many it
left out (``"actors_left_out"``). A request whose body is
a JSON object ``{"uid": proc uid}`` is answered by that process only.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from monarch.actors.calls import activity
from monarch.actors.process_state import actor_process
from monarch.broker.vocabulary import headers as hdr
from monarch.broker.vocabulary.subjects import stats_subject
from monarch.core.proc_registry import proc_entry
from monarch.core.runtime import Runtime

log = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_figures() -> dict[str, Any]:
    """CPU seconds, resident bytes and OS threads of this process."""
    t = os.times()
    figures: dict[str, Any] = {"cpu_seconds": round(t.user + t.system, 3)}
    try:
        with open("/proc/self/statm") as f:
            figures["rss_bytes"] = int(f.read().split()[1]) * _PAGE
        with open("/proc/self/stat") as f:
            figures["threads"] = int(f.read().rsplit(")", 1)[1].split()[17])
    except (OSError, ValueError, IndexError):  # not Linux: what Python knows
        import resource  # noqa: PLC0415  (Unix only; Linux never gets here)

        figures["rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        figures["threads"] = threading.active_count()
    return figures


def stats_document(rt: Runtime, entry: dict[str, Any]) -> dict[str, Any]:
    """The answer (any thread); ``entry``: the process's :func:`proc_entry`."""
    threshold = rt.settings.stall_threshold
    sup = actor_process(rt).supervisor
    clock = sup.heartbeater.clock if sup is not None else None
    return {
        **entry,
        "time": time.time(),
        **process_figures(),
        "loop_stall": round(clock.stalled_for(), 3) if clock is not None else 0.0,
        "stall_threshold": threshold,
        "actors": activity.book.describe(threshold),
        "recent_failures": activity.copied(activity.book.failures),
        "stalls": activity.copied(activity.book.stalls),
    }


async def serve_stats(rt: Runtime) -> None:
    """Answer ``mon.<ns>.ctl.stats`` from this process's side channel (after supervision
    started; a process without one answers nothing)."""
    sup = actor_process(rt).supervisor
    if sup is None:
        return
    heartbeater = sup.heartbeater
    entry = proc_entry(rt)

    def on_request(msg: Any) -> None:  # on the heartbeat thread
        if not msg.reply or not _for_me(msg.data, rt.proc_uid):
            return
        try:
            body = fitted(stats_document(rt, entry), rt.max_payload)
        except Exception:  # a viewer's question must never hurt the process
            log.exception("stats answer of %s failed", rt.proc_uid)
            return
        heartbeater.publish(msg.reply, body, {hdr.KIND: "stats", hdr.FROM: rt.proc_uid})

    heard = await heartbeater.listen(stats_subject(rt.namespace), on_request)
    rt.on_close(heard.unsubscribe)


def fitted(doc: dict[str, Any], limit: int) -> bytes:
    """``doc`` as JSON within ``limit`` bytes (one broker message): past it, the actors at
    the end of the list are left out and ``"actors_left_out"`` says how many."""
    body = json.dumps(doc).encode()
    actors = doc["actors"]
    keep = len(actors)
    while len(body) > limit and keep > 0:
        keep //= 2
        body = json.dumps({**doc, "actors": actors[:keep],
                           "actors_left_out": len(actors) - keep}).encode()  # fmt: skip
    return body


def _for_me(data: bytes, uid: str) -> bool:
    """An empty request is for everyone; ``{"uid": ...}`` for that process only."""
    if not data or not data.strip():
        return True
    try:
        wanted = json.loads(data)
    except ValueError:
        return True
    return not isinstance(wanted, dict) or wanted.get("uid") in (None, uid)
