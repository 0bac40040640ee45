"""A process's answer to ``monarch stacks``: the Python stack of every one of its threads.

Each process with actors answers requests on
``mon.<ns>.ctl.stacks.<proc uid>`` (:func:`monarch.broker.vocabulary.subjects.stacks_subject`)
from its side channel, the heartbeat thread (see
:meth:`monarch.supervision.heartbeat.Heartbeater.publish`): a proc whose
event loop is blocked, or whose actor thread waits forever, still answers.
One whose interpreter is held (a long C call that keeps the GIL, a stopped
process) cannot: no Python thread runs there, this one included; ``py-spy
dump`` reads such a process from outside (``monarch stacks --py-spy``).

The answer, JSON::

    {"uid", "pid", "hostname", "host_uid", "rank", "time": unix,
     "loop_stall": seconds the event loop has not turned,
     "actors": [{"actor_id", "mesh", "rank", "class", "state"}],
     "threads": [{"ident", "native_id", "name", "daemon",
                  "role": "event loop" | "side channel, answering this request" | "",
                  "calls": [{"actor_id", "mesh", "rank", "endpoint", "seconds", "stalled"}],
                  "stack": [{"file", "line", "function", "code"}]}]}   # outermost frame first

``calls``: the endpoint calls the thread is running now, from the activity
book (:mod:`monarch.actors.calls.activity`); a sync actor's own thread is
also named ``actor <actor id>``.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import traceback
from typing import Any

from monarch.actors.calls import activity
from monarch.actors.hosting.stats import process_figures
from monarch.actors.process_state import actor_process
from monarch.broker.vocabulary import headers as hdr
from monarch.broker.vocabulary.subjects import stacks_subject
from monarch.core.proc_registry import proc_entry
from monarch.core.runtime import Runtime

log = logging.getLogger(__name__)

MAX_FRAMES = 200  # innermost frames kept per thread: the answer must fit in one message


def thread_stacks(loop_thread: int | None = None) -> list[dict[str, Any]]:
    """Every thread of this process with its stack and the calls it runs (any thread)."""
    frames = sys._current_frames()  # noqa: SLF001  (the documented way to read other threads)
    threads = {t.ident: t for t in threading.enumerate()}
    now = time.monotonic()
    calls: dict[int, list[dict]] = {}
    for act in activity.book.current():
        for call in act.calls_now():
            if call.ep.name == activity.FLOW_MARKER:
                continue
            calls.setdefault(call.thread, []).append({
                "actor_id": act.actor_id, "mesh": act.mesh, "rank": act.rank,
                "endpoint": call.ep.name,
                "seconds": round(max(0.0, now - call.started), 3),
                "stalled": call.stalled,
            })  # fmt: skip
    me = threading.get_ident()
    out = []
    for ident, frame in frames.items():
        t = threads.get(ident)
        if ident == me:  # this thread, answering: its stack is this very function
            stack, role = [], "side channel, answering this request"
        else:
            stack = [
                {
                    "file": fs.filename,
                    "line": fs.lineno,
                    "function": fs.name,
                    "code": fs.line or "",
                }  # fmt: skip
                for fs in traceback.extract_stack(frame)[-MAX_FRAMES:]
            ]
            role = "event loop" if ident == loop_thread else ""
        out.append({
            "ident": ident,
            "native_id": getattr(t, "native_id", None),
            "name": t.name if t is not None else f"thread {ident}",
            "daemon": bool(t.daemon) if t is not None else None,
            "role": role,
            "calls": calls.get(ident, []),
            "stack": stack,
        })  # fmt: skip
    del frames
    # The threads running calls first, then the loop, then the rest by name.
    out.sort(key=lambda t: (not t["calls"], t["role"] != "event loop", t["name"]))
    return out


def stacks_document(rt: Runtime, entry: dict[str, Any], loop_thread: int | None) -> dict:
    sup = actor_process(rt).supervisor
    clock = sup.heartbeater.clock if sup is not None else None
    return {
        **entry,
        "time": time.time(),
        "threads_count": process_figures()["threads"],
        "loop_stall": round(clock.stalled_for(), 3) if clock is not None else 0.0,
        "actors": [
            {
                "actor_id": a.actor_id,
                "mesh": a.mesh,
                "rank": a.rank,
                "class": a.cls,
                "state": a.state,
            }  # fmt: skip
            for a in activity.book.current()
            if a.state not in ("stopped",)
        ],
        "threads": thread_stacks(loop_thread),
    }


def _fitted(doc: dict[str, Any], limit: int) -> bytes:
    """``doc`` as JSON within ``limit`` bytes: past it, each stack keeps fewer of its
    innermost frames (``"frames_left_out"`` says how many in all)."""
    body = json.dumps(doc, default=str).encode()
    keep = MAX_FRAMES
    while len(body) > limit and keep > 1:
        keep //= 2
        threads = [{**t, "stack": t["stack"][-keep:]} for t in doc["threads"]]
        left = sum(len(t["stack"]) for t in doc["threads"]) - sum(len(t["stack"]) for t in threads)
        body = json.dumps(
            {**doc, "threads": threads, "frames_left_out": left}, default=str
        ).encode()
    return body


async def serve_stacks(rt: Runtime) -> None:
    """Answer ``mon.<ns>.ctl.stacks.<uid>`` from the side channel (on the loop, after
    supervision started; a process without one answers nothing)."""
    sup = actor_process(rt).supervisor
    if sup is None:
        return
    heartbeater = sup.heartbeater
    entry = proc_entry(rt)
    loop_thread = threading.get_ident()  # called on the loop

    def on_request(msg: Any) -> None:  # on the heartbeat thread
        if not msg.reply:
            return
        try:
            body = _fitted(stacks_document(rt, entry, loop_thread), rt.max_payload)
        except Exception:  # a viewer's question must never hurt the process
            log.exception("stacks answer of %s failed", rt.proc_uid)
            return
        heartbeater.publish(msg.reply, body, {hdr.KIND: "stacks", hdr.FROM: rt.proc_uid})

    heard = await heartbeater.listen(stacks_subject(rt.namespace, rt.proc_uid), on_request)
    rt.on_close(heard.unsubscribe)
