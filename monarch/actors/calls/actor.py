"""``Actor``: the base class of user actors."""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Any

from monarch.actors.calls.context import context
from monarch.actors.calls.endpoint import endpoints_of


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
        inst = context().actor_instance
        return logging.getLogger(f"monarch.actor.{inst.name}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} actor>"


def check_actor_class(cls: Any) -> type:
    """What ``spawn`` refuses before anything is sent (``TypeError``, ``ValueError``)."""
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise TypeError(f"spawn() needs a subclass of monarch.actor.Actor, got {cls!r}")
    _check_hooks_match_endpoints(cls)
    return cls


def _check_hooks_match_endpoints(cls: type) -> None:
    """An actor with sync endpoints needs sync hooks, as Monarch requires (``ValueError``).

    Monarch also refuses a class that mixes sync and async endpoints, or has
    async endpoints and a sync ``__cleanup__``. This runtime runs both kinds
    safely (sync code on the actor's thread, async code on the loop) and
    accepts those classes: a script written for Monarch never has them.
    """
    sync = sorted(name for name, prop in endpoints_of(cls).items() if not prop.is_async)
    if not sync:
        return
    for hook in ("__cleanup__", "__supervise__"):
        if inspect.iscoroutinefunction(getattr(cls, hook, None)):
            raise ValueError(
                f"{cls} has sync endpoints, but an async {hook}. Make sure {hook} is also "
                f"synchronous (an actor's hooks run the way its endpoints do). sync: {sync}"
            )


def class_ref(cls: type) -> Any:
    """How a spawn message names the actor class: ``module:qualname`` when importable.

    Classes defined in a script's ``__main__`` (or inside functions) travel by
    value through cloudpickle instead, which the receiving proc unpickles.
    """
    module = cls.__module__
    if module != "__main__" and "<locals>" not in cls.__qualname__:
        return f"{module}:{cls.__qualname__}"
    return cls


def resolve_class(ref: Any) -> type:
    if isinstance(ref, str):
        module, _, qualname = ref.partition(":")
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        ref = obj
    if not (isinstance(ref, type) and issubclass(ref, Actor)):
        raise TypeError(f"{ref!r} is not an Actor class")
    return ref
