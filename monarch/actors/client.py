"""The root of the owner tree: starting the client's runtime on first use.

This is the top of the actor layer. Importing it hands :func:`start_client` to
the core (:func:`monarch.core.process_runtime.set_starter`), so the first use of the
API in a client script (``this_host()``, an ``RDMABuffer``, ...) starts,
in this order: the zygote procs fork from, the embedded nats-server when
``MONARCH_NATS_URL`` is unset, the runtime's loop on a daemon thread, the
connection, loss recovery, supervision (with the root's fault hook) and the
root's control server (``this_proc()`` actors, controllers). At exit
everything it started is stopped again.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import secrets
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from monarch.actors import debugging
from monarch.actors.hosting.server import local_server
from monarch.actors.hosting.stacks import serve_stacks
from monarch.actors.hosting.stalls import watch_stalls
from monarch.actors.hosting.stats import serve_stats
from monarch.actors.hosting.supervisor import start_supervision
from monarch.actors.hosting.telemetry import start_telemetry
from monarch.actors.messaging.loss_recovery import start_loss_recovery
from monarch.actors.procs.controllers import get_or_spawn_here
from monarch.actors.procs.launcher_thread import run_on_launcher_thread
from monarch.actors.procs.zygote_client import prestart_zygote
from monarch.broker.connections import job_records
from monarch.broker.connections.auth import job_key
from monarch.broker.connections.server import EmbeddedBroker
from monarch.broker.vocabulary import subjects
from monarch.core.future import Future
from monarch.core.process_runtime import (
    current_runtime_or_none,
    install_runtime,
    runtime,
    set_starter,
    shutdown_runtime,
)
from monarch.core.runtime import Runtime, new_event_loop
from monarch.settings import Settings, settings
from monarch.supervision.failure import MeshFailure

log = logging.getLogger(__name__)

_embedded_url: str | None = None  # the URL of the broker this process started, if any
_parents_url: str | None = None  # in a forked child: the parent's embedded broker, not ours
_atexit_registered = False
_lost_timeout_set: list[str] = []  # the MONARCH_BROKER_LOST_TIMEOUT we set for our procs
_attached: str | None = None  # the broker URL attach() gave, once it did
_ATTACH_SCHEMES = ("nats", "tls", "tcp")


def embedded_broker_url() -> str | None:
    """The URL (token included) of the nats-server this client started, if it started one."""
    return _embedded_url


def default_unhandled_fault_hook(failure: MeshFailure) -> None:
    """Print the failure and leave it unhandled (``sys.exit(1)``, as Monarch's): the client ends.

    A hook that raises (anything, ``SystemExit`` too) leaves the fault
    unhandled and the client ends (:func:`end_client_for_unhandled_fault`);
    one that returns drops the fault and the client goes on.
    """
    print(f"Unhandled monarch failure:\n{failure.report()}", file=sys.stderr, flush=True)
    sys.exit(1)


_ending = threading.Lock()  # held from the first unhandled fault on: the client ends once


def end_client_for_unhandled_fault() -> None:
    """End the client as Monarch does for a fault nobody handled: a KeyboardInterrupt
    in the main thread.

    Only the main thread can end the interpreter the way a Python program ends
    (``finally`` blocks, atexit handlers, destructors; our own atexit handler
    then stops the procs and the broker), so SIGINT is sent to that thread
    itself: a ``time.sleep`` or a ``.get()`` there is interrupted at once. The
    status is a KeyboardInterrupt's (130 from a shell; 1 in a multiprocessing
    child). Once only: a second fault must not interrupt the first one's
    cleanup. Where nothing in Python would hear SIGINT (the main thread has
    ended, or SIGINT is ignored or left to the OS), the runtime is stopped
    (bounded) and the process exits 1.
    """
    if not _ending.acquire(blocking=False):
        return
    main = threading.main_thread()
    if main.is_alive() and callable(signal.getsignal(signal.SIGINT)):
        signal.pthread_kill(main.ident, signal.SIGINT)  # type: ignore[arg-type]
        return
    done = threading.Thread(target=shutdown_runtime, daemon=True)
    done.start()
    done.join(10)
    os._exit(1)


# Where the root finds the fault hook when a failure reaches it. The public
# facade (monarch.actor) hands in a lookup of its ``unhandled_fault_hook``
# attribute, which users assign as in Monarch.
_fault_hook_source: Callable[[], Callable[[MeshFailure], Any] | None] = lambda: None  # noqa: E731


def set_fault_hook_source(source: Callable[[], Callable[[MeshFailure], Any] | None]) -> None:
    """Hand in where the root's fault hook is looked up, at each failure."""
    global _fault_hook_source
    _fault_hook_source = source


