"""Moving tensors between meshes: ``slice_mesh``, ``to_mesh``.

``t.slice_mesh(gpus=0)`` names the shards of ``t`` on part of its mesh;
``.to_mesh(other)`` copies them onto ``other``, whose dimensions must include
the slice's (same sizes); dimensions ``other`` has in addition are broadcast
(each source shard goes to every proc along them).

The copy goes worker to worker, over the broker (bulk bytes out of band, as
for any big message): the source workers get a ``move_out`` op and publish
their tensor to the destinations' inbox ports; the destination workers get a
``move_in`` op and wait for it. A send never blocks, and both ops are queued
in the client's single order, so transfers cannot deadlock with each other or
with collectives. A proc that is both source and destination (same proc mesh,
same rank) just aliases its tensor. Correct ordering matters more than speed
here: every transfer is a fresh copy through the broker.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any

from monarch.actors.meshes.mesh_ops import state_of, view_of
from monarch.broker.vocabulary import headers as hdr
from monarch.core.process_runtime import runtime
from monarch.core.runtime import Runtime
from monarch.rdma.bulk import decode_body, encode_body
from monarch.tensors import config, tree
from monarch.tensors.controller import controller_for
from monarch.tensors.errors import MeshError, Poison, RemoteTensorError
from monarch.tensors.tensor import Tensor, meta_like

if TYPE_CHECKING:
    from monarch.actors.procs.proc_mesh import ProcMesh

_XFER = hdr.XFER
_xfer_ids = itertools.count(1)


class MeshSliceTensor:
    """The shards of a tensor on a slice of its mesh; ``to_mesh`` moves them."""

    def __init__(self, tensor: Tensor, mesh: ProcMesh) -> None:
        self.tensor = tensor
        self.mesh = mesh

    def __repr__(self) -> str:
        return f"MeshSliceTensor({self.tensor._describe()}, {view_of(self.mesh).extent!r})"

    def to_mesh(self, mesh: ProcMesh) -> Tensor:
        """A copy on ``mesh`` (ordered with all other ops; does not block)."""
        t, src = self.tensor, view_of(self.mesh)
        dst = view_of(mesh)
        if t._ref is None:
            raise MeshError(f"{t._describe()} was dropped (t.drop()) and cannot be used")
        s_labels, d_labels = src.extent.labels, dst.extent.labels
        missing = [d for d in s_labels if d not in d_labels]
        if missing:
            raise ValueError(
                f"destination mesh {dst.extent!r} lacks dimensions {missing} of the source "
                f"{src.extent!r}: slice them away first (t.slice_mesh({missing[0]}=0))"
            )
        for d in s_labels:
            if src.extent[d] != dst.extent[d]:
                raise ValueError(
                    f"dimension {d!r} has size {src.extent[d]} in the source but "
                    f"{dst.extent[d]} in the destination mesh"
                )
        src_ctl, dst_ctl = controller_for(t._mesh), controller_for(mesh)
        src_ctl.check_alive()
        dst_ctl.check_alive()
        same = src_ctl is dst_ctl
        sends: dict[int, list[int]] = {}  # source base rank -> destination base ranks
        aliases: dict[int, int | None] = {}  # destination rank -> source ref to alias, or None
        for j, dst_rank in enumerate(dst.ranks):
            coords = dict(zip(d_labels, dst.extent.coords(j)))
            src_rank = src.ranks[src.extent.rank_of([coords[d] for d in s_labels])]
            if same and src_rank == dst_rank:
                aliases[dst_rank] = t._ref
            else:
                aliases[dst_rank] = None
                sends.setdefault(src_rank, []).append(dst_rank)
        xfer = f"{src_ctl.rt.proc_uid}.{next(_xfer_ids)}"
        out = Tensor(meta_like(t._meta), mesh, dst_ctl, dst_ctl.new_ref(), t._device)
        if sends:
            inboxes = dst_ctl.inboxes()
            plan = {r: [inboxes[d] for d in ds] for r, ds in sends.items()}
            src_ctl.send(src, ("move_out", t._ref, xfer, plan))
        expect = [list(t._meta.shape), str(t._meta.dtype), str(t._device)]
        dst_ctl.send(dst, ("move_in", out._ref, xfer, aliases, expect))
        return out


def to_mesh(tensors: Any, mesh: ProcMesh) -> Any:
    """Copy every ``monarch.Tensor`` (or ``MeshSliceTensor``) in ``tensors`` onto ``mesh``."""
    leaves, spec = tree.flatten(tensors)
    moved = [v.to_mesh(mesh) if isinstance(v, (Tensor, MeshSliceTensor)) else v for v in leaves]
    return tree.unflatten(moved, spec)


def slice_mesh(tensors: Any, **coords: int | slice) -> Any:
    """``t.slice_mesh(**coords)`` for every ``monarch.Tensor`` in ``tensors``."""
    leaves, spec = tree.flatten(tensors)
    return tree.unflatten(
        [v.slice_mesh(**coords) if isinstance(v, Tensor) else v for v in leaves], spec
    )


def keep_on(t: Tensor, mesh: ProcMesh) -> Tensor:
    """``t``'s shards on ``mesh``, a slice of its mesh (the other procs drop theirs)."""
    view = view_of(t._mesh)
    if state_of(mesh) is not state_of(t._mesh) or not set(view_of(mesh).ranks) <= set(view.ranks):
        raise ValueError(f"mesh= must be a slice of the tensor's mesh {view.extent!r}")
    ctl = controller_for(mesh)
    out = Tensor(meta_like(t._meta), mesh, ctl, ctl.new_ref(), t._device)
    ctl.send(view_of(mesh), ("alias", t._ref, out._ref))
    return out


