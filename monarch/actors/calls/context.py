"""Who is running this code: ``context()``, ``current_rank()``, ``current_size()``.

Inside an endpoint the context names the actor and the rank the message was
sent to; in the client script it names the client, the root of the owner
tree (a mesh of one, with an empty extent).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from monarch import settings as config
from monarch.actors.meshes.shape import Extent, Point
from monarch.core.process_runtime import current_runtime_or_none

# this_proc(), handed in by monarch.actors.procs.proc_mesh (which builds on this module).
_this_proc: Callable[[], Any] | None = None


def set_this_proc(fn: Callable[[], Any]) -> None:
    """Hand in what ``Instance.proc`` returns: this process as a proc mesh of one."""
    global _this_proc
    _this_proc = fn


# A proc mesh from the reference fields a spawn message carries, handed in by
# monarch.actors.procs.proc_mesh (it owns the reference format).
_proc_mesh_from_fields: Callable[[list], Any] | None = None


def set_proc_mesh_decoder(fn: Callable[[list], Any]) -> None:
    """Hand in how ``Instance.proc_mesh`` turns a spawn message's reference into a ProcMesh."""
    global _proc_mesh_from_fields
    _proc_mesh_from_fields = fn


def proc_mesh_from_fields(fields: list) -> Callable[[], Any]:
    """``Instance.proc_mesh``, resolved on first use (a reference here watches the procs)."""

    def resolve() -> Any:
        if _proc_mesh_from_fields is None:
            raise RuntimeError(
                "no proc meshes here: monarch.actors.procs.proc_mesh is not imported"
            )
        return _proc_mesh_from_fields(fields)

    return resolve


class ActorId(str):
    """An actor's id as text (``name.uid[rank]``, or ``client``), with Monarch's ``actor_name``.

    Code written for Monarch reads ``context().actor_instance.actor_id.actor_name``
    (TorchForge names its metrics by it); everything else here uses the text.
    ``actor_name`` is the name the actor's mesh was spawned with, ``client`` in the client.
    """

    actor_name: str

    def __new__(cls, text: str, actor_name: str) -> ActorId:
        made = super().__new__(cls, text)
        made.actor_name = actor_name
        return made

    def __getnewargs__(self) -> tuple[str, str]:  # type: ignore[override]
        return (str(self), self.actor_name)


class Instance:
    """The running actor (or the client) as seen from its own code."""

    def __init__(
        self,
        actor_id: str,
        name: str,
        rank: Point,
        proc_uid: str,
        _stop: Any = None,
        _abort: Any = None,
        _proc_mesh: Any = None,
        class_name: str | None = None,
        creator: CreatorInstance | None = None,
    ) -> None:
        self.actor_id = ActorId(actor_id, "client" if actor_id == "client" else name)
        self.name = name  # the name the actor mesh was given at spawn
        self.rank = rank  # the actor's point in the mesh it was spawned on
        self.proc_uid = proc_uid
        self._stop = _stop
        self._abort = _abort
        # The ProcMesh the actor was spawned on, or a function that makes it (on first use).
        self._proc_mesh = _proc_mesh
        self.class_name = class_name  # ``module.Class`` of the actor; None for the client
        self.creator = creator  # who spawned this actor; None for the client (the root)
        self._actor: Any = None
        self.owned: list[Any] = []  # meshes this actor spawned; stopped before it cleans up
        self._qualified: str | None = None

    @property
    def proc(self) -> Any:
        """The process this code runs in, as a proc mesh of one (spawn actors next to it)."""
        if _this_proc is None:
            raise RuntimeError(
                "no proc meshes here: monarch.actors.procs.proc_mesh is not imported"
            )
        return _this_proc()

    @property
    def proc_mesh(self) -> Any:
        """The proc mesh this code runs in.

        Inside an actor: the proc mesh (or slice of one) it was spawned on, as
        in Monarch, so ``context().actor_instance.proc_mesh.spawn(...)`` puts
        siblings on the same procs; a controller's is the root client's process.
        In the client: its own process, as a proc mesh of one.
        """
        pm = self._proc_mesh
        if callable(pm):  # a reference from the spawn message: made on first use
            pm = self._proc_mesh = pm()
        if pm is not None:
            return pm
        if self._stop is not None:  # only actors can stop themselves: this is one
            raise NotImplementedError(
                f"context().actor_instance.proc_mesh inside actor {self.actor_id}: its spawn "
                "did not say which proc mesh it runs on; use context().actor_instance.proc"
            )
        return self.proc

    def stop(self, reason: str | None = None) -> None:
        """Stop this actor once the message it is handling is done.

        ``reason`` is accepted as in Monarch 0.7 (``actor_instance.stop("done")``); ours
        stops the actor the same way whatever it says.
        """
        if self._stop is None:
            raise RuntimeError("the client cannot stop itself this way; use shutdown_context()")
        self._stop()

    def abort(self, reason: str | None = None) -> None:
        """Fail this actor (as in Monarch): its owner is told, with ``reason``.

        The message being handled finishes; later calls raise ``SupervisionError``.
        """
        if self._abort is None:
            raise RuntimeError("the client cannot abort itself; raise an exception or exit")
        self._abort(reason)

    def creator_chain(self) -> list[list]:
        """This instance and its creators, innermost first, as a spawn message carries them."""
        chain: list[list] = []
        ins: Any = self
        while ins is not None:
            chain.append([ins.name, ins.class_name, ins.rank.extent.labels,
                          ins.rank.extent.sizes, ins.rank.rank])  # fmt: skip
            ins = ins.creator
        return chain

    def __repr__(self) -> str:
        """Monarch's name for it: ``<root>``, then ``<module.Class name{point}>`` per spawn."""
        if self._qualified is None:
            self._qualified = qualified_name(self)
        return self._qualified

    __str__ = __repr__