def current_fault_hook() -> Callable[[MeshFailure], Any]:
    """The hook a failure that reaches the root runs: the user's, or the default."""
    return _fault_hook_source() or default_unhandled_fault_hook


def _forget_lost_timeout() -> None:
    while _lost_timeout_set:
        value = _lost_timeout_set.pop()
        if os.environ.get("MONARCH_BROKER_LOST_TIMEOUT") == value:
            del os.environ["MONARCH_BROKER_LOST_TIMEOUT"]


def start_client() -> Runtime:
    """Start the broker if needed, the loop thread, and connect: the client becomes the root."""
    global _embedded_url, _atexit_registered
    settings.cache_clear()  # the environment as it is now, when the client starts
    cfg = settings()
    # Procs fork from it, so their imports are paid once, in the background, while
    # the broker starts; each fork request carries the proc's environment (URL too).
    prestart_zygote()
    broker = None
    url = cfg.nats_url
    if url and url == _parents_url:
        url = None  # a forked child's own broker: the parent's dies with the parent
    if not url:
        # Loopback only, and a token that only the procs we start receive (in
        # MONARCH_NATS_URL, i.e. the environment, which only we can read; the
        # server reads it from a private config file, never from its argv).
        # Started on the launcher's long-lived thread: its parent-death signal must
        # not fire when the thread that first used monarch ends (a pool's thread).
        token = secrets.token_urlsafe(18)
        broker = run_on_launcher_thread(lambda: EmbeddedBroker(token=token).start())
        url = broker.url
        # Procs we start inherit the URL through the environment.
        os.environ["MONARCH_NATS_URL"] = url
        _embedded_url = url
        # This broker dies only with us: for our procs, losing it is losing their
        # owner, which the heartbeat timeout bounds (not the longer wait for a
        # broker that restarts). Matters where the kernel does not tie them to us
        # (MONARCH_DIE_WITH_PARENT=0).
        if "MONARCH_BROKER_LOST_TIMEOUT" not in os.environ:
            os.environ["MONARCH_BROKER_LOST_TIMEOUT"] = str(cfg.heartbeat_timeout)
            _lost_timeout_set.append(str(cfg.heartbeat_timeout))
    loop = new_event_loop()
    uid = subjects.new_uid()
    rt = Runtime(proc_uid=f"client-{uid}", loop=loop, cfg=cfg)
    rt.is_client = True
    started = threading.Event()
    thread = threading.Thread(
        target=_run_loop_forever, args=(loop, started), name="monarch-runtime", daemon=True
    )
    thread.start()
    started.wait()
    try:
        asyncio.run_coroutine_threadsafe(_connect_client(rt, url), loop).result(30)
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        if broker is not None:
            broker.stop()
            if os.environ.get("MONARCH_NATS_URL") == url:
                del os.environ["MONARCH_NATS_URL"]  # a retry starts a new broker
            _embedded_url = None
            _forget_lost_timeout()
        raise
    record = _publish_job_record(cfg, url, embedded=broker is not None)

    def shutdown() -> None:
        # Every wait is bounded (about stop_timeout + 20 s in all): exit never hangs.
        global _embedded_url
        if record is not None:
            record.remove()  # first: tools stop finding the job before its broker goes
        try:
            asyncio.run_coroutine_threadsafe(rt.close(), loop).result(cfg.stop_timeout + 5)
        except Exception:
            log.exception("monarch runtime did not close cleanly")
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        if broker is not None:
            broker.stop()
            if os.environ.get("MONARCH_NATS_URL") == url:
                del os.environ["MONARCH_NATS_URL"]
            _embedded_url = None
            _forget_lost_timeout()
        install_runtime(None)

    rt.stop_process = shutdown
    if not _atexit_registered:  # once: a restarted runtime is shut down by the same handler
        atexit.register(shutdown_runtime)
        _atexit_registered = True
    return rt


def _publish_job_record(
    cfg: Settings, url: str, *, embedded: bool
) -> job_records.PublishedJob | None:
    """Write the record by which ``monarch ps`` (etc.) run elsewhere find this job.

    Only the root writes one (procs install their runtime without this
    starter). It holds the credentials this client connected with, and the
    job key when the job signs its messages, so tools can read and sign too.
    """
    try:
        credentials = {name: getattr(cfg, name) for name in job_records.CREDENTIALS}
        credentials["nats_job_key"] = job_key(cfg)  # MONARCH_AUTH=1: the key made for this job
        record = job_records.new_record(
            url=url,
            namespace=cfg.namespace,
            embedded=embedded,
            credentials=credentials,
            script=sys.argv[0] if sys.argv else "",
        )
        return job_records.publish(record, cfg.job_name)
    except Exception:  # discovery is a convenience: never the reason a job fails to start
        log.warning("monarch: this job's record was not written", exc_info=True)
        return None


