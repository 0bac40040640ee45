"""Monarch 0.7's remaining names: the _src aliases, spawn_tensor_engine, and attach(addr)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import monarch.actor as public

ROOT = Path(__file__).resolve().parents[2]


def test_src_aliases_are_our_public_classes():
    from monarch._src.actor import actor_mesh
    from monarch._src.actor.telemetry import TracingForwarder
    from monarch.telemetry.log_events import TracingForwarder as ours

    assert actor_mesh.Channel is public.Channel
    assert actor_mesh.Port is public.Port
    assert actor_mesh.PortReceiver is public.PortReceiver
    assert TracingForwarder is ours
    import logging

    assert issubclass(TracingForwarder, logging.Handler)


def test_monarchs_module_paths_of_public_names_import():
    # user code imports some names from the modules Monarch 0.7 defines them in
    import monarch
    from monarch.actor.concurrent import concurrent_endpoint
    from monarch.fetch import fetch_shard, inspect, show

    assert concurrent_endpoint is public.concurrent_endpoint
    assert (fetch_shard, inspect, show) == (monarch.fetch_shard, monarch.inspect, monarch.show)


def test_spawn_tensor_engine_gives_a_device_mesh_whose_exit_keeps_the_procs(nats_url):
    """rapid_spawn_exit_stress.py's loop: spawn_tensor_engine, compute, exit(), again."""
    import torch

    import monarch
    from monarch.mesh_controller import DeviceMesh, spawn_tensor_engine

    procs = public.this_host().spawn_procs(per_host={"gpus": 2})
    try:
        workers = []
        for round_ in (1, 2, 3):
            dm = spawn_tensor_engine(procs)
            assert isinstance(dm, DeviceMesh) and isinstance(dm, public.ProcMesh)
            with dm.activate():
                t = torch.ones(3) * round_
            got = monarch.fetch_shard(t, {"gpus": 1}).get(timeout=120)
            assert got.tolist() == [float(round_)] * 3
            from monarch.tensors.controller import controller_for

            workers.append(controller_for(dm).workers)
            dm.exit()
            dm.exit()  # again: nothing
            with pytest.raises(RuntimeError, match="has exited"):
                dm.activate()
        # Each exit stopped that round's workers; the procs stayed up throughout.
        for w in workers:
            with pytest.raises(public.MeshStoppedError):
                w.ping.call().get(timeout=30)
        assert len({id(w) for w in workers}) == 3
        assert procs.initialized.get(timeout=30)
    finally:
        procs.stop().get(timeout=60)
    with pytest.raises(TypeError, match="ProcMesh"):
        spawn_tensor_engine("not a mesh")


def _job(case: str, url: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env.update(PYTHONPATH=str(ROOT), MONARCH_OPEN_BROKER_OK="1")
    done = subprocess.run(
        [sys.executable, "-m", "tests.compat.attach_job", case, url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"{case} failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_attach_joins_the_broker_and_runs_actors_on_it(nats_url):
    tcp = nats_url.replace("nats://", "tcp://", 1)
    out = _job("attach", tcp)  # tcp://host:port is the broker's nats:// URL
    assert out == {
        "runtime_url": nats_url,
        "again": "ok",
        "other": "RuntimeError",
        "echo": 42,
    }


def test_attach_after_the_client_started_locally_is_refused(nats_url):
    assert _job("local_first", nats_url) == {"after_start": "RuntimeError"}


def test_attach_refuses_other_schemes_clearly(nats_url):
    out = _job("bad_scheme", nats_url)
    assert out["started"] is False
    for key in ("ipc", "bare"):
        assert out[key].startswith("ValueError") and "nats://" in out[key], out


class _Idle(public.Actor):
    @public.endpoint
    def ping(self) -> int:
        return 1


def test_actor_mesh_stop_takes_a_reason_that_later_calls_are_told(nats_url):
    procs = public.this_host().spawn_procs(per_host={"gpus": 1})
    try:
        mesh = procs.spawn("idle", _Idle)
        assert mesh.ping.call_one().get(timeout=60) == 1
        mesh.stop("stopped by the example").get(timeout=60)
        with pytest.raises(Exception, match="stopped by the example"):
            mesh.ping.call_one().get(timeout=60)
    finally:
        procs.stop().get(timeout=60)
