"""Drive the Monarch-facing pieces of torchtitan's RL experiment on CPU.

Uses torchtitan's own code: ``train.spawn_proc_mesh`` (procs started with
``default_bootstrap_cmd().with_env(...)``), ``setup_torch_elastic_env_async``
and its ``InterGeneratorRouter`` actor routing to stand-in generator actors
that pass completions over a cloudpickled ``Channel`` port, as its vLLM
generator does. No model runs; exits 0 when every check held.
"""

import asyncio
import os
import sys

import cloudpickle
from torchtitan.experiments.rl import train
from torchtitan.experiments.rl.routing.inter_generator_router import InterGeneratorRouter

from monarch.actor import Actor, Channel, concurrent_endpoint, current_rank, this_host
from monarch.spmd import setup_torch_elastic_env_async


class StandInGenerator(Actor):
    """Rank 0 answers generate(); other ranks reply through a port it opened."""

    def __init__(self) -> None:
        self.rank = current_rank().rank
        self.loaded = -1
        self.started = False

    @concurrent_endpoint
    async def env(self) -> tuple[str, str, str, str]:
        return tuple(
            os.environ.get(k, "")
            for k in ("CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "MASTER_PORT")
        )

    @concurrent_endpoint
    async def open_port(self) -> bytes:
        port, self.receiver = Channel.open()
        return cloudpickle.dumps(port)

    @concurrent_endpoint
    async def send_on(self, blob: bytes, value: str) -> None:
        cloudpickle.loads(blob).send(value)

    @concurrent_endpoint
    async def recv(self) -> str:
        return await self.receiver.recv()

    @concurrent_endpoint
    async def start_engine_loop(self) -> None:
        self.started = True

    @concurrent_endpoint
    async def sync_log_step(self, step: int) -> None:
        self.step = step

    @concurrent_endpoint
    async def generate(
        self, prompt, *, request_id, routing_session_id, sampling_config, metrics_prefix
    ):
        assert self.rank == 0 and self.started
        await asyncio.sleep(0.05)
        return (request_id, sum(prompt), self.loaded)

    @concurrent_endpoint
    async def pull_model_state_dict(self, version: int) -> None:
        self.loaded = version

    @concurrent_endpoint
    async def close(self) -> str:
        return f"closed {self.rank}"


async def main() -> None:
    trainer, generators = train.spawn_proc_mesh(2, 2, num_generators=2)
    router_mesh = this_host().spawn_procs(per_host={"cpus": 1})
    meshes = [router_mesh, trainer, *generators]
    try:
        await setup_torch_elastic_env_async(trainer)
        envs = list((await trainer.spawn("probe", StandInGenerator).env.call()).values())
        assert [e[0] for e in envs] == ["0,1", "0,1"], envs
        assert sorted(e[1] for e in envs) == ["0", "1"] and {e[2] for e in envs} == {"2"}, envs
        gens = [m.spawn(f"generator_{i}", StandInGenerator) for i, m in enumerate(generators)]
        cvd = [sorted({e[0] for e in (await g.env.call()).values()}) for g in gens]
        assert cvd == [["2,3"], ["4,5"]], cvd
        rank0 = gens[0].flatten("rank").slice(rank=0)
        blob = await rank0.open_port.call_one()
        await gens[0].flatten("rank").slice(rank=1).send_on.call_one(blob, "done by rank 1")
        assert await rank0.recv.call_one() == "done by rank 1"
        router = router_mesh.spawn(
            "generator_router", InterGeneratorRouter, InterGeneratorRouter.Config(), generators=gens
        )
        await router.start_engine_loop.call_one()
        await router.pull_model_state_dict.call_one(7)
        outs = await asyncio.gather(
            *(
                router.generate.call_one(
                    [i, 1],
                    request_id=f"r{i}",
                    routing_session_id=None,
                    sampling_config=None,
                    metrics_prefix="g",
                )
                for i in range(8)
            )
        )
        assert sorted(outs) == sorted((f"r{i}", i + 1, 7) for i in range(8)), outs
        await router.sync_log_step.call_one(3)
        closed = await router.close_generators.call_one()
        assert len(closed) == 2 and all(not isinstance(c, BaseException) for c in closed), closed
    finally:
        for m in meshes:
            await m.stop()
    print("torchtitan RL CPU pieces: OK")


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(), float(sys.argv[1]) if len(sys.argv) > 1 else 300))
