"""Top-level Monarch names this build does not provide, each raising ``NotImplementedError`` with why.

A script that imports them still imports (``from monarch import OpaqueRef``
works); using one raises at once, saying what to use instead, never a
silent stand-in that would compute something else.
"""

from __future__ import annotations

from typing import Any, NoReturn


def _missing(what: str, why: str) -> NoReturn:
    raise NotImplementedError(f"monarch.{what} is not available in monarch over NATS: {why}")


class _MissingType(type):
    """A class that cannot be made or used: every call or class attribute raises."""

    _why: str

    def __call__(cls, *args: Any, **kwargs: Any) -> NoReturn:
        _missing(cls.__name__, cls._why)

    def __getattr__(cls, attr: str) -> NoReturn:
        if attr.startswith("_"):  # introspection (hasattr, pickle, pytest) sees a plain class
            raise AttributeError(attr)
        _missing(f"{cls.__name__}.{attr}", cls._why)


class OpaqueRef(metaclass=_MissingType):
    """Monarch's handle to a Python object living on the workers; not built here."""

    _why = (
        "objects that live on the procs are actor state here: keep the object in an "
        "Actor and reach it through its endpoints (endpoint.rref(...) for tensors)"
    )


class Selection(metaclass=_MissingType):
    """Monarch's selection algebra over mesh ranks; not built here."""

    _why = (
        "select ranks by slicing the mesh by label instead "
        "(mesh.slice(hosts=0, gpus=slice(0, 2)), mesh.flatten/rename/split)"
    )


def call_on_shard_and_fetch(*args: Any, **kwargs: Any) -> NoReturn:
    """Monarch: run a remote function on one shard and return its Python value; not built."""
    _missing(
        "call_on_shard_and_fetch",
        "remote functions here run on every proc of the mesh and return tensors: use "
        "monarch.fetch_shard(fn(*args), shard) for tensor results, or an actor endpoint's "
        ".call_one() / .slice(...).call() for any Python value from one proc",
    )


def world_mesh(*args: Any, **kwargs: Any) -> NoReturn:
    """Monarch's legacy world mesh over its process supervisor; not built here."""
    _missing(
        "world_mesh",
        "it belongs to Monarch's legacy supervisor-based controller; make the mesh with "
        "this_host().spawn_procs(per_host={'hosts': h, 'gpus': g}) (or attach_to_workers) "
        "and use it with procs.activate()",
    )


_GRADS = (
    "it streams gradients one tensor at a time out of a running backward pass, which this "
    "engine does not split up; call loss.backward() or torch.autograd.grad(...) inside "
    "procs.activate() (autograd runs on the procs)"
)


def grad_generator(*args: Any, **kwargs: Any) -> NoReturn:
    """Monarch's incremental backward (yields gradients as they are ready); not built."""
    _missing("grad_generator", _GRADS)


def grad_function(*args: Any, **kwargs: Any) -> NoReturn:
    """Monarch's helper for grad_generator; not built."""
    _missing("grad_function", _GRADS)


class RemoteProcessGroup(metaclass=_MissingType):
    """Monarch's handle to a torch process group over some mesh dimensions; not built here."""

    _why = (
        "collectives of the tensor engine here are monarch.reduce / reduce_ over mesh "
        "dimensions (or torch.distributed inside an actor, monarch.spmd sets it up)"
    )


_SIMULATOR = (
    "Monarch's simulator of the tensor engine is not built; run the same code on real "
    "procs of this machine (this_host().spawn_procs(per_host={'gpus': n}), CPU tensors)"
)


def Simulator(*args: Any, **kwargs: Any) -> NoReturn:  # noqa: N802 - Monarch's name
    """Monarch's tensor-engine simulator; not built."""
    _missing("Simulator", _SIMULATOR)


def set_meta(*args: Any, **kwargs: Any) -> NoReturn:
    """A setting of Monarch's simulator; not built."""
    _missing("set_meta", _SIMULATOR)


def mast_reserve(*args: Any, **kwargs: Any) -> NoReturn:
    """Monarch's reservation of hosts on Meta's MAST scheduler; not built."""
    _missing(
        "mast_reserve",
        "it reserves hosts on Meta's internal MAST scheduler; get hosts with monarch.job "
        "(SlurmJob, KubernetesJob, ProcessJob) or attach_to_workers",
    )