class CreatorInstance:
    """Who spawned an actor (``context().actor_instance.creator``), as Monarch describes it.

    Only what names it travels with the spawn: ``name``, ``class_name``,
    ``rank`` and its own ``creator`` (``None`` at the root client).
    """

    def __init__(
        self, name: str, class_name: str | None, rank: Point, creator: CreatorInstance | None
    ) -> None:
        self.name = name
        self.class_name = class_name
        self.rank = rank
        self.creator = creator

    @staticmethod
    def from_chain(chain: list[list] | None) -> CreatorInstance | None:
        """The creator a spawn message described (see :meth:`Instance.creator_chain`)."""
        creator = None
        for name, class_name, labels, sizes, rank in reversed(chain or []):
            creator = CreatorInstance(name, class_name, Point(rank, Extent(labels, sizes)), creator)
        return creator

    def __repr__(self) -> str:
        return qualified_name(self)


def qualified_name(ins: Any) -> str:
    """``<root>.<mod.Parent p{'f': 0/2}>.<mod.Child c{'g': 1/4}>``: the chain of spawns."""
    names = []
    while ins is not None:
        prefix = "" if ins.class_name is None else f"{ins.class_name} "
        point = repr(ins.rank) if len(ins.rank.extent.labels) > 0 else ""
        names.append(f"<{prefix}{ins.name}{point}>")
        ins = ins.creator
    return ".".join(reversed(names))


@dataclass
class Context:
    """``actor_instance`` runs the code; ``message_rank`` is where the message was sent."""

    actor_instance: Instance
    message_rank: Point


_CLIENT_EXTENT = Extent([], [])
_current: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "monarch_context", default=None
)


_in_client = contextvars.ContextVar("monarch_client_context", default=False)


def set_context(ctx: Context | None) -> contextvars.Token:
    _install_log_prefix()
    return _current.set(ctx)


def use_context(ctx: Context) -> None:
    """:func:`set_context` unless ``ctx`` is current already: an actor's runner handles
    message after message in one task (or thread) whose context keeps what it set last,
    so most messages set nothing (~1 us an actor of a broadcast, benchmarks/NOTES.md 62)."""
    if _current.get() is not ctx:
        set_context(ctx)


def _client_context() -> Context:
    rt = current_runtime_or_none()
    uid = rt.proc_uid if rt is not None else "client"
    point = Point(0, _CLIENT_EXTENT)
    return Context(Instance(actor_id="client", name="root", rank=point, proc_uid=uid), point)


def actor_context() -> Context | None:
    """The context of the actor whose code is running now; None in the client's own code."""
    return _current.get()


def context() -> Context:
    """The context of the code now running (an actor's, or the client's)."""
    ctx = _current.get()
    if ctx is not None:
        return ctx
    if not _in_client.get():  # from now on this thread's log records say "[actor=<root>]"
        _install_log_prefix()
        _in_client.set(True)
    return _client_context()


def current_rank() -> Point:
    """The point of the message now handled, in the mesh it was sent to (as in Monarch).

    A call on ``mesh.slice(procs=slice(1, 3))`` sees ranks 0 and 1 of an extent
    ``{'procs': 2}``; an integer index drops its dimension. In ``__init__`` and
    other hooks it is the actor's own point; in the client it is empty. The
    actor's own point in its whole mesh is ``context().actor_instance.rank``.
    """
    return context().message_rank


def current_size() -> dict[str, int]:
    """The sizes, by dimension, of the mesh (or slice) the message was sent to."""
    return dict(context().message_rank.extent)


def current_actor_name() -> str:
    """The running actor's id, one per rank: ``<mesh>.<uid>[<rank>]`` (``client`` in the client).

    As in Monarch, this names the actor, not its mesh: two ranks of one mesh
    answer differently. The mesh's name is ``context().actor_instance.name``.
    """
    return context().actor_instance.actor_id


def sender_id() -> str:
    """Readable id for the ``Mon-From`` header."""
    ctx = _current.get()
    return ctx.actor_instance.actor_id if ctx is not None else "client"


# -- "[actor=...]" before log messages, as in Monarch -------------------------------------


def _install_log_prefix() -> None:
    """Once per process: log records made in an actor's code (or in client code that
    has used ``context()``) start with ``[actor=<its name>] ``, unless
    ``monarch.actor.config.prefix_python_logs_with_actor`` is false.

    Done where records are made (the record factory), so every handler sees it,
    including handlers added later.
    """
    global _log_prefix_installed
    if _log_prefix_installed:
        return
    _log_prefix_installed = True
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        if not record.msg or not getattr(config, "prefix_python_logs_with_actor", True):
            return record  # empty messages are structured logs (torch.compile): untouched
        ctx = _current.get()
        if ctx is not None:
            who = repr(ctx.actor_instance)
        elif _in_client.get():
            who = _ROOT
        else:
            return record
        record.actor_prefix = f"[actor={who}] "
        record.msg = f"{record.actor_prefix}{record.msg}"
        return record

    logging.setLogRecordFactory(factory)


_ROOT = "<root>"
_log_prefix_installed = False
