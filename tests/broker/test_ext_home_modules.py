"""A receiver decodes monarch's own reference types before it has imported the
module that registers them (a proc whose first message carries a ProcMesh)."""

from __future__ import annotations

import importlib
import subprocess
import sys

from monarch.actor import Actor, ProcMesh, endpoint, this_host
from monarch.broker.bodies import ext


def test_each_home_module_registers_its_code():
    for code, module in ext.HOME_MODULES.items():
        importlib.import_module(module)
        assert ext.by_code(code) is not None, (code, module)
        assert ext.by_code(code).cls.__module__.startswith("monarch."), code


def test_a_fresh_interpreter_decodes_a_proc_mesh_reference_without_importing_its_module(
    nats_url,
):
    # Encoded here, decoded in a process that has imported only the codec.
    from monarch.broker.bodies.codec import dumps

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        body = dumps({"mesh": procs})
        code = (
            "import sys; from monarch.broker.bodies.codec import loads; "
            "assert 'monarch.actors.procs.proc_mesh' not in sys.modules; "
            "print(type(loads(sys.stdin.buffer.read())['mesh']).__name__)"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], input=body, capture_output=True, timeout=120
        )
    finally:
        procs.stop().get(timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().strip() == "ProcMesh"


class TakesAProcMesh(Actor):
    def __init__(self, pm: ProcMesh) -> None:
        self.extent = dict(pm.extent)

    @endpoint
    def extent_seen(self) -> dict:
        return self.extent


def test_a_proc_whose_first_message_carries_a_proc_mesh_spawns_the_actor(nats_url):
    # The spawn's own arguments are the first thing a fresh proc decodes.
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        fresh = this_host().spawn_procs(per_host={"gpus": 1})
        actor = fresh.spawn("takes_pm", TakesAProcMesh, procs)
        assert actor.extent_seen.call_one().get(timeout=60) == {"gpus": 2}
        fresh.stop().get(timeout=60)
    finally:
        procs.stop().get(timeout=60)
