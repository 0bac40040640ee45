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
import atexit
import gc
import importlib.util
import logging
import os
import signal
import sys
import sysconfig
import threading
import weakref

import monarch.actors.calls.actor_mesh  # noqa: F401  (registers the actor mesh reference type)
from monarch.actors import debugging
from monarch.actors.hosting.log_forwarding import install_forwarding
from monarch.actors.hosting.server import local_server
from monarch.actors.hosting.stacks import serve_stacks
from monarch.actors.hosting.stalls import watch_stalls
from monarch.actors.hosting.stats import serve_stats
from monarch.actors.hosting.supervisor import start_supervision
from monarch.actors.hosting.telemetry import start_telemetry
from monarch.actors.messaging import messages as m
from monarch.actors.messaging.loss_recovery import start_loss_recovery
from monarch.broker.bodies.codec import dumps
from monarch.core.proc_registry import register_proc
from monarch.core.process_runtime import install_runtime
from monarch.core.runtime import Runtime, new_event_loop
from monarch.settings import settings

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
    debugging.install()  # breakpoint() in an endpoint pauses for `monarch debug`
    await start_telemetry(rt, client=False)  # MONARCH_TELEMETRY=1 only
    server = local_server(rt)
    register_proc(rt, server.list_actors)  # a registry entry, and answers to `monarch ps`
    await serve_stats(rt)  # what its actors are doing, answered even while the loop is blocked
    watch_stalls(rt)  # calls over MONARCH_STALL_THRESHOLD: told to their callers, who warn
    await serve_stacks(rt)  # `monarch stacks`: every thread's stack, from the side channel
    rt.publish(ready, dumps(os.getpid()), {m.KIND: "ready", m.FROM: uid})
    await server.stopped.wait()
    await rt.close()


def preimport_torch() -> None:
    """Import torch now if it is installed (and not yet imported).

    Otherwise the first tensor a proc decodes imports it on the event loop:
    seconds on a busy machine during which the loop serves nothing (heartbeats
    go on from their own thread, see :mod:`monarch.supervision.heartbeat`).
    """
    if "torch" in sys.modules or importlib.util.find_spec("torch") is None:
        return
    try:
        import torch  # noqa: F401
    except Exception as e:  # a broken install fails later, where a tensor is used
        log.warning("torch is installed but does not import: %r", e)


def reseed_inherited_random_state() -> None:
    """Give a proc forked from a zygote that has torch a torch generator of its own.

    A fork inherits its parent's generator state, so without this every proc
    forked from the torch zygote would draw the same "random" numbers: the
    same initial weights, dropout masks and data shuffles on every rank. A
    fresh interpreter (torchrun's worker, Monarch's proc) seeds torch's CPU
    generator from the OS at import, which ``seed()`` does here. (Python's
    ``random`` reseeds itself after a fork; CUDA is never started in a zygote.)
    """
    generator = getattr(sys.modules.get("torch"), "default_generator", None)
    if generator is not None:  # (None also for a torch stand-in that has none)
        generator.seed()


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
    # What the proc has before its first actor (modules, classes, functions, the ones a
    # zygote fork inherited too) is never garbage: out of the collector's sight, its full
    # collections scan only what actors add. Unfrozen, the first one after spawning 2,048
    # actors over 16 procs took ~200 ms in each at once (benchmarks/NOTES.md 63).
    gc.freeze()
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(serve(args.uid, args.ready, url))
    except KeyboardInterrupt:
        pass
    finally:
        _cancel_remaining(loop)
        loop.close()
    exit_like_python()


FINALIZE_TIMEOUT = 5  # seconds a stopped proc may spend finalizing before SIGALRM ends it


def exit_like_python() -> None:
    """End the proc running what a Python program runs at its end; never returns.

    As in Monarch's procs (``Py_FinalizeEx``), atexit handlers run and the
    globals of the user's modules are released, so their ``__del__`` runs: an
    actor that keeps a resource in a module global gets to close it. Not the
    interpreter's own teardown of every module, though: with torch imported
    that takes ~2 s of CPU per proc (a 4-proc mesh stopped in 2 s instead of
    0.08 s), for nothing a user sees. Bounded: ``SIGALRM`` (default action:
    terminate) ends a proc whose handlers or finalizers hang.
    """
    signal.alarm(FINALIZE_TIMEOUT)
    skip_torch_library_finalizers()
    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001  (a failing handler must not keep the proc alive)
        log.exception("an atexit handler failed")
    release_user_module_globals()  # (no gc.collect(): 0.25 s with torch loaded; a
    # global's object goes with its last reference, cycles are not worth that here)
    sys.stdout.flush()
    sys.stderr.flush()
    # Threads of actors stuck in an endpoint must not keep a stopped proc alive.
    os._exit(0)


def skip_torch_library_finalizers() -> None:
    """Keep torch's operator libraries registered at exit: nothing a user sees.

    torch registers a ``weakref.finalize`` per operator library (~130) that
    unregisters it when the program ends. In a proc forked from the torch
    zygote, running them is 30-70 ms of copy-on-write page faults, most of
    what finalizing costs (stopping a 4-proc mesh with torch took 0.07-0.10 s
    with them, 0.03 s without, as with no finalizing at all), for a registry
    that disappears with the process anyway. Every other finalizer still runs
    (``finalize.atexit`` is its documented switch; the registry itself is
    CPython's private ``_registry``).
    """
    torch_library = sys.modules.get("torch.library")
    release = getattr(torch_library, "_del_library", None)
    if release is None:
        return
    for fin in list(getattr(weakref.finalize, "_registry", {})):
        info = fin.peek()
        if info is not None and info[1] is release:
            fin.atexit = False


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    dirs.add(os.path.dirname(os.path.abspath(monarch.__file__)))  # monarch itself, all of it
    dirs |= {os.path.realpath(d) for d in dirs}
    return tuple(os.path.join(d, "") for d in dirs)


def release_user_module_globals() -> None:
    """Set the globals of every module that is not the standard library's, an
    installed package's or monarch's to None, newest module first, as the
    interpreter does at exit: objects only they held are released (``__del__``)
    while builtins and every library still work."""
    libraries = _library_dirs()
    for name, module in reversed(list(sys.modules.items())):
        path = getattr(module, "__file__", None)
        if not path or name == "__main__" or path.startswith(libraries):
            continue
        if os.path.realpath(path).startswith(libraries):  # reached through a symlink
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key in [k for k in namespace if not k.startswith("__")]:
            try:
                namespace[key] = None
            except Exception:  # noqa: BLE001
                pass


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
