"""Fixtures for the rdma tests: two procs with a BufferOwner each, shared by the package.

The procs are started once (package scope, so before any test's leak check
looks) and every test uses its own buffers. ``transport`` runs a test once
per transport that works here, forced in the client and in the procs.
"""

from __future__ import annotations

import os

import pytest

from tests.helpers import proc_mesh_fixture
from tests.rdma.rdma_actors import BufferOwner

procs = proc_mesh_fixture({"gpus": 2}, name="rdmaprocs", scope="package", wait_ready=True)


@pytest.fixture(scope="package")
def owners(procs):
    mesh = procs.spawn("owners", BufferOwner)
    mesh.set_transport.call(None).get(timeout=60)  # waits until both actors are up
    return mesh


@pytest.fixture(params=["same_host", "tcp"])
def transport(request, owners):
    """Force one transport everywhere for the test's duration."""
    name = request.param
    before = os.environ.get("MONARCH_RDMA_TRANSPORT")
    os.environ["MONARCH_RDMA_TRANSPORT"] = name
    owners.set_transport.call(name).get(timeout=30)
    yield name
    owners.set_transport.call(None).get(timeout=30)
    if before is None:
        os.environ.pop("MONARCH_RDMA_TRANSPORT", None)
    else:
        os.environ["MONARCH_RDMA_TRANSPORT"] = before
