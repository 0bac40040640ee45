"""Who is running this code: ``context()``, ``current_rank()``, ``current_size()``.

Inside an endpoint the context names the actor and the rank the message was
sent to; in the client script it names the client, the root of the owner
tree (a mesh of one, with an empty extent).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from monarch.actors.meshes.shape import Extent, Point
from monarch.core.runtime import current_runtime_or_none

# this_proc(), handed in by monarch.actors.procs.proc_mesh (which builds on this module).
_this_proc: Callable[[], Any] | None = None


def set_this_proc(fn: Callable[[], Any]) -> None:
    """Hand in what ``Instance.proc`` returns: this process as a proc mesh of one."""
    global _this_proc
    _this_proc = fn


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
    ) -> None:
        self.actor_id = actor_id
        self.name = name  # the name the actor mesh was given at spawn
        self.rank = rank  # the actor's point in the mesh it was spawned on
        self.proc_uid = proc_uid
        self._stop = _stop
        self._abort = _abort
        self._proc_mesh = _proc_mesh  # the ProcMesh the actor was spawned on, when the spawn said
        self._actor: Any = None
        self.owned: list[Any] = []  # meshes this actor spawned; stopped before it cleans up

    @property
    def proc(self) -> Any:
        """The process this code runs in, as a proc mesh of one (spawn actors next to it)."""
        if _this_proc is None:
            raise RuntimeError("no proc meshes here: monarch.actors.procs.proc_mesh is not imported")
        return _this_proc()

    @property
    def proc_mesh(self) -> Any:
        """The proc mesh this code runs in.

        Inside an actor: the whole proc mesh it was spawned on (as in Monarch),
        when its spawn message named it; otherwise ``NotImplementedError``
        (use ``.proc`` for the actor's own proc, or pass the proc mesh as an
        argument). In the client: its own process, as a proc mesh of one.
        """
        if self._proc_mesh is not None:
            return self._proc_mesh
        if self._stop is not None:  # only actors can stop themselves: this is one
            raise NotImplementedError(
                f"context().actor_instance.proc_mesh inside actor {self.actor_id}: a proc mesh "
                "cannot be referenced from its procs yet; use context().actor_instance.proc "
                "(this actor's proc) or pass the actors the code needs as arguments"
            )
        return self.proc

    def stop(self) -> None:
        """Stop this actor once the message it is handling is done."""
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

    def __repr__(self) -> str:
        return f"Instance({self.actor_id!r}, rank={self.rank!r})"


@dataclass
class Context:
    """``actor_instance`` runs the code; ``message_rank`` is where the message was sent."""

    actor_instance: Instance
    message_rank: Point


_CLIENT_EXTENT = Extent([], [])
_current: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "monarch_context", default=None
)


def set_context(ctx: Context | None) -> contextvars.Token:
    return _current.set(ctx)


def _client_context() -> Context:
    rt = current_runtime_or_none()
    uid = rt.proc_uid if rt is not None else "client"
    point = Point(0, _CLIENT_EXTENT)
    return Context(Instance(actor_id="client", name="client", rank=point, proc_uid=uid), point)


def actor_context() -> Context | None:
    """The context of the actor whose code is running now; None in the client's own code."""
    return _current.get()


def context() -> Context:
    """The context of the code now running (an actor's, or the client's)."""
    ctx = _current.get()
    return ctx if ctx is not None else _client_context()


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