# -- proc side ---------------------------------------------------------------------


class Inbox:
    """Where tensors sent by other workers wait until their ``move_in`` op runs."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._cond = threading.Condition()
        self._arrived: dict[str, Any] = {}
        self._port_id, self.subject = rt.open_port(self._on_msg)

    def _on_msg(self, msg: Any) -> None:  # on the loop
        xfer = (msg.headers or {}).get(_XFER)
        if xfer is None:
            return
        with self._cond:
            self._arrived[xfer] = msg.data
            self._cond.notify_all()

    def take(self, xfer: str, timeout: float) -> Any:
        with self._cond:
            if not self._cond.wait_for(lambda: xfer in self._arrived, timeout):
                raise TimeoutError(f"no tensor arrived for transfer {xfer} in {timeout:.0f} s")
            return self._arrived.pop(xfer)

    def close(self) -> None:
        self._rt.call_soon(self._rt.close_port, self._port_id)


def move_out(worker: Any, src: int, xfer: str, plan: dict) -> None:
    """Publish this proc's shard to its destinations' inboxes (never blocks on them)."""
    subjects = plan.get(worker.rank)
    if not subjects:
        return
    value = worker.env.get(src)
    if isinstance(value, Poison):
        payload: Any = ("err", [str(value.error), value.error.op, value.error.rank, ""])
    elif value is None:
        err = worker.error("to_mesh", "its source tensor is not on this proc")
        payload = ("err", [str(err), err.op, err.rank, ""])
    else:
        payload = ("ok", value)
    body = encode_body(payload, readers=len(subjects))
    rt = runtime()
    for subject in subjects:
        rt.call_soon(rt.publish, subject, body, {_XFER: xfer})


def move_in(worker: Any, dst: int, xfer: str, aliases: dict, expect: list) -> None:
    """Take this proc's copy: an alias of a local tensor, or what a source worker sent."""
    src_ref = aliases.get(worker.rank)
    if src_ref is not None:
        worker._do_alias(src_ref, dst)
        return
    try:
        status, value = decode_body(worker.inbox.take(xfer, config.timeout()))
    except Exception as e:
        worker.poison(dst, worker.error("to_mesh", e))
        return
    if status == "err":
        message, op, rank, tb = value
        worker.poison(dst, RemoteTensorError(message, op=op, rank=rank, traceback=tb))
        return
    shape, dtype, device = expect
    if list(value.shape) != shape or str(value.dtype) != dtype:
        worker.poison(dst, worker.error("to_mesh", f"received shape {list(value.shape)}"))
        return
    try:  # tensors travel through the broker on CPU
        worker.env[dst] = value if str(value.device) == device else value.to(device)
    except Exception as e:
        worker.poison(dst, worker.error("to_mesh", e))
