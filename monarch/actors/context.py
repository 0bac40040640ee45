"""Who is running this code: ``context()``, ``current_rank()``, ``current_size()``.

Inside an endpoint the context names the actor and the rank the message was
sent to; in the client script it names the client, the root of the owner
tree (a mesh of one, with an empty extent).
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

from monarch.actors.shape import Extent, Point


class Instance:
    """The running actor (or the client) as seen from its own code."""

    def __init__(
        self, actor_id: str, name: str, rank: Point, proc_uid: str, _stop: Any = None
    ) -> None:
        self.actor_id = actor_id
        self.name = name
        self.rank = rank
        self.proc_uid = proc_uid
        self._stop = _stop
        self._actor: Any = None
        self.owned: list[Any] = []  # meshes this actor spawned; stopped before it cleans up

    @property
    def proc(self) -> Any:
        """The process this code runs in, as a proc mesh of one (spawn actors next to it)."""
        from monarch.actors.proc_mesh import this_proc

        return this_proc()

    def stop(self) -> None:
        """Stop this actor once the message it is handling is done."""
        if self._stop is None:
            raise RuntimeError("the client cannot stop itself this way; use shutdown_context()")
        self._stop()

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
    from monarch.actors.runtime import current_runtime_or_none

    rt = current_runtime_or_none()
    uid = rt.proc_uid if rt is not None else "client"
    point = Point(0, _CLIENT_EXTENT)
    return Context(Instance(actor_id="client", name="client", rank=point, proc_uid=uid), point)


def context() -> Context:
    """The context of the code now running (an actor's, or the client's)."""
    ctx = _current.get()
    return ctx if ctx is not None else _client_context()


def current_rank() -> Point:
    """The running actor's point in its mesh."""
    return context().actor_instance.rank


def current_size() -> dict[str, int]:
    """The sizes of the running actor's mesh, by dimension."""
    return dict(context().actor_instance.rank.extent)


def current_actor_name() -> str:
    return context().actor_instance.name


def sender_id() -> str:
    """Readable id for the ``Mon-From`` header."""
    ctx = _current.get()
    return ctx.actor_instance.actor_id if ctx is not None else "client"