def _forget_parent_after_fork() -> None:
    """In a forked child (``os.fork``, multiprocessing's fork): the parent's broker is not ours.

    The core forgets the parent's runtime (its loop thread, heartbeats and
    launcher did not survive the fork); here the child forgets the broker the
    parent started: it must neither use it nor stop it (at its exit it would
    kill it under the parent). On first use the child starts its own, and
    what it starts dies with it.
    """
    global _embedded_url, _parents_url
    if _embedded_url is not None:
        _parents_url = _embedded_url  # MONARCH_NATS_URL still names it; stays the parent's
    _embedded_url = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_after_fork)


async def _connect_client(rt: Runtime, url: str) -> None:
    await rt.connect(url)
    start_loss_recovery(rt)
    await start_supervision(
        rt,
        create_streams=True,
        owner_proc=None,
        find_actor=lambda actor_id: local_server(rt).find(actor_id),
        fault_hook=current_fault_hook,
        on_unhandled=end_client_for_unhandled_fault,
    )
    await start_telemetry(rt, client=True)  # MONARCH_TELEMETRY=1 only
    # The root also serves control messages: this_proc() actors, and the job's
    # singleton controllers, which only the root hands out.
    server = local_server(rt)
    server.handle("controller", lambda msg: get_or_spawn_here(server, msg))
    await serve_stats(rt)  # its this_proc() actors, for `monarch top` and `monarch stacks`
    watch_stalls(rt)  # calls over MONARCH_STALL_THRESHOLD: told to their callers, who warn
    await serve_stacks(rt)  # `monarch stacks`: every thread's stack, from the side channel
    debugging.install()  # breakpoint() in this_proc() actors pauses for `monarch debug`


def _run_loop_forever(loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(started.set)
    loop.run_forever()


def shutdown_context() -> Future[None]:
    """Stop everything this client started (procs, actors, embedded broker).

    Returns a future that completes when all is down. A later use of the API
    starts afresh. Not callable from inside an actor.
    """
    fut: Future[None] = Future()
    rt = current_runtime_or_none()
    if rt is None:
        fut.set_result(None)
        return fut
    if not rt.is_client or rt.on_loop_thread():
        raise RuntimeError(
            "shutdown_context() is for the client script, not for code inside actors"
        )

    def run() -> None:
        try:
            shutdown_runtime()
            fut.set_result(None)
        except BaseException as e:
            fut.set_exception(e)

    threading.Thread(target=run, name="monarch-shutdown", daemon=True).start()
    return fut


def _broker_url(addr: str) -> str:
    """``addr`` as a NATS URL; ``tcp://host:port`` is ``nats://host:port``."""
    scheme, sep, rest = addr.partition("://")
    if not sep or scheme.lower() not in _ATTACH_SCHEMES or not rest.strip("/"):
        raise ValueError(
            f"attach({addr!r}): the address must be a NATS broker's URL, "
            "nats://host:port or tls://host:port (tcp://host:port is read as nats://host:port)"
        )
    return f"nats://{rest}" if scheme.lower() == "tcp" else addr


def attach(addr: str) -> None:
    """Make this process a client of the job whose NATS broker is at ``addr``, and start it.

    Monarch 0.7's ``attach`` bootstraps the client through a remote gateway; in
    ours every process reaches its job over NATS, so the gateway is the broker:
    the client's runtime connects to ``addr`` instead of starting a broker of its
    own, and the procs it starts use it too. Call it before anything starts the
    client. Attaching again to the same address does nothing; another address,
    or a client already started here without attach, raises ``RuntimeError``.
    """
    global _attached
    url = _broker_url(addr)
    rt = current_runtime_or_none()
    if _attached is not None and _attached != url:
        raise RuntimeError(f"this client is already attached to {_attached}, not {url}")
    if rt is not None and _attached is None:
        raise RuntimeError(
            "attach() must come before the client starts: this process already runs "
            "its client (on a broker it chose itself)"
        )
    if rt is not None:
        return  # attached to this address and running
    before = os.environ.get("MONARCH_NATS_URL")
    _attached = url
    os.environ["MONARCH_NATS_URL"] = url  # start_client reads it; our procs inherit it
    try:
        runtime()
    except BaseException:
        _attached = None
        if before is None:
            os.environ.pop("MONARCH_NATS_URL", None)
        else:
            os.environ["MONARCH_NATS_URL"] = before
        raise


set_starter(start_client)
