"""The proc side of the tensor engine: a proc's local tensors and how ops run on them.

:class:`Executor` keeps ``env``: reference id -> local tensor (or
:class:`Poison`). The :class:`~monarch.tensors.worker.TensorWorker` actor
owns one and calls it from its endpoints, on the actor's own thread.

``run(batch)`` executes a batch of op entries (see :mod:`controller`) in
order. It never raises: a broadcast has no caller to receive an exception, so
a failing op poisons its results instead (and, if it has none, the tensors it
was given, which it may have half-mutated), and the error waits for whoever
fetches them. Anything that reads a poisoned reference is poisoned with the
same error, so the operation that actually failed is the one reported.
"""

from __future__ import annotations

import asyncio
import functools
import inspect as pyinspect
import logging
import time
import traceback
from typing import Any

import torch

from monarch.actors.hosting.server import local_server
from monarch.broker.bodies.codec import loads
from monarch.core.process_runtime import runtime
from monarch.tensors import collectives, config, moving, tree
from monarch.tensors.errors import Poison, RemoteTensorError
from monarch.tensors.wire import Ref, resolve_func

log = logging.getLogger(__name__)


class _Poisoned(Exception):
    def __init__(self, error: RemoteTensorError) -> None:
        self.error = error


def _failing(exc: BaseException) -> Any:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return fail


