"""Data-parallel training that survives a SIGKILLed rank, bit for bit, in under a second.

Four trainer ranks (one proc each) train a small MLP with Adam on
deterministic data; their gradients are summed with gloo through
``torch.distributed``. A ``Coordinator`` actor owns the ranks. At
``--kill-at`` it SIGKILLs one rank's process from the outside; its
``__supervise__`` hears of it (milliseconds) and the training loop then

1. starts a replacement rank (a fresh proc and ``Trainer``) under the dead
   rank's number (:class:`monarch.elastic.RankedMesh`),
2. aborts the survivors' collective (they may be stuck waiting for the dead
   peer) and rolls them back to the start of the interrupted step,
3. has the replacement read a survivor's parameters and Adam state through an
   ``RDMABuffer`` (:class:`monarch.elastic.StateBuffer`: no file, no pickle),
4. re-forms the gloo group, a new generation with the same ranks
   (:class:`monarch.elastic.GroupStore` / :class:`~monarch.elastic.ElasticGroup`),
5. replays the interrupted step, and training goes on.

The replacement takes the dead rank's number and data shard, and the group has
the same size and order, so every sum is done in the same order as without the
failure: the final parameters equal those of an undisturbed run, bit for bit
(``main()`` checks it, and so does ``tests/elastic``).

When no replacement can be started (``--spare-procs 0``), ``--on-no-capacity``
decides: ``shrink`` goes on with the remaining ranks in a smaller group (each
rank then takes shard ``rank`` of ``world`` shards), ``stop`` ends the training
with a ``NoCapacityError`` naming the rank.

Run: ``python examples/fault_tolerant_training.py [--steps 30] [--kill-at 10]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import time
import uuid
from typing import Any

from monarch.actor import Actor, concurrent_endpoint, endpoint, this_proc
from monarch.elastic import (
    ElasticGroup,
    GroupStore,
    Membership,
    NoCapacityError,
    RankedMesh,
    SharedState,
    StateBuffer,
)

D_IN, HIDDEN, BATCH = 16, 32, 32
FAILURE_GRACE_S = 10.0  # how long a failed step call waits for __supervise__ to explain it


def make_batch(seed: int, step: int, shard: int, shards: int) -> tuple[Any, Any]:
    """The data of ``shard`` (of ``shards``) at ``step``: a fixed function of its arguments."""
    import torch

    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + shard * 17 + shards)
    x = torch.randn(BATCH, D_IN, generator=g)
    y = torch.sin(x[:, :1] * 3) + 0.5 * x[:, 1:2] * x[:, 2:3]
    return x, y


def make_model(seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(D_IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1)
    )


class Trainer(Actor):
    """One data-parallel rank. Every endpoint is async; ``step`` runs concurrently, so that
    ``abort`` can reach a rank whose step is stuck in a collective with a dead peer."""

    def __init__(self, seed: int, lr: float) -> None:
        import torch
        import torch.distributed  # noqa: F401  (imported now: a hot spare is ready to join)

        torch.set_num_threads(1)  # 4 ranks on a small machine; and the same math in every proc
        self.seed = seed
        self.model = make_model(seed)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.state = StateBuffer(self.model, self.opt)
        self.group = ElasticGroup()
        self.next_step = 0

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def join(self, membership: Membership) -> None:
        await asyncio.to_thread(self.group.join, membership)

    @concurrent_endpoint
    async def step(self, step: int) -> float:
        if step != self.next_step:
            raise RuntimeError(f"asked for step {step}, but this rank is at step {self.next_step}")
        return await asyncio.to_thread(self._step, step)

    def _step(self, step: int) -> float:
        import torch

        self.state.capture()  # the rollback point: the state at the start of this step
        x, y = make_batch(self.seed, step, self.group.rank, self.group.world_size)
        self.opt.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        params = list(self.model.parameters())
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        self.group.all_reduce(flat)  # GroupAbortedError if a peer died
        flat /= self.group.world_size
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        self.opt.step()
        self.next_step = step + 1
        return loss.item()

    @endpoint
    async def abort(self, why: str) -> None:
        self.group.abort(why)

    @endpoint
    async def rollback(self, step: int) -> None:
        """Return to the start of ``step`` (this rank may have finished it, or not)."""
        if self.next_step == step + 1:
            self.state.restore()
        elif self.next_step != step:
            raise RuntimeError(f"cannot roll back to step {step} from step {self.next_step}")
        self.next_step = step

    @endpoint
    async def share(self) -> SharedState:
        return self.state.share(self.next_step)

    @endpoint
    async def receive(self, shared: SharedState) -> None:
        await self.state.receive(shared)
        self.state.restore()
        self.next_step = shared.step

    @endpoint
    async def params(self) -> list:
        return [p.detach().clone() for p in self.model.parameters()]


class Coordinator(Actor):
    """Owns the ranks, drives the steps, and recovers when a rank's process dies."""

    def __init__(
        self,
        world: int = 4,
        seed: int = 0,
        lr: float = 0.01,
        spare_procs: int | None = None,
        on_no_capacity: str = "shrink",
        hot_spares: int = 1,
    ) -> None:
        if on_no_capacity not in ("shrink", "stop"):
            raise ValueError(f"on_no_capacity must be 'shrink' or 'stop', got {on_no_capacity!r}")
        self.on_no_capacity = on_no_capacity
        self.store = GroupStore()
        self.ranks = RankedMesh(
            "trainer", Trainer, seed, lr, size=world, spare_procs=spare_procs, hot_spares=hot_spares
        )
        self.failed: dict[int, float] = {}  # rank -> when __supervise__ heard of it
        self.failure_seen: asyncio.Event | None = None
        self.events: dict[str, Any] = {}

    async def __supervise__(self, failure: Any) -> bool:
        rank = self.ranks.rank_of(failure)
        if rank is None:  # an old, already replaced proc: nothing to do
            return failure.mesh_name.startswith(self.ranks.name)
        self.failed.setdefault(rank, time.time())
        if self.failure_seen is not None:
            self.failure_seen.set()
        return True

    @endpoint
    async def pids(self) -> list[int]:
        return [await a.pid.call_one() for a in self.ranks.actors]

    @concurrent_endpoint
    async def train(
        self, steps: int, kill_at: int | None = None, kill_rank: int = 1
    ) -> dict[str, Any]:
        """Run ``steps`` steps; SIGKILL rank ``kill_rank`` as step ``kill_at`` starts.

        Returns timings (``time.time()``) and each step's duration and mean loss.
        """
        self.failure_seen = asyncio.Event()
        await asyncio.gather(*self._join_all())
        victim = await self.ranks[kill_rank].pid.call_one() if kill_at is not None else None
        report: dict[str, Any] = {"steps": [], "losses": [], "recoveries": []}
        step = 0
        while step < steps:
            started = time.time()
            calls = [asyncio.ensure_future(_wait(f)) for f in self.ranks.call("step", step)]
            if step == kill_at and victim is not None:
                os.kill(victim, signal.SIGKILL)
                report["kill"], report["kill_step"], victim = time.time(), step, None
            losses = await self._finish(calls)
            if losses is None:
                report["recoveries"].append(await self._recover(step, calls, started))
                continue  # replay this step
            report["steps"].append(time.time() - started)
            report["losses"].append(sum(losses) / len(losses))
            if report["recoveries"] and "first_step" not in report["recoveries"][-1]:
                report["recoveries"][-1]["first_step"] = time.time()
            step += 1
        report["world"] = self.ranks.size
        return report

    @endpoint
    async def params(self) -> list[list]:
        """Every rank's parameters, in rank order."""
        return [await a.params.call_one() for a in self.ranks.actors]

    @endpoint
    async def stop_ranks(self) -> None:
        await self.ranks.stop()

    # -- inside --------------------------------------------------------------------

    def _join_all(self) -> list:
        memberships = self.store.reform(self.ranks.size)
        return [_wait(a.join.call_one(m)) for a, m in zip(self.ranks.actors, memberships)]

    async def _finish(self, calls: list[asyncio.Future]) -> list[float] | None:
        """The step's losses, or None when a rank failed (reported to ``__supervise__``)."""
        assert self.failure_seen is not None
        seen = asyncio.ensure_future(self.failure_seen.wait())
        try:
            pending = set(calls)
            while pending and not self.failed:
                done, pending = await asyncio.wait(
                    pending | {seen}, return_when=asyncio.FIRST_COMPLETED
                )
                pending.discard(seen)
                errors = [c.exception() for c in done if c is not seen and c.exception()]
                if errors and not self.failed:  # a peer's death shows in gloo first, often
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(asyncio.shield(seen), FAILURE_GRACE_S)
                    if not self.failed:
                        raise errors[0]
            return None if self.failed else [c.result() for c in calls]
        finally:
            seen.cancel()

    async def _recover(self, step: int, calls: list, started: float) -> dict[str, Any]:
        assert self.failure_seen is not None
        lost = sorted(self.failed)
        record: dict[str, Any] = {"step": step, "ranks": lost, "started": started}
        record["supervise"] = min(self.failed.values())
        self.failed.clear()
        self.failure_seen.clear()
        survivors = [r for r in range(self.ranks.size) if r not in lost]
        # Replacements first: starting a proc is the longest part, and it overlaps the rest.
        replaced = []
        try:
            for r in lost:
                self.ranks.respawn(r)
                replaced.append(r)
        except NoCapacityError:
            if self.on_no_capacity == "stop":
                await asyncio.gather(*(self.ranks[r].abort.call_one("stopping") for r in survivors))
                await asyncio.gather(*calls, return_exceptions=True)
                raise
        if len(replaced) < len(lost):  # shrink: the ranks without a replacement go
            for r in sorted(set(lost) - set(replaced), reverse=True):
                self.ranks.drop(r)
            survivors = [r - sum(1 for d in lost if d < r and d not in replaced) for r in survivors]
            record["shrunk_to"] = self.ranks.size
        await asyncio.gather(*(self.ranks[r].abort.call_one("a rank failed") for r in survivors))
        await asyncio.gather(*calls, return_exceptions=True)  # every step call has ended
        await asyncio.gather(*(self.ranks[r].rollback.call_one(step) for r in survivors))
        receives = []
        if replaced:  # the state first: each actor handles its messages in order
            shared = await self.ranks[survivors[0]].share.call_one()
            news = [r for r in range(self.ranks.size) if r not in survivors]
            receives = [_wait(self.ranks[r].receive.call_one(shared)) for r in news]
        await asyncio.gather(*receives, *self._join_all())
        record["ready"] = time.time()
        return record


