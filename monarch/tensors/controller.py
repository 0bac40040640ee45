"""The client's side of one proc mesh's tensor engine: references, the op stream, flushing.

One :class:`Controller` per proc mesh (shared by all its slices). It spawns a
:class:`~monarch.tensors.worker.TensorWorker` on every proc of the mesh on
first use, allocates reference ids, and owns the *op stream*: an ordered
queue of entries, each either an encoded op for the workers of some view of
the mesh, or a call (``fetch``, ``describe``...) to make when everything
queued before it has been sent.

Why a queue and not one message per op: an op is encoded on the caller's
thread (so a bad argument raises right there), then appended here; the first
entry appended to an empty queue schedules one flush on the runtime loop, a
millisecond later for ops, at once for calls (someone is waiting). Everything
that arrives before that flush runs goes out with it, consecutive ops for the
same view in one message. So a burst of ops costs a handful of messages, a
handful of cross-thread wake-ups, and no round trip. Because
every entry leaves from this one queue and one sender's messages to an actor
are handled in send order (point and broadcast alike), each worker sees its
entries in the order the client made them: ops, deletes, fetches and
collectives stay ordered without any acknowledgement.

Back-pressure: every ``_MARKER_EVERY`` entries a marker call goes to all
workers; a caller thread that is ``_WINDOW`` markers ahead of the slowest
worker waits (bounded by ``MONARCH_TENSOR_TIMEOUT``), so a fast client cannot
queue unbounded work. The runtime loop itself never waits.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import threading
import weakref
from typing import Any

from monarch.actors.calls.actor_mesh import ActorMesh
from monarch.actors.errors import MeshStoppedError
from monarch.actors.meshes.mesh_ops import state_of
from monarch.actors.meshes.shape import Extent, View
from monarch.actors.procs.proc_mesh import ProcMesh
from monarch.broker.bodies.codec import dumps
from monarch.core.future import Future
from monarch.tensors import config
from monarch.tensors.wire import func_spec
from monarch.tensors.worker import TensorWorker

log = logging.getLogger(__name__)

_BATCH_BYTES = 128 * 1024  # one message per view per flush, up to this much (stays in band)
_FLUSH_DELAY = 0.001  # ops wait this long for more ops to share their message
_DEAD_BATCH = 256  # released refs queued as one delete, at the latest with the next flush
_MARKER_EVERY = 2000
_WINDOW = 8

_controllers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_controllers_lock = threading.Lock()


def controller_for(mesh: Any) -> Controller:
    """The controller of ``mesh``'s proc mesh (created, and its workers spawned, on first use)."""
    if mesh is None:
        raise ValueError(
            "no proc mesh is active: use `with procs.activate():` (or pass monarch.Tensors, "
            "which know their mesh)"
        )
    state = getattr(mesh, "_state", None)
    if state is None or not hasattr(state, "actor_meshes"):
        raise TypeError(f"expected a ProcMesh, got {mesh!r}")
    ctl = _controllers.get(state)
    if ctl is None:
        with _controllers_lock:
            ctl = _controllers.get(state)
            if ctl is None:
                ctl = _controllers[state] = Controller(state)
                state.before_stop.append(ctl.flush_before_stop)
                _warm_up_meta()
    return ctl


def end_engine(mesh: Any, timeout: float) -> bool:
    """End the tensor engine of ``mesh``'s proc mesh; the procs keep running.

    Queued ops leave first; then the workers stop (each leaves its
    ``torch.distributed`` world and drops its tensors). The next use of the
    mesh starts a fresh engine. False if none was running.
    """
    state = getattr(mesh, "_state", None)
    with _controllers_lock:
        ctl = _controllers.pop(state, None) if state is not None else None
    if ctl is None:
        return False
    ctl.close(timeout)
    return True


_warmed = threading.Event()


def _warm_up_meta() -> None:
    """Pay the first meta elementwise op's cost (torch imports torch._dynamo for it, seconds)
    on a background thread, while the workers are starting, not on the user's first op."""
    if _warmed.is_set():
        return
    _warmed.set()

    def warm() -> None:
        import torch

        try:
            with torch._C.DisableTorchFunction():
                torch.zeros(1, device="meta") + 1
        except Exception:
            pass

    # Not a daemon: the interpreter's exit waits for it. A daemon thread still inside the
    # op when a short script ended was stopped by the exit while torch's C++ held the GIL
    # released, and std::terminate aborted the process (exit status 134, no traceback).
    threading.Thread(target=warm, name="monarch-meta-warmup", daemon=False).start()


def single(base: Extent, rank: int) -> View:
    """The view of one proc (by its rank in the whole mesh)."""
    return View(Extent([], []), base, [rank])