class Executor:
    """This proc's local tensors, and the ops the client sends, run in order."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.env: dict[int, Any] = {}
        self.funcs: dict[int, tuple[Any, str]] = {}
        self.groups = collectives.Groups(self.rank, self.world_size)
        self.inbox = moving.Inbox(runtime())

    # -- the op stream ---------------------------------------------------------------

    def run(self, batch: list) -> None:
        """Execute encoded op entries in order; never raises (see the module docstring)."""
        for body in batch:
            try:
                entry = loads(body)
                getattr(self, "_do_" + entry[0])(*entry[1:])
            except Exception:
                log.exception("tensor engine: internal error on rank %d", self.rank)

    def _do_def(self, fid: int, kind: str, payload: Any, name: str) -> None:
        try:
            fn = resolve_func(kind, payload)
        except Exception as e:  # ops using it are poisoned with this error
            fn = _failing(e)
        self.funcs[fid] = (fn, name)

    def _do_del(self, refs: list[int]) -> None:
        for r in refs:
            self.env.pop(r, None)

    def _do_put(self, ref: int, value: Any, device: str = "cpu") -> None:
        """A tensor sent by value (distribute): it arrives on CPU; put it where the handle says."""
        try:
            self.env[ref] = value if str(value.device) == device else value.to(device)
        except Exception as e:
            self.poison(ref, self.error("distribute", e))

    def _do_alias(self, src: int, dst: int) -> None:
        value = self.env.get(src)
        if value is None:
            value = Poison(self.error("alias", "its source tensor is not on this proc"))
        self.env[dst] = value

    def _do_op(
        self, fid: int, args: Any, kwargs: Any, results: Any, grad: bool, expect: Any = None
    ) -> None:
        fn, name = self.funcs[fid]
        self.execute(name, fn, args, kwargs, results, grad, expect)

    def _do_actor(
        self,
        uid: str,
        method: str,
        name: str,
        args: Any,
        kwargs: Any,
        results: Any,
        grad: bool,
        expect: Any,
    ) -> None:
        def call(*a: Any, **k: Any) -> Any:
            return _call_actor(uid, method, a, k)

        self.execute(name, call, args, kwargs, results, grad, expect)

    def _do_unpack(self, whole: int, results: list[int], expect: Any, name: str) -> None:
        """Split a result kept whole (round-trip propagation) into one ref per tensor."""
        value = self.env.pop(whole, None)
        if isinstance(value, Poison):
            self.poison(results, value.error)
            return
        self.store(name, value, results, expect)

    def _do_reduce(self, *args: Any) -> None:
        collectives.run_reduce(self, *args)

    def _do_world(self, host: str, port: int, backend: str) -> None:
        try:
            self.groups.init_world(host, port, backend)
        except Exception as e:  # every later collective here is poisoned with this error
            self.groups.error = self.error(f"joining the {backend} world", e)

    def _do_move_out(self, src: int, xfer: str, plan: dict) -> None:
        moving.move_out(self, src, xfer, plan)

    def _do_move_in(self, dst: int, xfer: str, aliases: dict, expect: Any) -> None:
        moving.move_in(self, dst, xfer, aliases, expect)

    # -- running one op -----------------------------------------------------------------

    def execute(
        self, name: str, fn: Any, args: Any, kwargs: Any, results: Any, grad: bool, expect: Any
    ) -> None:
        used: list[int] = []
        try:
            a = self.resolve(args, used)
            k = self.resolve(kwargs, used)
        except _Poisoned as p:
            self.poison(results if results else used, p.error)
            return
        try:
            with torch.set_grad_enabled(grad):
                out = fn(*a, **k)
        except Exception as e:
            self.poison(results if results else used, self.error(name, e))
            return
        if isinstance(results, int):  # the client learns the structure by a round trip
            self.env[results] = out
            return
        self.store(name, out, results, expect)

    def store(self, name: str, out: Any, results: list[int], expect: Any) -> None:
        tensors = tree.tensor_leaves(out)
        problem = None
        if len(tensors) != len(results):
            problem = f"returned {len(tensors)} tensors where the client expected {len(results)}"
        elif expect is not None:
            for t, (shape, dtype) in zip(tensors, expect):
                if list(t.shape) != shape or str(t.dtype) != dtype:
                    problem = (
                        f"returned a tensor of shape {list(t.shape)} and {t.dtype} where its "
                        f"propagation said shape {shape} and {dtype}"
                    )
                    break
        if problem is not None:
            self.poison(results, self.error(name, problem))
            return
        for r, t in zip(results, tensors):
            self.env[r] = t

    def resolve(self, obj: Any, used: list[int]) -> Any:
        t = type(obj)
        if t is Ref:
            value = self.env.get(obj.id)
            if isinstance(value, Poison):
                raise _Poisoned(value.error)
            if value is None:
                raise _Poisoned(self.error("an op", f"tensor ref {obj.id} is not on this proc"))
            used.append(obj.id)
            return value
        if t is tuple or t is list:
            return t(self.resolve(v, used) for v in obj)
        if t is dict:
            return {k: self.resolve(v, used) for k, v in obj.items()}
        if t is slice:
            return slice(*(self.resolve(v, used) for v in (obj.start, obj.stop, obj.step)))
        return obj

    def poison(self, refs: Any, error: RemoteTensorError) -> None:
        log.debug("tensor engine: %s", error)
        for r in [refs] if isinstance(refs, int) else refs:
            self.env[r] = Poison(error)

    def error(self, name: str, problem: Any) -> RemoteTensorError:
        if isinstance(problem, BaseException):
            text = f"{type(problem).__name__}: {problem}"
            tb = "".join(traceback.format_exception(problem))
        else:
            text, tb = str(problem), ""
        return RemoteTensorError(
            f"{name} failed on rank {self.rank}: {text}", op=name, rank=self.rank, traceback=tb
        )

    # -- calls (each ordered after everything sent before it) ---------------------------

    def fetch(self, refs: list[int]) -> tuple:
        values = []
        for r in refs:
            value = self.env.get(r)
            if isinstance(value, Poison):
                return ("err", _error_fields(value.error))
            if value is None:
                err = self.error("fetch", f"tensor ref {r} is not on this proc")
                return ("err", _error_fields(err))
            values.append(value)
        return ("ok", values)

    def describe(self, ref: int) -> tuple:
        """The structure of a remote call's result (round-trip propagation)."""
        value = self.env.get(ref)
        if isinstance(value, Poison):
            return ("err", _error_fields(value.error))
        leaves, spec = tree.flatten(value)
        descs = [
            ("T", list(v.shape), str(v.dtype), v.requires_grad, str(v.device))
            if isinstance(v, torch.Tensor)
            else ("V", v)
            for v in leaves
        ]
        return ("ok", descs, spec)

    def stats(self) -> dict:
        """What this worker holds: refs, distinct storage bytes, poisoned refs."""
        seen: set[int] = set()
        nbytes = poisoned = 0
        for v in self.env.values():
            if isinstance(v, Poison):
                poisoned += 1
            elif isinstance(v, torch.Tensor):
                storage = v.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    nbytes += storage.nbytes()
        return {"refs": len(self.env), "bytes": nbytes, "poisoned": poisoned}

    def close(self) -> None:
        self.env.clear()
        self.inbox.close()
        self.groups.close()


def _error_fields(e: RemoteTensorError) -> list:
    return [str(e), e.op, e.rank, e.traceback]


def _call_actor(uid: str, method: str, args: tuple, kwargs: dict) -> Any:
    """Call an endpoint of the actor of mesh ``uid`` in this proc, in that actor's turn."""
    rt = runtime()
    deadline = time.monotonic() + config.timeout()
    inst = local_server(rt).actors.get(uid)
    while inst is None or inst.obj is None:  # the actor may still be starting
        if time.monotonic() > deadline:
            raise LookupError(f"no actor of actor mesh {uid} on this proc")
        time.sleep(0.01)
        inst = local_server(rt).actors.get(uid)
    bound = functools.partial(getattr(inst.obj, method), *args, **kwargs)

    async def turn() -> Any:
        result = await inst.call_on_actor(bound)
        if pyinspect.isawaitable(result):
            result = await result
        return result

    return asyncio.run_coroutine_threadsafe(turn(), rt.loop).result(config.timeout())
