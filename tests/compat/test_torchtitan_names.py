"""What torchtitan's RL experiment (torchtitan/experiments/rl) needs of Monarch, checked on ours.

It starts each role's procs with ``spawn_procs(per_host=..., bootstrap=<callable>,
bootstrap_command=default_bootstrap_cmd().with_env({"CUDA_VISIBLE_DEVICES": ...}))``,
then ``setup_torch_elastic_env_async`` on them before torch.distributed; its
generator's rank 0 opens a ``Channel``, cloudpickles the ``Port`` into bytes for
its peers, which send on it; every endpoint is a ``@concurrent_endpoint``, so
calls overlap in one actor; its router is built outside any mesh in unit tests
and checks ``current_size()`` for a singleton. Real procs and a real broker.
"""

from __future__ import annotations

import asyncio

from monarch.actor import default_bootstrap_cmd, this_host
from monarch.spmd import setup_torch_elastic_env_async
from tests.compat.titan_actors import RolePeer, SingletonCheck

_MARK = "TITAN_COMPAT_MARK"


def _import_marker() -> None:
    """A bootstrap callable, as torchtitan passes beside its bootstrap_command."""
    import os

    os.environ["TITAN_COMPAT_BOOTSTRAPPED"] = "yes"


def test_role_procs_get_their_env_and_the_bootstrap_callable_runs(nats_url):
    first = this_host().spawn_procs(
        per_host={"gpus": 2}, bootstrap=_import_marker,
        bootstrap_command=default_bootstrap_cmd().with_env({"CUDA_VISIBLE_DEVICES": "0,1", _MARK: "a"}),
    )  # fmt: skip
    second = this_host().spawn_procs(
        per_host={"gpus": 1}, bootstrap=_import_marker,
        bootstrap_command=default_bootstrap_cmd().with_env({"CUDA_VISIBLE_DEVICES": "2"}),
    )  # fmt: skip
    try:
        names = ["CUDA_VISIBLE_DEVICES", _MARK, "TITAN_COMPAT_BOOTSTRAPPED"]
        got = first.spawn("peer", RolePeer).env.call(names).get(timeout=120)
        assert [v for _, v in got.items()] == [
            {"CUDA_VISIBLE_DEVICES": "0,1", _MARK: "a", "TITAN_COMPAT_BOOTSTRAPPED": "yes"}
        ] * 2
        got2 = second.spawn("peer", RolePeer).env.call_one(names).get(timeout=120)
        assert got2 == {
            "CUDA_VISIBLE_DEVICES": "2",
            _MARK: None,
            "TITAN_COMPAT_BOOTSTRAPPED": "yes",
        }
    finally:
        first.stop().get(timeout=60)
        second.stop().get(timeout=60)


def test_elastic_env_async_then_gloo_all_reduce_across_the_mesh(nats_url):
    async def run() -> list[float]:
        procs = this_host().spawn_procs(
            per_host={"gpus": 2},
            bootstrap_command=default_bootstrap_cmd().with_env({"CUDA_VISIBLE_DEVICES": ""}),
        )
        try:
            await setup_torch_elastic_env_async(procs)
            peers = procs.spawn("peer", RolePeer)
            return [v for _, v in (await peers.all_reduce_rank.call()).items()]
        finally:
            await procs.stop()

    assert asyncio.run(run()) == [1.0, 1.0]  # ranks 0 + 1 on both


def test_cloudpickled_port_carries_values_from_a_peer_to_the_opener(nats_url):
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        peers = procs.spawn("peer", RolePeer)
        opener = peers.flatten("rank").slice(rank=0)
        sender = peers.flatten("rank").slice(rank=1)
        port_bytes = opener.open_port_as_bytes.call_one().get(timeout=60)
        assert isinstance(port_bytes, bytes)
        for value in (["completion", 1], {"id": "r2"}):
            sender.send_through.call_one(port_bytes, value).get(timeout=60)
            assert opener.next_received.call_one().get(timeout=60) == value
    finally:
        procs.stop().get(timeout=60)


def test_concurrent_endpoints_overlap_in_one_actor(nats_url):
    procs = this_host().spawn_procs(per_host={"cpus": 1})
    try:
        peer = procs.spawn("peer", RolePeer)
        waiting = peer.wait_for_gate.call_one()  # blocks until the next call runs beside it
        peer.open_gate.call_one().get(timeout=60)
        assert waiting.get(timeout=60) == "released 0"
    finally:
        procs.stop().get(timeout=60)


def test_actor_built_outside_a_mesh_sees_no_dimensions_and_one_in_a_cpu_mesh(nats_url):
    assert SingletonCheck().size == {}  # torchtitan's unit tests build its router directly
    procs = this_host().spawn_procs(per_host={"cpus": 1})
    try:
        size = procs.spawn("one", SingletonCheck).mesh_size.call_one().get(timeout=60)
        assert list(size.values()) == [1]
    finally:
        procs.stop().get(timeout=60)
