"""``monarch.job``'s service-identity helpers and ``MeshAdminConfig`` / ``enable_admin``.

The identity's use by a real worker (refusing a client that names another)
is tested with the dial-in workers, in tests/hosts/test_dial_in.py.
"""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys

import pytest

from monarch.actor import ProcId
from monarch.job import (
    SERVICE_PROC_IDS_ENV,
    SERVICE_PROC_RANK_ENV,
    LocalJob,
    MeshAdminConfig,
    deserialize_service_proc_ids,
    job_loads,
    new_service_proc_id,
    ranked_service_proc_id_from_env,
    serialize_service_proc_ids,
    service_proc_addr,
    service_proc_addrs,
)
from tests.hosts.agents import ROOT


def test_service_ids_are_fresh_and_travel_as_json_through_the_environment(monkeypatch):
    ids = [new_service_proc_id() for _ in range(3)]
    assert len(set(ids)) == 3 and all(p.label == "service" for p in ids)
    text = serialize_service_proc_ids(ids)
    assert deserialize_service_proc_ids(text) == ids
    with pytest.raises(ValueError, match="JSON list"):
        deserialize_service_proc_ids('{"not": "a list"}')

    monkeypatch.delenv(SERVICE_PROC_IDS_ENV, raising=False)
    assert ranked_service_proc_id_from_env() is None  # no launcher set it: go by address
    # A launcher sets one environment for every worker; each reads its own rank in a
    # real process, as a worker would.
    monkeypatch.setenv(SERVICE_PROC_IDS_ENV, text)
    code = "from monarch.job import ranked_service_proc_id_from_env as r; print(r())"
    for rank, expected in enumerate(ids):
        env = {
            "PYTHONPATH": str(ROOT),
            SERVICE_PROC_IDS_ENV: text,
            SERVICE_PROC_RANK_ENV: str(rank),
        }
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
        assert out.stdout.strip() == str(expected), out.stderr
    monkeypatch.setenv(SERVICE_PROC_RANK_ENV, "7")
    with pytest.raises(ValueError, match="not an index"):
        ranked_service_proc_id_from_env()
    monkeypatch.setenv("MY_RANK", "1")
    assert ranked_service_proc_id_from_env(rank_env="MY_RANK") == ids[1]


def test_service_proc_addr_puts_the_identity_in_front_of_the_address():
    pid = ProcId.from_string("service<00000000000000ff>")
    assert service_proc_addr("tcp://h:1", pid) == "service<00000000000000ff>@tcp://h:1"
    assert service_proc_addr("tcp://h:1", None) == "tcp://h:1"
    assert service_proc_addrs(["tcp://a:1", "tcp://b:2"], None) == ["tcp://a:1", "tcp://b:2"]
    both = service_proc_addrs(["tcp://a:1", "tcp://b:2"], [pid, pid])
    assert both == [f"{pid}@tcp://a:1", f"{pid}@tcp://b:2"]
    with pytest.raises(ValueError, match="2 worker addresses but 1"):
        service_proc_addrs(["tcp://a:1", "tcp://b:2"], [pid])


def test_enable_admin_keeps_its_config_starts_nothing_and_says_where_to_look(caplog):
    job = LocalJob()
    with caplog.at_level(logging.INFO, logger="monarch.job.admin"):
        assert job.enable_admin() is job
    assert job.admin_config == MeshAdminConfig()
    assert "monarch ps" in caplog.text
    with caplog.at_level(logging.WARNING, logger="monarch.job.admin"):
        job.enable_admin(admin_addr="[::]:9999")
    assert job.admin_config.admin_addr == "[::]:9999"
    assert "no admin server listens" in caplog.text
    assert job_loads(job.dumps()).admin_config == MeshAdminConfig("[::]:9999")
    assert pickle.loads(pickle.dumps(MeshAdminConfig("x"))) == MeshAdminConfig("x")


def test_enable_admin_refuses_bad_config_clearly():
    job = LocalJob()
    with pytest.raises(TypeError, match="unexpected keyword"):
        job.enable_admin(admin_port=1)
    with pytest.raises(TypeError, match="not both"):
        job.enable_admin(MeshAdminConfig(), admin_addr="x")
    with pytest.raises(TypeError, match="takes a MeshAdminConfig"):
        job.enable_admin("[::]:1")
    with pytest.raises(TypeError, match="admin_addr must be"):
        MeshAdminConfig(admin_addr=1729)  # type: ignore[arg-type]
