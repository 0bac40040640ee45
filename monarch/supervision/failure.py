"""``MeshFailure``: what an owner's ``__supervise__`` (or the root's hook) receives."""

from __future__ import annotations

from typing import Any


class MeshFailure:
    """Some actors of a mesh failed.

    ``mesh_name`` names the mesh, ``ranks`` the crashed ranks, ``reason`` says
    what happened (``actor_failed``, ``proc_died``, ``init_failed``,
    ``owner_failed``, ``heartbeat_lost``) and ``report()`` gives a readable
    account, including the failures it was caused by. ``actor`` describes the
    failed actor as Monarch prints it (``<root>.<module.Class mesh{'gpus': 1/2}>``)
    where the owner knows it; then the report starts with Monarch's words,
    "The actor ... and all its descendants have failed:", which users' log
    scrapers and tests match on.
    """

    def __init__(
        self,
        mesh_name: str,
        mesh_uid: str,
        ranks: list[int],
        reason: str,
        message: str,
        *,
        owner: str = "",
        cause: MeshFailure | None = None,
        exception: BaseException | None = None,
        traceback: str = "",
        actor: str = "",
    ) -> None:
        self.mesh_name = mesh_name
        self.mesh_uid = mesh_uid
        self.ranks = list(ranks)
        self.reason = reason
        self.message = message
        self.owner = owner
        self.cause = cause
        self.exception = exception
        self.traceback = traceback
        self.actor = actor

    @property
    def crashed_ranks(self) -> list[int]:
        return self.ranks

    def report(self) -> str:
        where = f"actor mesh {self.mesh_name!r} ranks {self.ranks} failed ({self.reason})"
        if self.actor:
            lines = [f"The actor {self.actor} and all its descendants have failed:"]
            body = [self.message, *([self.traceback.rstrip()] if self.traceback else []), where]
            lines.extend("  " + line for part in body for line in part.splitlines())
        else:
            lines = [f"{where}: {self.message}"]
            if self.traceback:
                lines.append(self.traceback.rstrip())
        if self.cause is not None:
            lines.append("caused by:")
            lines.extend("  " + line for line in self.cause.report().splitlines())
        return "\n".join(lines)

    def to_wire(self) -> dict[str, Any]:
        return {
            "mesh_name": self.mesh_name,
            "mesh_uid": self.mesh_uid,
            "ranks": self.ranks,
            "reason": self.reason,
            "message": self.message,
            "owner": self.owner,
            "traceback": self.traceback,
            "actor": self.actor,
            "cause": self.cause.to_wire() if self.cause is not None else None,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> MeshFailure:
        cause = cls.from_wire(d["cause"]) if d.get("cause") else None
        return cls(
            d["mesh_name"], d["mesh_uid"], d["ranks"], d["reason"], d["message"],
            owner=d.get("owner", ""), cause=cause, traceback=d.get("traceback", ""),
            actor=d.get("actor", ""),
        )  # fmt: skip

    def __str__(self) -> str:
        # Monarch's form (its MeshFailure's Display); the event is our report.
        return (
            f"MeshFailure(mesh_name={self.mesh_name}, crashed_ranks={self.ranks}, "
            f"event={self.report()})"
        )

    def __repr__(self) -> str:
        return f"MeshFailure({self.mesh_name!r}, ranks={self.ranks}, reason={self.reason!r})"


class SupervisionFailure(RuntimeError):
    """An owner failed because a failure of a mesh it owns was not handled."""

    def __init__(self, failure: MeshFailure) -> None:
        self.failure = failure
        super().__init__(failure.report())
