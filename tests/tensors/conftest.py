"""Proc meshes shared by the tensor engine tests.

Starting procs and their tensor workers (each imports torch) takes seconds on
a small machine, so the meshes live for the whole ``tests/tensors`` package.
Tests must leave them usable: every error these tests provoke is contained
in poisoned tensors, never in the procs.
"""

from __future__ import annotations

import pytest

from tests.helpers import proc_mesh_fixture

# Four procs laid out as {'hosts': 2, 'gpus': 2} (one machine; the names are labels),
# and a second mesh for moving tensors between meshes.
procs = proc_mesh_fixture(
    {"hosts": 2, "gpus": 2}, name="tensors", scope="package", wait_ready=True
)
procs2 = proc_mesh_fixture({"gpus": 2}, name="tensors2", scope="package", wait_ready=True)


@pytest.fixture
def round_trips(monkeypatch):
    """The names of the calls the client made to the procs and waited for (no op pipelining)."""
    from monarch.tensors import controller as controller_mod

    calls: list = []
    real_call = controller_mod.Controller.call
    monkeypatch.setattr(
        controller_mod.Controller,
        "call",
        lambda self, *a: calls.append(a[1]) or real_call(self, *a),
    )
    return calls
