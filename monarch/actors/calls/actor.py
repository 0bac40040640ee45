"""``Actor``: the base class of user actors."""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
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
    """An actor is sync or async as a whole, as Monarch requires (``ValueError`` at spawn).

    A class whose endpoints are all plain ``def`` is a sync actor: its code
    runs on a thread of its own, so a blocking ``.get()`` inside it is safe;
    its ``__cleanup__`` and ``__supervise__`` must be plain ``def`` too. Any
    other class is an async actor: its code runs on the proc's event loop, so
    a sync endpoint there could block (or deadlock) the loop. Hence Monarch
    refuses a class that mixes sync and async endpoints, or that has async
    endpoints and a sync ``__cleanup__``; so does this runtime, with Monarch's
    messages.
    """
    sync: list[str] = []
    asyncs: list[str] = []
    for name, prop in sorted(endpoints_of(cls).items()):
        (asyncs if prop.is_async else sync).append(name)
    cleanup = getattr(cls, "__cleanup__", None)
    if sync and asyncs:
        raise ValueError(
            f"{cls} mixes both async and sync endpoints. Synchronous endpoints cannot be "
            "mixed with async endpoints because they can cause the asyncio loop to deadlock "
            f"if they wait. sync: {sync} async: {asyncs}"
        )
    if asyncs and cleanup is not None and not inspect.iscoroutinefunction(cleanup):
        raise ValueError(
            f"{cls} has async endpoints, but a synchronous __cleanup__. Make sure __cleanup__ "
            "is also async. Synchronous endpoints cannot be mixed with async endpoints because "
            f"they can cause the asyncio loop to deadlock if they wait. async: {asyncs}"
        )
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

    Classes defined in a script's ``__main__`` (or inside functions), and
    classes made with ``type(...)`` that their module does not hold under
    their name (TorchForge's ``ForgeActor.options()`` subclasses), travel by
    value through cloudpickle instead, which the receiving proc unpickles.
    """
    module = cls.__module__
    if module != "__main__" and "<locals>" not in cls.__qualname__ and _held_by_name(cls):
        return f"{module}:{cls.__qualname__}"
    return cls


def _held_by_name(cls: type) -> bool:
    """Whether ``module.qualname`` (of a module already imported here) is this very class."""
    obj: Any = sys.modules.get(cls.__module__)
    if obj is None:
        return True  # not imported here: the proc imports it by name, as before
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj is cls


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
