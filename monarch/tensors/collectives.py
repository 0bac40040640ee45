"""Collectives: ``Tensor.reduce`` across mesh dimensions, on ``torch.distributed``.

Client side, :func:`reduce` works out the result's metadata, the groups (the
procs that agree on every mesh dimension *not* reduced, in the order of the
reduced dimensions as given) and sends one ``reduce`` op down the op stream.

Proc side, the workers of a proc mesh form one ``torch.distributed`` world
(gloo; gloo for CPU tensors plus NCCL for CUDA tensors where CUDA is present),
whose rendezvous goes through the broker (see ``Controller.ensure_world``).
A process group per set of member ranks is created the first time a worker
needs it, by the members only (``use_local_synchronization``), and reused.
Every member of a group gets the same ops in the same order, so groups and
collectives line up without further coordination.

A poisoned input must not hang its peers: each reduce first all-reduces a
one-element flag (MAX of the ranks whose input is bad). If any is bad, every
member poisons its result and skips the data collective.

Backend gaps are bridged the portable way: ``avg`` is a sum then a division,
``scatter`` is an all-reduce whose result is split (gloo has no
reduce_scatter), ``stack`` is ``all_gather``, and ``stack`` with scatter is
``all_to_all_single``.
"""

from __future__ import annotations

import datetime
import math
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from monarch.actors.meshes.mesh_ops import view_of
from monarch.core.process_runtime import runtime
from monarch.tensors import config
from monarch.tensors.controller import controller_for
from monarch.tensors.errors import Poison, RemoteTensorError
from monarch.tensors.moving import keep_on
from monarch.tensors.tensor import Tensor, meta_empty

if TYPE_CHECKING:
    from monarch.actors.procs.proc_mesh import ProcMesh

REDUCTIONS = ("sum", "avg", "max", "min", "product", "stack")
_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "product": dist.ReduceOp.PRODUCT,
}


# -- client side ---------------------------------------------------------------------


def reduce(
    t: Tensor,
    dims: str | Sequence[str],
    reduction: str = "sum",
    scatter: bool = False,
    mesh: ProcMesh | None = None,
    inplace: bool = False,
) -> Tensor:
    """Reduce ``t`` across the mesh dimensions ``dims`` (a name or several; empty: all).

    ``sum``/``avg``/``max``/``min``/``product`` all-reduce: every proc of a group
    gets the reduction of the group's tensors (same shape). ``stack``
    all-gathers: a new leading dimension of size N (the group's size), ordered
    by the reduced dimensions' coordinates, in the order ``dims`` gives them.
    ``scatter=True`` needs a leading dimension of size N and gives proc i part
    i: a reduce-scatter (``result = reduced[i]``) or, with ``stack``, an
    all-to-all (``result[j]`` is part i of proc j's tensor). ``mesh``, a slice
    of ``t``'s mesh, keeps the result only there. The result never requires
    grad (collectives are not differentiated). Ordered with all other ops;
    does not block.
    """
    if not isinstance(t, Tensor):
        raise TypeError(f"reduce() takes a monarch.Tensor, not {type(t).__name__}")
    view = view_of(t._mesh)
    labels = view.extent.labels
    dims = (dims,) if isinstance(dims, str) else tuple(dims)
    if not dims:
        dims = tuple(labels)
    for d in dims:
        if d not in labels:
            raise KeyError(f"dimension {d!r} not in the tensor's mesh {view.extent!r}")
    if len(set(dims)) != len(dims):
        raise ValueError(f"reducing the same dimension twice: {dims}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction {reduction!r} not supported; use one of {REDUCTIONS}")
    n = math.prod(view.extent[d] for d in dims)
    meta = t._meta
    if scatter and (meta.dim() == 0 or meta.shape[0] != n):
        raise TypeError(
            f"scatter=True splits the result's leading dimension across {dims} ({n} procs), but "
            f"the tensor has shape {list(meta.shape)}"
        )
    if inplace and scatter and reduction != "stack":
        raise ValueError("an in-place reduce with scatter would change the tensor's shape")
    shape = list(meta.shape)
    if reduction == "stack" and not scatter:
        shape = [n, *shape]
    elif scatter and reduction != "stack":
        shape = shape[1:]
    ctl = controller_for(t._mesh)
    ctl.check_alive()
    groups = _groups(view, dims)
    if any(len(g) > 1 for g in groups):
        ctl.ensure_world()
    name = f"Tensor.reduce({list(dims)}, {reduction!r}{', scatter=True' if scatter else ''})"
    if inplace:
        out = t
    else:
        out_meta = meta_empty(shape, meta.dtype)
        out = Tensor(out_meta, t._mesh, ctl, ctl.new_ref(), t._device)
    entry = ("reduce", t._ref, out._ref, groups, reduction, scatter, name, list(meta.shape))
    ctl.send(view, (*entry, str(meta.dtype)))
    if mesh is not None:
        return keep_on(out, mesh)
    return out


