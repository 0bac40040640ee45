"""Proc meshes shared by the tensor engine tests.

Starting procs and their tensor workers (each imports torch) takes seconds on
a small machine, so the meshes live for the whole ``tests/tensors`` package.
Tests must leave them usable: every error these tests provoke is contained
in poisoned tensors, never in the procs.
"""

from __future__ import annotations

import pytest

from monarch.actor import this_host


@pytest.fixture(scope="package")
def procs(nats_url):
    """Four procs laid out as {'hosts': 2, 'gpus': 2} (one machine; the names are labels)."""
    pm = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2}, name="tensors")
    pm.initialized.get(timeout=60)  # started before any test's leaked-process snapshot
    yield pm
    pm.stop().get(timeout=60)


@pytest.fixture(scope="package")
def procs2(nats_url):
    """A second proc mesh, {'gpus': 2}, for moving tensors between meshes."""
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="tensors2")
    pm.initialized.get(timeout=60)
    yield pm
    pm.stop().get(timeout=60)


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
