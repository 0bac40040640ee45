"""Exceptions a user of the actor API can see, each naming what it concerns."""

from __future__ import annotations


class ActorError(Exception):
    """An endpoint raised; the actor that raised keeps serving.

    ``exception`` is the original exception when it could be rebuilt on the
    caller's side (otherwise a :class:`RemoteException` with its type name and
    message); ``traceback`` is the remote traceback as text.
    """

    def __init__(
        self,
        exception: BaseException,
        traceback: str = "",
        *,
        actor_id: str = "",
        rank: int | None = None,
        endpoint: str = "",
    ) -> None:
        self.exception = exception
        self.traceback = traceback
        self.actor_id = actor_id
        self.rank = rank
        self.endpoint = endpoint
        # Two args, as in Monarch: unpickling calls ActorError(*args) and restores
        # the rest from __dict__, so an ActorError re-raised by a nested call
        # travels back to its caller intact.
        super().__init__(exception, traceback)

    def __str__(self) -> str:
        # Monarch's words ("Actor call <actor name>.<endpoint> failed." and its
        # traceback header): users' log scrapers and tests match on them.
        name = self.actor_id.split("[", 1)[0].rsplit(".", 1)[0]  # "e.1a2b3c4d[0]" -> "e"
        if name and self.endpoint:
            head = f"Actor call {name}.{self.endpoint} failed."
        else:
            head = "A remote actor call has failed."
        if self.traceback:
            body = self.traceback.replace(
                "Traceback (most recent call last):",
                "Traceback of where the remote call failed (most recent call last):",
            )
        else:
            body = f"{type(self.exception).__name__}: {self.exception}"
        return f"{head}\n {body.rstrip()}"


class RemoteException(Exception):
    """Stands in for a remote exception whose class cannot be rebuilt here."""

    def __init__(self, type_name: str, message: str) -> None:
        self.type_name = type_name
        self.message = message
        super().__init__(type_name, message)

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}"


class SupervisionError(RuntimeError):
    """The actor a call was waiting on failed (died, crashed, was stopped)."""

    def __init__(self, message: str = "", *, actor_id: str = "", rank: int | None = None) -> None:
        self.actor_id = actor_id
        self.rank = rank
        super().__init__(message)


def process_exit_reason(code: int) -> str:
    """Why a process ended, in Monarch's words first (its ``ProcStatus``: ``Killed(sig=9)``,
    ``Stopped(exit=7)``), then ours."""
    status = f"Killed(sig={-code})" if code < 0 else f"Stopped(exit={code})"
    return f"{status}, its process exited with code {code}"


def actor_failed_message(actor: str, reason: str) -> str:
    """Monarch's words for a call to a failed actor; users' log scrapers and tests match on them.

    ``actor`` describes the actor (see :func:`describe_actor`), ``reason`` says
    why it failed (an exception, a process exit); it may span lines.
    """
    reason = reason.rstrip().replace("\n", "\n  ")
    return f"The actor {actor} and all its descendants have failed:\n  {reason}"


def describe_actor(cls: type | None, class_name: str, mesh_name: str, point: object) -> str:
    """An actor as Monarch prints it: ``<root>.<module.Class mesh{'gpus': 1/2}>``."""
    if cls is not None:
        class_name = f"{cls.__module__}.{cls.__qualname__}"
    return f"<root>.<{class_name} {mesh_name}{point!r}>"


class MeshStoppedError(SupervisionError):
    """The mesh was stopped before or while this call was made."""


class NoActorError(SupervisionError):
    """No actor is listening where the message was sent (broker reported no responders)."""


class NotAnEndpointError(AttributeError):
    """A name used as an endpoint exists on the actor class but is not an endpoint."""


class ProcStartError(RuntimeError):
    """A process of a proc mesh failed to start or to report ready in time."""


class SpawnError(SupervisionError):
    """Creating actors failed on at least one proc (for example ``__init__`` raised)."""


class BrokerLostError(ConnectionError):
    """The broker connection dropped while a call was in flight; its fate is unknown."""


class MalformedMessageError(ValueError):
    """A message could not be read (bad bytes or headers); the receiving actor lives on."""


class MessageLostError(ConnectionError):
    """Messages to an actor mesh were lost on the way (a broker node died); they were not run.

    ``counts`` maps each rank to how many of this process's messages to it were
    lost. Raised by the lost call itself, or by the next call or send on a mesh
    that lost broadcasts (see :mod:`monarch.actors.messaging.lost_sends`).

    For a call to several ranks, only some of which it reached, what is known
    per rank (sorted rank lists): ``ran`` (it replied, or its proc says it ran
    or is running the call), ``not_run`` (its proc never received the call) and
    ``unknown`` (its proc did not answer). Repeating the call on the whole mesh
    runs it twice on ``ran``; it is safe only when ``ran`` and ``unknown`` are
    empty.
    """

    def __init__(
        self,
        message: str,
        *,
        mesh: str = "",
        counts: dict[int, int] | None = None,
        ran: list[int] | None = None,
        not_run: list[int] | None = None,
        unknown: list[int] | None = None,
    ):
        self.mesh = mesh
        self.counts = dict(counts or {})
        self.ran = sorted(ran or [])
        self.not_run = sorted(not_run or [])
        self.unknown = sorted(unknown or [])
        super().__init__(message)
