"""``Actor``: the base class of user actors."""

from __future__ import annotations

import logging
from typing import Any


class Actor:
    """Subclass this and mark methods with ``@endpoint``.

    An actor lives in one proc and handles one message at a time. Its
    ``__init__`` runs in that proc with whatever arguments ``spawn`` got.
    Optional hooks: ``__supervise__(self, failure)`` (return truthy to handle
    a failure of a mesh this actor owns) and ``__cleanup__(self, exc)`` (runs
    when the actor stops, ``exc`` is the error that stopped it or ``None``).
    """

    @property
    def logger(self) -> logging.Logger:
        """A logger named after the actor; its records reach the client with the actor's rank."""
        from monarch.actors.context import context

        inst = context().actor_instance
        return logging.getLogger(f"monarch.actor.{inst.name}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} actor>"


def check_actor_class(cls: Any) -> type:
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise TypeError(f"spawn() needs a subclass of monarch.actor.Actor, got {cls!r}")
    return cls