class Controller:
    """One proc mesh's workers, reference ids and op stream (see the module docstring)."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.rt = state.rt
        self.base: Extent = state.extent
        self.full = View.full(state.extent)
        self.workers: ActorMesh = ProcMesh(state, self.full).spawn("tensor_worker", TensorWorker)
        self._meshes: dict[View, ActorMesh] = {self.full: self.workers}
        self._lock = threading.RLock()
        self._room = threading.Condition(self._lock)
        self._queue: list[tuple] = []
        self._scheduled = False  # a flush will run
        self._urgent = False  # a flush will run now, not after _FLUSH_DELAY
        self._queued_bytes = 0
        self._dead: collections.deque = collections.deque()
        self._refs = itertools.count(1)
        self._funcs: dict[Any, int] = {}
        self._since_marker = 0
        self._outstanding = 0
        self._once_lock = threading.Lock()
        self._world: tuple | None = None
        self._inboxes: list[str] | None = None
        # At exit, closers run last-registered first: queued ops leave before the procs stop.
        self.rt.on_close(self._flush)

    # -- references -----------------------------------------------------------------

    def new_ref(self) -> int:
        return next(self._refs)

    def release(self, view: View, ref: int) -> None:
        """A handle died (a finalizer; any thread, even inside the GC): drop its ref later.

        Lock-free on purpose. The ref is deleted on the procs by a ``del`` entry
        queued with the next flush (or call), which is necessarily after every
        op that used it; deletes of many handles share one entry.
        """
        self._dead.append((view, ref))

    def _move_dead(self) -> None:
        if not self._dead:
            return
        by_view: dict[View, list[int]] = {}
        while self._dead:
            view, ref = self._dead.popleft()
            by_view.setdefault(view, []).append(ref)
        for view, refs in by_view.items():
            self._queue.append(("msg", view, dumps(("del", refs))))

    # -- the op stream ------------------------------------------------------------------

    def check_alive(self) -> None:
        ws = state_of(self.workers)
        if ws.stopped is not None or self.state.stopping:
            raise MeshStoppedError(
                f"proc mesh {self.state.name!r} is stopped; its tensors are gone"
            )

    def op(self, view: View, func: Any, args: Any, kwargs: Any, results: Any, grad: bool) -> None:
        """Queue ``func(*args, **kwargs)`` for the workers of ``view``."""
        fid = self.func_id(func)
        self.send(view, ("op", fid, args, kwargs, results, grad))

    def func_id(self, func: Any) -> int:
        """A small id for ``func``; its definition is queued to every worker the first time."""
        try:
            key = func if not isinstance(func, str) else ("path", func)
            hash(key)
        except TypeError:
            key = ("id", id(func))
        fid = self._funcs.get(key)
        if fid is not None:
            return fid
        kind, payload, name = func_spec(func)
        with self._lock:  # the definition is queued before any op that uses the id
            fid = self._funcs.get(key)
            if fid is None:
                fid = len(self._funcs) + 1
                self._append(("msg", self.full, dumps(("def", fid, kind, payload, name))))
                self._funcs[key] = fid
        return fid

    def send(self, view: View, entry: tuple) -> None:
        """Encode ``entry`` here (errors raise at the caller) and queue it for ``view``."""
        body = dumps(entry)
        self._push(("msg", view, body))

    def call(self, rank: int, endpoint: str, *args: Any) -> Future:
        """Call ``endpoint`` on the worker of ``rank`` once everything queued before is sent."""
        out: Future = Future()
        view = single(self.base, rank)

        def go() -> None:
            try:
                inner = getattr(self._mesh_for(view), endpoint).call_one(*args)
            except BaseException as e:
                out.set_exception(e)
                return
            inner.add_callback(lambda f: _copy(f, out))

        self._push(("call", go))
        return out

    def call_all(self, endpoint: str, *args: Any) -> Future:
        """Call ``endpoint`` on every worker (in order with the stream); a ValueMesh future."""
        out: Future = Future()

        def go() -> None:
            try:
                inner = getattr(self.workers, endpoint).call(*args)
            except BaseException as e:
                out.set_exception(e)
                return
            inner.add_callback(lambda f: _copy(f, out))

        self._push(("call", go))
        return out

    def _push(self, item: tuple) -> None:
        self.check_alive()
        self._wait_for_room()
        with self._lock:
            self._append(item)

    def _append(self, item: tuple) -> None:
        """Under the lock. Calls flush at once; ops wait up to ``_FLUSH_DELAY`` for company."""
        if item[0] == "call" or len(self._dead) >= _DEAD_BATCH:
            self._move_dead()  # a call may observe memory (stats): deletes go first
        self._queue.append(item)
        self._since_marker += 1
        if self._since_marker >= _MARKER_EVERY:
            self._since_marker = 0
            self._outstanding += 1
            self._queue.append(("call", self._send_marker))
        if item[0] == "msg":
            self._queued_bytes += len(item[2])
        if item[0] == "call" or self._queued_bytes > _BATCH_BYTES:
            if not self._urgent:
                self._urgent = self._scheduled = True
                self.rt.call_soon(self._flush)
        elif not self._scheduled:
            self._scheduled = True
            self.rt.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        self.rt.loop.call_later(_FLUSH_DELAY, self._flush)

    def _wait_for_room(self) -> None:
        if self.rt.on_loop_thread():
            return
        with self._room:
            if self._outstanding < _WINDOW:
                return
            if not self._room.wait_for(lambda: self._outstanding < _WINDOW, config.timeout()):
                raise TimeoutError(
                    f"the tensor workers of {self.state.name!r} are {self._outstanding * _MARKER_EVERY}"
                    f" ops behind and made no progress for {config.timeout():.0f} s "
                    "(MONARCH_TENSOR_TIMEOUT)"
                )

    def _send_marker(self) -> None:
        def done(_: Any) -> None:
            with self._room:
                self._outstanding -= 1
                self._room.notify_all()

        try:
            self.workers.ping.call().add_callback(done)
        except BaseException:
            done(None)

    def close(self, timeout: float) -> None:
        """Send what is queued, then stop the workers (see :func:`end_engine`)."""
        with contextlib.suppress(ValueError):
            self.state.before_stop.remove(self.flush_before_stop)
        self.rt.forget_on_close(self._flush)
        self.rt.call_soon(self._flush)  # before the stop below: the loop runs them in order
        self.workers.stop().get(timeout)

    def flush_before_stop(self) -> None:
        """``ProcMesh.stop()`` calls this first: what is queued for the mesh leaves before the stop
        (ops wait up to ``_FLUSH_DELAY`` otherwise, and would find the workers stopped)."""
        self.rt.call_soon(self._flush)

    def _flush(self) -> None:
        """On the loop: send what is queued, in order, coalescing ops per view."""
        with self._lock:
            self._move_dead()  # every flush carries the deletes of handles dead by now
            items, self._queue = self._queue, []
            self._scheduled = self._urgent = False
            self._queued_bytes = 0
        batch: list[bytes] = []
        target: View | None = None
        size = 0
        for item in items:
            if item[0] == "msg":
                _, view, body = item
                if batch and (
                    (view is not target and view != target) or size + len(body) > _BATCH_BYTES
                ):
                    self._emit(target, batch)  # type: ignore[arg-type]
                    batch, size = [], 0
                target = view
                batch.append(body)
                size += len(body)
            else:
                if batch:
                    self._emit(target, batch)  # type: ignore[arg-type]
                    batch, size = [], 0
                try:
                    item[1]()
                except Exception:
                    log.exception("tensor engine: a queued call failed to start")
        if batch:
            self._emit(target, batch)  # type: ignore[arg-type]

    def _emit(self, view: View, batch: list[bytes]) -> None:
        try:
            self._mesh_for(view).run.broadcast(batch)
        except Exception as e:  # a stopped mesh: its tensors are gone; later calls raise
            log.debug("tensor engine: ops for %r not sent: %s", self.state.name, e)

    def _mesh_for(self, view: View) -> ActorMesh:
        mesh = self._meshes.get(view)
        if mesh is None:
            mesh = self._meshes[view] = ActorMesh(state_of(self.workers), view)
        return mesh

    # -- once per proc mesh -----------------------------------------------------------

    def ensure_world(self) -> None:
        """Make the workers one ``torch.distributed`` world, once (blocks for one round trip).

        Rendezvous goes through the broker: rank 0's worker opens a
        ``TCPStore`` on a free port and answers its address (and the backend
        it picked: gloo, or gloo for CPU plus NCCL for CUDA tensors) in reply
        to a NATS call; a ``world`` op carrying that address then goes to all
        workers in the op stream, and each calls ``init_process_group``.
        """
        if self._world is not None:
            return
        with self._once_lock:
            if self._world is None:
                host, port, backend = self.call(0, "store_address").get(config.timeout())
                self.send(self.full, ("world", host, port, backend))
                self._world = (host, port, backend)

    def inboxes(self) -> list[str]:
        """Each worker's inbox subject (for tensors sent worker to worker), by rank."""
        if self._inboxes is None:
            with self._once_lock:
                if self._inboxes is None:
                    vm = self.call_all("inbox_subject").get(config.timeout())
                    self._inboxes = list(vm.values())
        return self._inboxes


def _copy(src: Future, dst: Future) -> None:
    try:
        dst.set_result(src.get())
    except BaseException as e:
        dst.set_exception(e)
