"""``TensorWorker``: the actor that runs the tensor engine on each proc.

One per proc of a proc mesh, spawned by the client's controller on first use.
Its endpoints are sync, so it runs on a thread of its own and may block in a
collective or while waiting for a tensor from another proc without stalling
the proc's event loop. This module does not import torch: procs import actor
classes on their event loop, and importing torch takes long enough there to
miss heartbeats, so torch is imported in ``__init__``, on the actor's thread
(see :mod:`monarch.tensors.executor` for the work itself).
"""

from __future__ import annotations

import math
from typing import Any

from monarch.actors.calls.actor import Actor
from monarch.actors.calls.context import Context, context, current_rank, current_size, set_context
from monarch.actors.calls.endpoint import endpoint


class TensorWorker(Actor):
    """Holds this proc's local tensors and runs the client's ops, in order."""

    def __init__(self) -> None:
        # Imported when a worker starts: the executor imports the whole engine, which imports this module.
        from monarch.tensors.executor import Executor

        self._x = Executor(current_rank().rank, math.prod(current_size().values()))

    @endpoint
    def run(self, batch: list) -> None:
        """A batch of encoded op entries (broadcast, fire-and-forget). Never raises."""
        # Ops (remote functions too) run as this proc, at its point in the whole proc
        # mesh: current_rank() there names the shard, whatever slice the batch went to.
        me = context().actor_instance
        set_context(Context(me, me.rank))
        self._x.run(batch)

    @endpoint
    def fetch(self, refs: list) -> tuple:
        return self._x.fetch(refs)

    @endpoint
    def describe(self, ref: int) -> tuple:
        return self._x.describe(ref)

    @endpoint
    def store_address(self) -> tuple:
        return self._x.groups.serve_store()

    @endpoint
    def inbox_subject(self) -> str:
        return self._x.inbox.subject

    @endpoint
    def stats(self) -> dict:
        return self._x.stats()

    @endpoint
    def ping(self) -> None:
        return None

    def __cleanup__(self, exc: Any) -> None:
        self._x.close()