def _groups(view: Any, dims: tuple[str, ...]) -> list[list[int]]:
    """Base ranks of each group, in stacking order (row-major over ``dims`` as given)."""
    extent = view.extent
    labels = extent.labels
    groups: dict[tuple, dict[int, int]] = {}
    for i, base_rank in enumerate(view.ranks):
        coords = dict(zip(labels, extent.coords(i)))
        key = tuple(coords[d] for d in labels if d not in dims)
        pos = 0
        for d in dims:
            pos = pos * extent[d] + coords[d]
        groups.setdefault(key, {})[pos] = base_rank
    return [[g[p] for p in sorted(g)] for g in groups.values()]


# -- proc side -------------------------------------------------------------------------


def reachable_host() -> str:
    """An address of this machine that the other procs can reach (the broker's side of it)."""
    override = config.store_host()
    if override:
        return override

    # Any server of the list will do; one that is down may no longer resolve.
    for url in (runtime().nats_url or "").split(","):
        parsed = urlparse(url.strip())
        host = parsed.hostname or "127.0.0.1"
        if host in ("localhost", "::1") or host.startswith("127."):
            return "127.0.0.1"
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((host, parsed.port or 4222))  # no packet is sent: this picks a route
                return s.getsockname()[0]
        except OSError:
            continue
    return socket.gethostbyname(socket.gethostname())


def usable_backend(backend: str) -> str:
    """``backend`` less its NCCL part where this proc cannot run NCCL.

    Rank 0 picks the backend for the whole world, but a proc of the same mesh
    may see no GPU (a ``gpus`` coordinate past the machine's GPUs, an empty
    ``CUDA_VISIBLE_DEVICES``) or have a torch without NCCL; torch refuses to
    make an NCCL process group there, so that proc would never join and its
    peers would wait in every collective until the timeout. It holds no CUDA
    tensors, so it joins with the CPU backends alone: gloo's part of the world
    is the same on every rank, and only the procs with a GPU reduce CUDA tensors.
    """
    parts = [p.strip() for p in backend.split(",")]
    if not any(p.endswith("nccl") for p in parts):
        return backend
    if torch.cuda.is_available() and dist.is_nccl_available():
        return backend
    cpu = [p for p in parts if not p.endswith("nccl")]
    return ",".join(cpu) if cpu else "gloo"


