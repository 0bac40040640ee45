"""A rank's training state as one flat byte buffer, to copy to a replacement by RDMA.

:class:`StateBuffer` keeps a snapshot of a module's ``state_dict()`` and an
optimizer's state (Adam's moments and step counts, SGD's momentum, ...) in one
contiguous ``uint8`` tensor, registered once as an :class:`~monarch.rdma.RDMABuffer`.
A survivor hands out :meth:`StateBuffer.share` (a small handle plus the
layout: names, dtypes, shapes, offsets); a replacement rank calls
:meth:`StateBuffer.receive`, which reads the bytes one-sidedly into its own
buffer, then :meth:`StateBuffer.restore`. Nothing touches a file system and
the model is never pickled: only the layout (a few numbers per tensor) and the
optimizer's hyperparameters travel as a message.

The same snapshot is the rollback point of a step: a trainer captures it at
the start of each step, so after a failure every survivor can return to it and
the interrupted step can be replayed, bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from monarch.actor import Future
from monarch.rdma import RDMABuffer

if TYPE_CHECKING:
    import torch

_ALIGN = 16  # bytes: every tensor starts aligned, so a uint8 slice can be viewed as its dtype


@dataclass(frozen=True)
class Entry:
    """Where one tensor lives in the flat buffer."""

    name: str  # "model.<key>" or "optim.<param index>.<key>"
    dtype: str  # torch dtype name, e.g. "float32"
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """What a flat state buffer holds: enough to rebuild the state from its bytes."""

    entries: tuple[Entry, ...]
    nbytes: int
    # The optimizer's param_groups (hyperparameters such as lr, betas) and its
    # non-tensor per-parameter values: small, sent as a message.
    param_groups: list[dict[str, Any]] = field(default_factory=list)
    scalars: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SharedState:
    """What a survivor gives a replacement: a handle to its bytes, the layout, and its step."""

    buffer: RDMABuffer
    layout: Layout
    step: int


def _dtype(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a state layout")
    return dtype


def _tensors(module: Any, optimizer: Any) -> tuple[list[tuple[str, Any]], list[dict], dict]:
    """The state's tensors in a fixed order, its param_groups and its non-tensor values."""
    import torch

    out = [(f"model.{k}", v) for k, v in module.state_dict(keep_vars=False).items()]
    groups: list[dict] = []
    scalars: dict[str, Any] = {}
    if optimizer is not None:
        sd = optimizer.state_dict()
        groups = sd["param_groups"]
        for idx in sorted(sd["state"]):
            for key in sorted(sd["state"][idx]):
                value = sd["state"][idx][key]
                name = f"optim.{idx}.{key}"
                if isinstance(value, torch.Tensor):
                    out.append((name, value))
                else:
                    scalars[name] = value
    return out, groups, scalars


class StateBuffer:
    """A flat, RDMA-registered snapshot of ``module`` (and ``optimizer``) state in this process.

    Not thread-safe: one trainer uses it between its steps. ``capture`` and
    ``restore`` copy (no allocation unless the layout changed, e.g. when an
    optimizer creates its state on its first step).
    """

    def __init__(self, module: Any, optimizer: Any = None) -> None:
        self.module = module
        self.optimizer = optimizer
        self.layout: Layout | None = None
        self.flat: torch.Tensor | None = None
        self._rdma: RDMABuffer | None = None

    # -- this process's own state ------------------------------------------------

    def capture(self) -> Layout:
        """Copy the live state into the buffer (the rollback point); returns its layout."""
        tensors, groups, scalars = _tensors(self.module, self.optimizer)
        entries, offset = [], 0
        for name, t in tensors:
            nbytes = t.numel() * t.element_size()
            entries.append(
                Entry(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes)
            )
            offset += math.ceil(nbytes / _ALIGN) * _ALIGN
        layout = Layout(tuple(entries), max(offset, _ALIGN), groups, scalars)
        if self.layout is None or self.layout.entries != layout.entries:
            self._allocate(layout.nbytes)
            # Registered now, off the recovery path: a process's first registration
            # starts its RDMA owner side (a bulk server, a device probe), which takes
            # from 0.2 s to seconds on a loaded machine.
            self._rdma = RDMABuffer(self.flat)
        self.layout = layout
        for entry, (_, t) in zip(layout.entries, tensors):
            self._view(entry).copy_(t.detach())
        return layout

    def restore(self) -> None:
        """Make the live module and optimizer state equal to the buffer's, bit for bit."""
        if self.layout is None or self.flat is None:
            raise RuntimeError("StateBuffer.restore before any capture or receive")
        model: dict[str, Any] = {}
        optim: dict[int, dict[str, Any]] = {}
        for entry in self.layout.entries:
            value = self._view(entry).clone()
            kind, rest = entry.name.split(".", 1)
            if kind == "model":
                model[rest] = value
            else:
                idx, key = rest.split(".", 1)
                optim.setdefault(int(idx), {})[key] = value
        for name, value in self.layout.scalars.items():
            _, idx, key = name.split(".", 2)
            optim.setdefault(int(idx), {})[key] = value
        self.module.load_state_dict(model)
        if self.optimizer is not None:
            groups = [dict(g) for g in self.layout.param_groups]
            self.optimizer.load_state_dict({"state": optim, "param_groups": groups})

    # -- between processes -------------------------------------------------------

    def share(self, step: int) -> SharedState:
        """A handle to the last captured snapshot, for :meth:`receive` in another process."""
        if self.layout is None or self.flat is None:
            raise RuntimeError("StateBuffer.share before any capture")
        if self._rdma is None:
            self._rdma = RDMABuffer(self.flat)  # registered once per allocation
        return SharedState(self._rdma, self.layout, step)

    def receive(self, shared: SharedState) -> Future[None]:
        """Read a survivor's snapshot into this buffer (one-sided); then call :meth:`restore`.

        Returns the transfer's future (``await`` it in an async endpoint,
        ``.get()`` elsewhere). Raises ``OwnerGoneError`` through it if the
        survivor died meanwhile.
        """
        if self.layout is None or self.layout.entries != shared.layout.entries:
            self._allocate(shared.layout.nbytes)
        self.layout = shared.layout
        assert self.flat is not None
        return shared.buffer.read_into(self.flat)

    def _allocate(self, nbytes: int) -> None:
        import torch

        if self._rdma is not None:
            self._rdma.drop()  # the old handle's holders get BufferDroppedError
            self._rdma = None
        self.flat = torch.zeros(nbytes, dtype=torch.uint8)

    def _view(self, entry: Entry) -> torch.Tensor:
        assert self.flat is not None
        raw = self.flat[entry.offset : entry.offset + entry.nbytes]
        return raw.view(_dtype(entry.dtype)).view(entry.shape)
