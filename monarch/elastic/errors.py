"""The exceptions of :mod:`monarch.elastic`, in one place.

Each says which rank or group it concerns and what a trainer can do about it.
"""

from __future__ import annotations


class ElasticError(RuntimeError):
    """Base class of the errors raised by :mod:`monarch.elastic`."""


class RespawnError(ElasticError):
    """A replacement for ``rank`` could not be started (its cause is chained)."""

    def __init__(self, mesh: str, rank: int, why: str) -> None:
        super().__init__(f"could not respawn rank {rank} of {mesh!r}: {why}")
        self.mesh = mesh
        self.rank = rank
        self.why = why

    def __reduce__(self):  # travels back to a caller (pickled): rebuild from the same arguments
        return (type(self), (self.mesh, self.rank, self.why))


class NoCapacityError(RespawnError):
    """No proc is available for a replacement rank (``spare_procs`` used up, or the host refused).

    A trainer may continue on the remaining ranks (:meth:`RankedMesh.drop`
    and a smaller group) or stop with this error.
    """


class GroupAbortedError(ElasticError):
    """A collective of generation ``generation`` ended without a result.

    Raised in a rank when its group was aborted (a member failed, the owner
    called ``abort``) or the collective itself failed (a peer's socket closed).
    The group cannot be used again: join a new one.
    """

    def __init__(self, generation: int, why: str) -> None:
        super().__init__(f"collective group generation {generation} aborted: {why}")
        self.generation = generation
        self.why = why

    def __reduce__(self):
        return (type(self), (self.generation, self.why))