class Groups:
    """This proc's membership of the world and of the process groups it has needed."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.store: Any = None
        self.backend = ""
        self.error: RemoteTensorError | None = None  # joining the world failed
        self._pgs: dict[tuple[int, ...], Any] = {}

    def _timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=config.timeout())

    def serve_store(self) -> tuple[str, int, str]:
        """Rank 0: open the rendezvous store; (host, port, backend) for the others."""
        host = reachable_host()
        if self.store is None:
            self.store = dist.TCPStore(
                host, 0, self.world_size, True, timeout=self._timeout(), wait_for_workers=False
            )
        backend = config.backend() or (
            "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        )
        return host, self.store.port, backend

    def init_world(self, host: str, port: int, backend: str) -> None:
        if dist.is_initialized():
            return
        backend = usable_backend(backend)
        store = self.store
        if store is None:
            store = self.store = dist.TCPStore(
                host, port, self.world_size, False, timeout=self._timeout()
            )
        dist.init_process_group(
            backend,
            store=store,
            rank=self.rank,
            world_size=self.world_size,
            timeout=self._timeout(),
        )
        self.backend = backend

    def group(self, members: Sequence[int]) -> Any:
        key = tuple(sorted(members))
        if len(key) == self.world_size:
            return None  # the default group
        pg = self._pgs.get(key)
        if pg is None:
            pg = self._pgs[key] = dist.new_group(list(key), use_local_synchronization=True)
        return pg

    def close(self) -> None:
        if dist.is_available() and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def run_reduce(
    worker: Any,
    src: int,
    dst: int,
    groups: list[list[int]],
    reduction: str,
    scatter: bool,
    name: str,
    shape: list[int],
    dtype: str,
) -> None:
    """One worker's part of a reduce (see the module docstring for the protocol)."""
    me = worker.rank
    order = next((g for g in groups if me in g), None)
    if order is None:
        return
    value = worker.env.get(src)
    err: RemoteTensorError | None = None
    if worker.groups.error is not None:
        worker.poison(dst, worker.groups.error)
        return
    if isinstance(value, Poison):
        err = value.error
    elif value is None:
        err = worker.error(name, "its input is not on this proc")
    elif list(value.shape) != shape or str(value.dtype) != dtype:
        err = worker.error(
            name, f"its input has shape {list(value.shape)} and {value.dtype}, not {shape} {dtype}"
        )
    pg = None
    if len(order) > 1:
        try:
            pg = worker.groups.group(order)
            flag = torch.tensor([me + 1 if err is not None else 0], dtype=torch.int64)
            dist.all_reduce(flag, dist.ReduceOp.MAX, group=pg)
        except Exception as e:
            worker.poison(dst, worker.error(name, e))
            return
        bad = int(flag.item()) - 1
        if bad >= 0 and err is None:
            err = worker.error(name, f"its input on rank {bad} is poisoned")
    if err is not None:
        worker.poison(dst, err)
        return
    try:
        out = _compute(value, order, me, reduction, scatter, pg, inplace=dst == src)
    except Exception as e:
        worker.poison(dst, worker.error(name, e))
        return
    if dst != src:
        worker.env[dst] = out
    elif out is not value:
        with torch.no_grad():
            value.copy_(out)


def _compute(
    x: torch.Tensor,
    order: list[int],
    me: int,
    reduction: str,
    scatter: bool,
    pg: Any,
    inplace: bool = False,
) -> torch.Tensor:
    """The result of one member; with ``inplace``, may reduce ``x`` itself and return it."""
    n = len(order)
    original = x
    x = x.detach()
    pos = order.index(me)
    if n == 1:
        if reduction == "stack":
            return x.clone() if scatter else x.unsqueeze(0).clone()
        return x[0].clone() if scatter else x.clone()
    ranked = sorted(order)  # group rank k is ranked[k]
    gpos = [ranked.index(r) for r in order]  # stacking position -> group rank
    if reduction == "stack":
        if scatter:  # all-to-all: send part j to order[j]; result[j] comes from order[j]
            send = torch.empty_like(x, memory_format=torch.contiguous_format)
            for j in range(n):
                send[gpos[j]] = x[j]
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv, send, group=pg)
            return recv[gpos]
        parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(n)]
        dist.all_gather(parts, x.contiguous(), group=pg)
        return torch.stack([parts[g] for g in gpos])
    if inplace and not scatter and x.is_contiguous():
        y = x  # reduce the local tensor itself: no copy (reduce_)
    else:
        y = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(y, _OPS[reduction], group=pg)
    if reduction == "avg":
        if y.is_floating_point() or y.is_complex():
            y.div_(n)
        else:
            y = torch.div(y, n, rounding_mode="floor")
    if y is x:
        return original
    return y[pos].clone() if scatter else y
