"""A proc: an OS process that connects to NATS and hosts actors.

Started as ``python -m monarch.actors.hosting.proc --uid UID --ready SUBJECT`` by
whoever owns it (the client, or a host agent). This is its entry point: it
connects, starts loss recovery, log forwarding and supervision, reports
``ready`` to its owner, and then its control server
(:mod:`monarch.actors.hosting.server`) serves control messages until told to stop.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import os
import sys
import threading

import monarch.actors.calls.actor_mesh  # noqa: F401  (registers the actor mesh reference type)
from monarch.actors.hosting.log_forwarding import install_forwarding
from monarch.actors.hosting.server import local_server
from monarch.actors.hosting.supervisor import start_supervision
from monarch.actors.messaging import messages as m
from monarch.actors.messaging.loss_recovery import start_loss_recovery
from monarch.broker.codec import dumps
from monarch.broker.config import settings
from monarch.core.proc_registry import register_proc
from monarch.core.runtime import Runtime, install_runtime, new_event_loop

log = logging.getLogger("monarch.proc")




async def serve(uid: str, ready: str, url: str) -> None:
    rt = Runtime(proc_uid=uid, loop=asyncio.get_running_loop(), cfg=settings())
    rt.root_uid = os.environ.get("MONARCH_ROOT_PROC") or uid
    install_runtime(rt)
    await rt.connect(url)
    start_loss_recovery(rt)
    install_forwarding(rt)
    await start_supervision(
        rt,
        create_streams=False,
        owner_proc=os.environ.get("MONARCH_OWNER_PROC"),
        find_actor=lambda actor_id: local_server(rt).find(actor_id),
    )
    server = local_server(rt)
    register_proc(rt, server.list_actors)  # a registry entry, and answers to `monarch ps`
    rt.publish(ready, dumps(os.getpid()), {m.KIND: "ready", m.FROM: uid})
    await server.stopped.wait()
    await rt.close()


def preimport_torch() -> None:
    """Import torch now if it is installed (and not yet imported).

    Otherwise the first tensor a proc decodes imports it on the event loop:
    seconds on a busy machine during which the loop serves nothing (heartbeats
    go on from their own thread, see :mod:`monarch.supervision.liveness`).
    """
    if "torch" in sys.modules or importlib.util.find_spec("torch") is None:
        return
    try:
        import torch  # noqa: F401
    except Exception as e:  # a broken install fails later, where a tensor is used
        log.warning("torch is installed but does not import: %r", e)


def preimport_torch_in_background() -> None:
    """:func:`preimport_torch` on a thread of its own, which ends when it is done.

    Off the start-up's path: the proc connects and says ready meanwhile (a
    tensor decoded before the import is done waits for it, as it would have
    imported torch anyway). Waiting for it would add its seconds of CPU to
    every spawn.
    """
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is not None:
        threading.Thread(target=preimport_torch, name="monarch-import-torch", daemon=True).start()


def main(argv: list[str] | None = None, *, preimport: bool = True) -> None:
    """Run a proc until it is told to stop.

    ``preimport``: start importing torch (when installed) at once, in the
    background. The zygote passes False: it imports torch itself once it is
    idle, so a fork has it already or, forked before that, does not spend its
    first seconds on it.
    """
    parser = argparse.ArgumentParser(prog="python -m monarch.actors.hosting.proc")
    parser.add_argument("--uid", required=True, help="this proc's unique id (a subject token)")
    parser.add_argument("--ready", required=True, help="subject to report readiness to")
    args = parser.parse_args(argv)
    url = settings().nats_url
    if not url:
        sys.exit(
            "monarch proc: MONARCH_NATS_URL is not set; procs are started by a client or host agent"
        )
    logging.basicConfig(
        level=os.environ.get("MONARCH_LOG_LEVEL", "WARNING"),
        format=f"[{args.uid}] %(levelname)s %(name)s: %(message)s",
    )
    # The script that defined our actor classes is not our __main__; cloudpickle
    # brings classes by value, so nothing else is needed here.
    if preimport:
        preimport_torch_in_background()
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(serve(args.uid, args.ready, url))
    except KeyboardInterrupt:
        pass
    finally:
        _cancel_remaining(loop)
        loop.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Threads of actors stuck in an endpoint must not keep a stopped proc alive.
    os._exit(0)


def _cancel_remaining(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy: module state (the
    # process's actor host) must be the one every other module sees.
    from monarch.actors.hosting.proc import main as _main

    _main()
