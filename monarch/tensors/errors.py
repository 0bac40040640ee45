"""Exceptions of the tensor engine.

An operation that fails on a proc does not raise there (nobody waits for a
fire-and-forget op): its results are *poisoned*, every op computed from them
is poisoned too, and the error surfaces as :class:`RemoteTensorError` where a
value is asked for (``fetch_shard``, ``inspect``, ``full_tensor``), naming the
operation that failed and the rank it failed on.
"""

from __future__ import annotations


class RemoteTensorError(RuntimeError):
    """A remote tensor operation failed on a proc; the tensor asked for depends on it.

    ``op`` names the failed operation (``torch.matmul``, a remote function's
    qualified name, ``Tensor.reduce(...)``), ``rank`` is the proc's rank in its
    proc mesh, ``traceback`` the remote traceback as text.
    """

    def __init__(self, message: str, *, op: str = "", rank: int | None = None, traceback: str = ""):
        super().__init__(message)
        self.op = op
        self.rank = rank
        self.traceback = traceback

    def __reduce__(self) -> tuple:
        return (_rebuild, (str(self), self.op, self.rank, self.traceback))


def _rebuild(message: str, op: str, rank: int | None, traceback: str) -> RemoteTensorError:
    return RemoteTensorError(message, op=op, rank=rank, traceback=traceback)


class MeshError(ValueError):
    """Tensors used together that cannot be: on different meshes, a local tensor mixed with
    remote ones, or a dropped handle.

    Not a ``TypeError`` on purpose: torch turns a ``TypeError`` raised inside an
    operator (``a + b``) into ``NotImplemented``, which would hide this message.
    """


class Poison:
    """What a proc keeps under a tensor's reference when computing it failed."""

    __slots__ = ("error",)

    def __init__(self, error: RemoteTensorError) -> None:
        self.error = error
