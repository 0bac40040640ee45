"""Respawning ranks of a mesh in place: one actor per rank, each on a proc of its own.

A data-parallel job needs to replace *one* rank when its process dies while
the others keep their state. :class:`RankedMesh` keeps, per rank, a 1-proc
``ProcMesh`` and the actor spawned on it, so that one rank can be respawned
(a fresh proc and actor under the same rank number) or dropped without
touching the others. Its owner (the actor that created it) receives the
failures in ``__supervise__``; :meth:`RankedMesh.rank_of` says which rank a
``MeshFailure`` is about, and only failures of a rank's *current* actor count
(a late event from an old, replaced proc is ignored).

It is built on the public API only (``HostMesh.spawn_procs``,
``ProcMesh.spawn``); the cost of one proc mesh per rank is one message per
rank for a broadcast (:meth:`RankedMesh.call`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from monarch.actor import (
    Actor,
    ActorMesh,
    Future,
    MeshFailure,
    ProcMesh,
    ProcStartError,
    SpawnError,
    this_host,
)
from monarch.elastic.errors import NoCapacityError, RespawnError

A = TypeVar("A", bound=Actor)


def one_local_proc() -> ProcMesh:
    """The default proc provider: one new proc on this machine."""
    return this_host().spawn_procs(per_host={"procs": 1})


class RankedMesh(Generic[A]):
    """``size`` ranks of ``actor_class``, each on a proc of its own, each replaceable.

    ``provider`` starts one proc (a 1-proc ``ProcMesh``), by default on this
    host; it may raise :class:`NoCapacityError` when no proc is available.
    ``spare_procs`` caps how many replacements may be started over the mesh's
    life (``None``: no cap); past it :meth:`respawn` raises
    :class:`NoCapacityError` without starting anything. ``args``/``kwargs``
    go to every rank's ``__init__``, replacements included (a rank learns its
    number from the group it joins, not from its constructor).

    ``hot_spares`` ranks are started ahead (proc and actor, its ``__init__``
    done) and kept idle; a respawn promotes one, so a replacement costs
    milliseconds instead of a process start and the imports (torch alone takes
    seconds here). Each one used is replaced in the background while
    ``spare_procs`` allows; a spare that dies meanwhile is discarded
    (:meth:`rank_of` says ``None`` for it).

    Spawning returns at once; calls to a rank wait until it is up. Must be
    used from one thread (its owner's).
    """

    def __init__(
        self,
        name: str,
        actor_class: type[A],
        *args: Any,
        size: int,
        provider: Callable[[], ProcMesh] | None = None,
        spare_procs: int | None = None,
        hot_spares: int = 0,
        **kwargs: Any,
    ) -> None:
        if size < 1:
            raise ValueError(f"a RankedMesh needs at least one rank, got size={size}")
        if spare_procs is not None and spare_procs < 0:
            raise ValueError(f"spare_procs must be >= 0 or None, got {spare_procs}")
        if hot_spares < 0:
            raise ValueError(f"hot_spares must be >= 0, got {hot_spares}")
        self.name = name
        self.actor_class = actor_class
        self.args, self.kwargs = args, kwargs
        self.provider = provider or one_local_proc
        self.spare_procs = spare_procs
        self.respawned = 0
        self._serial = 0
        self._procs: list[ProcMesh] = []
        self._actors: list[ActorMesh[A]] = []
        self._names: list[str] = []  # each rank's current actor mesh name (unique: a serial)
        self._retired: list[Future[None]] = []  # stops of replaced or dropped procs, in flight
        self._spares: list[tuple[ProcMesh, ActorMesh[A], str]] = []  # started ahead, idle
        for _ in range(size):
            procs, actor, name = self._start()
            self._procs.append(procs)
            self._actors.append(actor)
            self._names.append(name)
        self.hot_spares = hot_spares
        self._refill()

    # -- looking up --------------------------------------------------------------

    @property
    def size(self) -> int:
        return len(self._actors)

    def __len__(self) -> int:
        return len(self._actors)

    def __getitem__(self, rank: int) -> ActorMesh[A]:
        """The current actor of ``rank`` (a 1-actor mesh: use ``call_one``)."""
        return self._actors[rank]

    @property
    def actors(self) -> list[ActorMesh[A]]:
        return list(self._actors)

    def rank_of(self, failure: MeshFailure) -> int | None:
        """Which rank's *current* actor or proc ``failure`` is about; ``None`` for anything else."""
        if failure.mesh_name in self._names:
            return self._names.index(failure.mesh_name)
        for spare in self._spares:
            if spare[2] == failure.mesh_name:  # a spare died before it was needed
                self._spares.remove(spare)
                self._retire(spare[0])
                self._refill()
        return None

    def call(self, endpoint: str, *args: Any, **kwargs: Any) -> list[Future[Any]]:
        """Call ``endpoint`` on every rank with the same arguments: one future per rank, in order."""
        return [getattr(a, endpoint).call_one(*args, **kwargs) for a in self._actors]

    def call_each(self, endpoint: str, per_rank: Sequence[tuple[tuple, dict]]) -> list[Future[Any]]:
        """Call ``endpoint`` on rank ``r`` with ``per_rank[r]`` = ``(args, kwargs)``."""
        if len(per_rank) != self.size:
            raise ValueError(f"{len(per_rank)} argument sets for {self.size} ranks")
        return [
            getattr(a, endpoint).call_one(*ar, **kw) for a, (ar, kw) in zip(self._actors, per_rank)
        ]

    # -- changing membership -----------------------------------------------------

    def respawn(self, rank: int) -> ActorMesh[A]:
        """Replace ``rank`` by a fresh proc and actor; returns the new actor at once.

        The old proc mesh is stopped in the background (its proc is usually
        dead already). Raises :class:`NoCapacityError` when ``spare_procs`` is
        used up or the provider has none, :class:`RespawnError` when starting
        the proc fails at once; a proc that fails to come up later makes calls
        to the new actor raise ``ProcStartError``/``SpawnError``.
        """
        self._check(rank)
        if self.spare_procs is not None and self.respawned >= self.spare_procs:
            raise NoCapacityError(
                self.name, rank, f"all {self.spare_procs} spare procs are used (spare_procs)"
            )
        try:
            procs, actor, name = self._spares.pop(0) if self._spares else self._start()
        except NoCapacityError:
            raise
        except (ProcStartError, SpawnError, OSError, RuntimeError) as e:
            raise RespawnError(self.name, rank, f"{type(e).__name__}: {e}") from e
        self.respawned += 1
        self._refill()
        self._retire(self._procs[rank])
        self._procs[rank], self._actors[rank], self._names[rank] = procs, actor, name
        return actor

    def drop(self, rank: int) -> None:
        """Remove ``rank``; the ranks above it move down by one (the mesh shrinks)."""
        self._check(rank)
        self._retire(self._procs.pop(rank))
        self._actors.pop(rank)
        self._names.pop(rank)

    def stop(self) -> Future[None]:
        """Stop every rank's proc (and the replaced ones still stopping); a future of the end."""
        procs = self._procs + [spare[0] for spare in self._spares]
        stops = [p.stop() for p in procs] + self._retired
        self._procs, self._actors, self._names, self._retired = [], [], [], []
        self._spares = []

        async def wait_all() -> None:
            for f in stops:
                with contextlib.suppress(Exception):  # a dead proc's mesh may say so on stop
                    await f

        return Future._from_coro(wait_all())

    # -- inside ------------------------------------------------------------------

    def _start(self) -> tuple[ProcMesh, ActorMesh[A], str]:
        procs = self.provider()
        name = f"{self.name}_{self._serial}"
        self._serial += 1
        return procs, procs.spawn(name, self.actor_class, *self.args, **self.kwargs), name

    def _refill(self) -> None:
        """Start hot spares up to ``hot_spares``, never more than ``spare_procs`` leaves."""
        while len(self._spares) < self.hot_spares:
            left = None if self.spare_procs is None else self.spare_procs - self.respawned
            if left is not None and len(self._spares) >= left:
                return
            try:
                self._spares.append(self._start())
            except (NoCapacityError, ProcStartError, SpawnError, OSError, RuntimeError):
                return  # a respawn will start one itself (and report why it cannot)

    def _retire(self, procs: ProcMesh) -> None:
        self._retired.append(procs.stop())

    def _check(self, rank: int) -> None:
        if not 0 <= rank < self.size:
            raise IndexError(f"rank {rank} out of range for {self.name!r} of size {self.size}")
