"""Alias for ``monarch._src.actor.actor_mesh`` (see :mod:`monarch._src`).

``ActorMesh`` is our public :class:`monarch.actor.ActorMesh`: TorchForge's
provisioner checks ``isinstance(x, ActorMesh)`` against this path, and
Monarch's ``dining_philosophers.py`` imports it.

``_context`` is the context variable that holds the running actor's context:
set while an actor's code runs, ``None`` in a client's own code. Downstream
code (torchstore's SPMD start-up) reads it to ask "am I already inside a
Monarch actor?". Ours is the same variable that :func:`monarch.actor.context`
reads, so the answer is the same as Monarch 0.7's. Read it; never set it.

``Channel``, ``Port`` and ``PortReceiver`` are our public
:class:`monarch.actor.Channel`, :class:`~monarch.actor.Port` and
:class:`~monarch.actor.PortReceiver` (``Channel.open()`` gives a port and its
receiver), which Monarch's examples and tests import from this path.
"""

from monarch.actor import ActorMesh, Channel, Port, PortReceiver
from monarch.actors.calls.context import _current as _context

__all__ = ["ActorMesh", "Channel", "Port", "PortReceiver", "_context"]
