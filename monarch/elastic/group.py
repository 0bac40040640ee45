"""Re-forming a ``torch.distributed`` (gloo) group after its membership changed.

Two halves:

* :class:`GroupStore` lives with the owner of the ranks (the actor that
  supervises them). It hosts the rendezvous, a ``torch.distributed.TCPStore``
  in the owner's process, so it survives the death of any rank, and hands out
  one :class:`Membership` per rank for each *generation* of the group. Every
  generation uses its own key prefix in the store, so a new group never meets
  a stale key of an old one.
* :class:`ElasticGroup` lives in each rank. ``join(membership)`` builds a
  fresh ``ProcessGroupGloo`` for that generation (blocking until every member
  joined); ``all_reduce`` runs a collective that can be *aborted* from another
  thread (an endpoint of the rank's actor), so a survivor stuck in a
  collective with a dead peer is freed at once instead of after gloo's
  timeout.

No process-global default group is used (``init_process_group`` is never
called): a group is an object, and replacing it is assigning a new one. An
aborted group may still have a gloo thread blocked in the collective; it is
kept (never destroyed, which would join that thread) until its own timeout
ends the collective.

Bit-for-bit reproducibility: a gloo allreduce sums in an order fixed by the
world size and the rank numbers. A replacement that takes the dead rank's
number in a group of the same size therefore reduces exactly as before.
"""

from __future__ import annotations

import datetime
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from monarch.elastic.errors import GroupAbortedError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Membership:
    """One rank's place in one generation of a group: where to meet, who it is, how many."""

    host: str
    port: int
    generation: int
    rank: int
    world_size: int
    timeout_s: float = 30.0

    @property
    def prefix(self) -> str:
        return f"monarch-elastic/gen{self.generation}/"


class GroupStore:
    """The rendezvous of every generation of one elastic group, hosted in this process.

    ``host`` must be an address of this machine that the ranks can reach
    (loopback when they all run here). ``timeout_s`` bounds a join and every
    collective of the groups it forms.
    """

    def __init__(self, host: str = "127.0.0.1", timeout_s: float = 30.0) -> None:
        import torch.distributed as dist

        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        self.host = host
        self.timeout_s = timeout_s
        self._store = dist.TCPStore(
            host,
            0,  # any free port: several jobs may share a machine
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        self.port: int = self._store.port
        self.generation = -1

    def reform(self, world_size: int) -> list[Membership]:
        """The memberships of a new generation of ``world_size`` ranks, in rank order.

        Hand ``memberships[r]`` to the actor that is to be rank ``r`` and have
        every one of them ``join`` it concurrently.
        """
        if world_size < 1:
            raise ValueError(f"a group needs at least one rank, got world_size={world_size}")
        self.generation += 1
        return [
            Membership(self.host, self.port, self.generation, r, world_size, self.timeout_s)
            for r in range(world_size)
        ]


class ElasticGroup:
    """This rank's current collective group; replace it with :meth:`join` after a change.

    ``all_reduce`` is meant for one thread (the trainer's); ``abort`` may be
    called from any other thread.
    """

    def __init__(self) -> None:
        self.membership: Membership | None = None
        self._pg: Any = None
        self._stores: dict[tuple[str, int], Any] = {}  # one store connection per rendezvous
        self._lock = threading.Lock()
        self._wake: threading.Event | None = None  # set when the collective in progress may end
        self._aborted: str | None = None
        self._graveyard: list[Any] = []  # aborted groups: see the module docstring

    @property
    def rank(self) -> int:
        return self._current().rank

    @property
    def world_size(self) -> int:
        return self._current().world_size

    @property
    def generation(self) -> int:
        return self._current().generation

    def join(self, membership: Membership) -> None:
        """Leave the current group (if any) and form ``membership``'s generation.

        Blocks until all ``world_size`` members joined, at most
        ``membership.timeout_s`` (then ``torch.distributed.DistStoreError``).
        """
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=membership.timeout_s)
        key = (membership.host, membership.port)
        store = self._stores.get(key)
        if store is None:
            store = dist.TCPStore(
                membership.host, membership.port, is_master=False, timeout=timeout
            )
            self._stores[key] = store
        prefixed = dist.PrefixStore(membership.prefix, store)
        pg = dist.ProcessGroupGloo(prefixed, membership.rank, membership.world_size, timeout)
        with self._lock:
            if self._pg is not None:
                self._graveyard.append(self._pg)
            self._pg, self.membership, self._aborted = pg, membership, None

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` in place across the group; returns it.

        Raises :class:`GroupAbortedError` when :meth:`abort` is called meanwhile
        (or was called since the last ``join``) or when the collective fails
        (a peer died). The group is then unusable until the next ``join``.
        """
        with self._lock:
            membership, pg = self._current(), self._pg
            if self._aborted is not None:
                raise GroupAbortedError(membership.generation, self._aborted)
            wake = self._wake = threading.Event()
        try:
            work = pg.allreduce([tensor])
            work.get_future().add_done_callback(lambda _: wake.set())
            wake.wait()
            with self._lock:
                if self._aborted is not None:
                    raise GroupAbortedError(membership.generation, self._aborted)
            try:
                work.wait()
            except Exception as e:  # gloo: "Connection closed by peer", a timeout, ...
                self.abort(f"collective failed: {e}")
                raise GroupAbortedError(membership.generation, f"collective failed: {e}") from e
        finally:
            with self._lock:
                self._wake = None
        return tensor

    def abort(self, why: str = "aborted by the owner") -> None:
        """End the collective in progress (and any later one) with :class:`GroupAbortedError`."""
        with self._lock:
            if self._pg is None or self._aborted is not None:
                return
            self._aborted = why
            if self._wake is not None:
                self._wake.set()

    def _current(self) -> Membership:
        if self.membership is None:
            raise RuntimeError("this rank has not joined a group yet: call join(membership)")
        return self.membership
