"""A proc says where it is: an entry in ``monarch-<ns>-procs`` and answers to ``monarch ps``.

:func:`register_proc` is the one hook :mod:`monarch.actors.hosting.proc` calls. It
puts ``{uid, pid, hostname, host_uid, owner, root, rank, started_at}`` under
the proc's uid (removed again when the runtime closes; the host agent removes
the entry of a proc it reaps) and answers requests on ``mon.<ns>.ctl.ps``
with that entry plus the actors the proc hosts, so ``monarch ps`` (or
``nats req mon.default.ctl.ps ''``) sees live procs and actor meshes. Both run
in the background: a proc is never slowed or stopped by its registration.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from monarch.broker.connections.registry import HOST_UID_ENV, PROCS, open_bucket
from monarch.broker.vocabulary import headers as hdr
from monarch.broker.vocabulary.subjects import ps_subject

log = logging.getLogger(__name__)


def proc_entry(rt: Any) -> dict[str, Any]:
    """Who this process is (``rt``: its Runtime), as the registry and ``monarch ps`` show it."""
    return {
        "uid": rt.proc_uid,
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "host_uid": os.environ.get(HOST_UID_ENV),
        "owner": os.environ.get("MONARCH_OWNER_PROC"),
        "root": rt.root_uid,
        "rank": int(os.environ.get("MONARCH_RANK", "0")),
        "started_at": time.time(),
    }


def register_proc(rt: Any, list_actors: Callable[[], list[dict[str, Any]]]) -> None:
    """Register this proc (``rt``: its Runtime). Loop only.

    ``list_actors()`` says what the proc hosts, for ``monarch ps``: one dict per
    actor with ``mesh``, ``mesh_uid``, ``rank``, ``class`` and ``sizes``.
    """
    entry = proc_entry(rt)
    body = json.dumps(entry).encode()

    def on_ps(msg: Any) -> None:
        if msg.reply:
            answer = {**entry, "actors": list_actors()}
            rt.publish(msg.reply, json.dumps(answer).encode(), {hdr.KIND: "ps"})

    async def register() -> Any:
        await rt.subscribe_mesh(ps_subject(rt.namespace), on_ps)
        kv = await open_bucket(rt.nc, rt.namespace, PROCS)
        await kv.put(rt.proc_uid, body)
        return kv

    task = rt.loop.create_task(register())

    async def deregister() -> None:
        with contextlib.suppress(Exception):
            kv = await asyncio.wait_for(asyncio.shield(task), 2)
            await asyncio.wait_for(kv.delete(rt.proc_uid), 2)

    def done(t: asyncio.Task) -> None:
        if not t.cancelled() and t.exception() is not None:
            log.debug("proc %s not registered: %r", rt.proc_uid, t.exception())

    task.add_done_callback(done)
    rt.on_close(deregister)