async def _wait(future: Any) -> Any:
    return await future


def run(
    steps: int,
    kill_at: int | None,
    world: int = 4,
    spare_procs: int | None = None,
    on_no_capacity: str = "shrink",
    kill_rank: int = 1,
) -> tuple[dict[str, Any], list[list]]:
    """One training run from the client: (report, every rank's final parameters)."""
    import torch  # noqa: F401  (now, not on the client's event loop when the parameters arrive)

    # The coordinator runs in this process (``this_proc``): the ranks' procs fork
    # from this client's template process, which has torch imported already.
    coord = this_proc().spawn(
        f"coordinator_{uuid.uuid4().hex[:8]}",
        Coordinator,
        world=world,
        spare_procs=spare_procs,
        on_no_capacity=on_no_capacity,
    )
    try:
        report = coord.train.call_one(steps, kill_at, kill_rank).get(timeout=300)
        params = coord.params.call_one().get(timeout=60)
    finally:
        coord.stop_ranks.call_one().get(timeout=60)
        coord.stop().get(timeout=60)
    return report, params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--kill-at", type=int, default=10)
    parser.add_argument("--kill-rank", type=int, default=1)
    parser.add_argument("--spare-procs", type=int, default=None)
    parser.add_argument("--on-no-capacity", choices=["shrink", "stop"], default="shrink")
    args = parser.parse_args()

    reference, ref_params = run(args.steps, None)
    report, params = run(
        args.steps, args.kill_at, 4, args.spare_procs, args.on_no_capacity, args.kill_rank
    )
    for rec in report["recoveries"]:
        kill = report["kill"]
        print(
            f"rank(s) {rec['ranks']} lost at step {rec['step']}: __supervise__ after "
            f"{rec['supervise'] - kill:.3f} s, replacement ready after {rec['ready'] - kill:.3f} s, "
            f"first step done after {rec['first_step'] - kill:.3f} s"
            + (f"; continued on {rec['shrunk_to']} ranks" if "shrunk_to" in rec else "")
        )
    print(f"final loss {report['losses'][-1]:.5f} on {report['world']} ranks")
    same = all(all(a.equal(b) for a, b in zip(ranks, ref_params[0])) for ranks in params)
    print("final parameters equal to the run without a failure, bit for bit:", same)


if __name__ == "__main__":
    main()
