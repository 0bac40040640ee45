"""docker-compose.yml, docker-compose.cluster.yml and the Dockerfile describe a working cluster.

``docker-compose config`` (Debian's package) validates the files where it is
installed; the structural checks run everywhere PyYAML does. The files are run
for real by tests/deploy/test_compose_cluster.py where a Docker engine is.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.hosts.agents import ROOT

BASE = ROOT / "docker-compose.yml"
CLUSTER = ROOT / "docker-compose.cluster.yml"


def compose_config(*files) -> dict:
    yaml = pytest.importorskip("yaml")
    merged: dict = {}
    for f in files:  # a shallow merge is enough for what these files override
        for key, value in (yaml.safe_load(f.read_text()) or {}).items():
            if key in ("services", "volumes"):
                target = merged.setdefault(key, {})
                for name, body in value.items():
                    target.setdefault(name, {}).update(body or {})
            else:
                merged[key] = value
    return merged


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
@pytest.mark.parametrize("files", [[BASE], [BASE, CLUSTER]], ids=["single", "cluster"])
def test_docker_compose_accepts_the_files(files):
    args = [a for f in files for a in ("-f", str(f))]
    out = subprocess.run(
        ["docker-compose", *args, "config"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    for service in ("nats:", "host:", "client:", "nats-box:"):
        assert f"\n  {service}" in out.stdout


def test_single_broker_layout():
    services = compose_config(BASE)["services"]
    nats = services["nats"]
    assert nats["image"] == "${NATS_IMAGE:-nats:2.10}" and "-js" in nats["command"]
    # Published on this machine only by default: the broker admits anyone who reaches it.
    assert all(port.startswith("${NATS_ADDRESS:-127.0.0.1}:") for port in nats["ports"])
    host = services["host"]
    assert host["build"] == "." and host["command"][:2] == ["monarch", "host"]
    assert host["image"] == services["client"]["image"] == "${MONARCH_IMAGE:-monarch-nats:dev}"
    assert "container_name" not in host  # --scale host=N needs unnamed containers
    assert host["environment"]["MONARCH_NATS_URL"] == "nats://nats:4222"
    client = services["client"]
    script = next(c for c in client["command"] if c.endswith(".py"))
    assert (ROOT / script).is_file()
    assert services["nats-box"]["image"].startswith("natsio/nats-box")


def test_cluster_variant_routes_three_servers():
    services = compose_config(BASE, CLUSTER)["services"]
    nodes = ["nats", "nats-2", "nats-3"]
    for node in nodes:
        cmd = services[node]["command"]
        assert "-js" in cmd and "--cluster" in cmd and cmd[cmd.index("--cluster_name") + 1]
        routes = cmd[cmd.index("--routes") + 1].split(",")
        assert sorted(r.split("//")[1].split(":")[0] for r in routes) == sorted(
            n for n in nodes if n != node
        )
    for role in ("host", "client"):
        url = services[role]["environment"]["MONARCH_NATS_URL"]
        assert sorted(u.split("//")[1].split(":")[0] for u in url.split(",")) == nodes


def test_dockerfile_installs_monarch_and_runs_an_agent():
    text = (ROOT / "Dockerfile").read_text()
    assert text.startswith("#") and "\nARG BASE=python:3.11-slim\n" in text
    assert "COPY monarch ./monarch" in text and "pip install $PIP_OPTIONS ." in text
    assert "\nUSER monarch\n" in text and 'CMD ["monarch", "host"]' in text
