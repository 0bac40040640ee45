"""``procs.activate()`` and ``monarch.no_mesh``: which proc mesh torch calls run on.

Inside ``with procs.activate():`` a ``TorchFunctionMode`` is active on the
calling thread: torch factory functions (``torch.zeros``, ``torch.randn``,
``torch.tensor(data)``...) make :class:`monarch.Tensor` handles on ``procs``,
and operations on handles run on the handles' procs. Operations on handles
are intercepted outside ``activate()`` too (by the handle class itself); the
mode is what makes *new* tensors remote. Other torch calls on plain local
values run locally as usual.

``with monarch.no_mesh.activate():`` steps out: factory functions make local
tensors again (handles still run remotely). The active mesh is per thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

from monarch.tensors.controller import controller_for
from monarch.tensors.dispatch import CONSTRUCTORS, dispatch, dispatch_factory
from monarch.tensors.tensor import Tensor

if TYPE_CHECKING:
    from monarch.actors.procs.proc_mesh import ProcMesh

_tls = threading.local()


def _stack() -> list:
    stack = getattr(_tls, "stack", None)
    if stack is None:
        stack = _tls.stack = []
    return stack


def active_mesh() -> ProcMesh | None:
    """The mesh of the innermost ``activate()`` on this thread (None: none, or ``no_mesh``)."""
    stack = _stack()
    return stack[-1] if stack else None


def get_active_mesh() -> ProcMesh:
    """Like Monarch's: the active mesh, or ``ValueError`` when there is none."""
    mesh = active_mesh()
    if mesh is None:
        raise ValueError("no proc mesh is active: use `with procs.activate():`")
    return mesh


class _Mode(TorchFunctionMode):
    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if getattr(_tls, "passthrough", 0):
            return func(*args, **kwargs)
        for t in types:
            if issubclass(t, Tensor):
                return dispatch(func, args, kwargs)
        mesh = active_mesh()
        if mesh is not None and func in CONSTRUCTORS:
            return dispatch_factory(mesh, func, args, kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def _activate(mesh: ProcMesh | None) -> Iterator[None]:
    if mesh is not None:
        controller_for(mesh)  # spawn the workers now, while the user expects to wait
    stack = _stack()
    stack.append(mesh)
    try:
        with _Mode():
            yield
    finally:
        stack.pop()


def activate(mesh: ProcMesh) -> contextlib.AbstractContextManager[None]:
    """``with procs.activate():`` see the module docstring."""
    return _activate(mesh)


class _NoMesh:
    """``with monarch.no_mesh.activate():`` local torch inside an active mesh."""

    def activate(self) -> contextlib.AbstractContextManager[None]:
        return _activate(None)

    def __repr__(self) -> str:
        return "monarch.no_mesh"


no_mesh = _NoMesh()


@contextlib.contextmanager
def meta_trial() -> Iterator[None]:
    """Run user code on meta tensors here: torch calls are plain, factories make meta tensors."""
    _tls.passthrough = getattr(_tls, "passthrough", 0) + 1
    try:
        with torch.device("meta"):
            yield
    finally:
        _tls.passthrough -= 1
