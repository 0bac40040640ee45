"""deploy/kubernetes/: every manifest is valid Kubernetes, and no secret is on a command line.

The manifests are checked against the Kubernetes JSON schemas shipped inside the
``kubernetes-validate`` package (offline: no cluster, no network). The broker's
configuration is also run for real: nats-server reads the ConfigMap's
``nats.conf`` with the token in its environment, as the StatefulSet starts it.
Nothing here was applied to a real cluster.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from monarch.broker.connections.server import find_nats_server, free_port

kv = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is in the test extra: pip install -e .[test]"
)

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
K8S_VERSION = "1.30.0"


def documents() -> list[dict]:
    return [d for path in MANIFESTS for d in yaml.safe_load_all(path.read_text()) if d]


def pod_specs() -> list[tuple[str, dict]]:
    specs = []
    for d in documents():
        spec = d.get("spec", {})
        if "template" in spec:
            specs.append((f"{d['kind']}/{d['metadata']['name']}", spec["template"]["spec"]))
    return specs


def by_kind(kind: str) -> list[dict]:
    return [d for d in documents() if d["kind"] == kind]


def test_every_manifest_validates_against_the_kubernetes_schemas():
    assert [p.name for p in MANIFESTS][:1] == ["00-namespace.yaml"]  # kubectl applies in order
    kinds = set()
    for d in documents():
        kv.validate(d, K8S_VERSION, strict=True)  # raises ValidationError naming the field
        kinds.add(d["kind"])
    assert {"Namespace", "Secret", "ConfigMap", "Service", "StatefulSet", "Deployment", "Job"} <= kinds


def test_a_broken_manifest_is_caught_by_the_validator():
    (deployment,) = by_kind("Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, K8S_VERSION, strict=True)


def test_the_token_reaches_pods_only_through_env_from_the_secret():
    (secret,) = by_kind("Secret")
    token = secret["stringData"]["token"]
    specs = pod_specs()
    assert {name for name, _ in specs} == {
        "StatefulSet/nats", "Deployment/monarch-hosts", "Job/monarch-client"
    }
    for name, spec in specs:
        for c in spec["containers"]:
            argv = " ".join(c.get("command", []) + c.get("args", []))
            assert token not in argv and "TOKEN" not in argv.upper(), (name, argv)
            tokens = [e for e in c.get("env", []) if "TOKEN" in e["name"]]
            assert tokens, f"{name} gets no token"
            for e in tokens:
                assert "value" not in e, f"{name}: {e['name']} is a literal, not a secretKeyRef"
                assert e["valueFrom"]["secretKeyRef"] == {"name": "monarch-nats", "key": "token"}
    for d in by_kind("ConfigMap"):
        assert token not in yaml.safe_dump(d)


def test_agents_are_labelled_by_mesh_and_the_client_runs_an_existing_example():
    (hosts,) = by_kind("Deployment")
    (agent,) = hosts["spec"]["template"]["spec"]["containers"]
    assert agent["command"][:2] == ["monarch", "host"]
    assert "mesh=hosts" in agent["command"][agent["command"].index("--labels") + 1]
    (job,) = by_kind("Job")
    (client,) = job["spec"]["template"]["spec"]["containers"]
    script = next(a for a in client["command"] if a.endswith(".py"))
    assert (ROOT / script).is_file()
    (service,) = by_kind("Service")
    (nats,) = by_kind("StatefulSet")
    assert service["spec"]["clusterIP"] == "None" and nats["spec"]["serviceName"] == "nats"
    urls = {e["value"] for _, s in pod_specs() for c in s["containers"] for e in c.get("env", [])
            if e["name"] == "MONARCH_NATS_URL"}
    assert urls == {"nats://nats:4222"}


def test_the_nats_config_enables_jetstream_and_enforces_the_token_from_env(tmp_path):
    """Run the ConfigMap's nats.conf with the real nats-server, the token only in its env."""
    import nats

    (config,) = by_kind("ConfigMap")
    port, http = free_port(), free_port()
    conf = (
        config["data"]["nats.conf"]
        .replace("port: 4222", f"port: {port}")
        .replace("http_port: 8222", f"http_port: {http}")
        .replace("/data", str(tmp_path / "data"))
    )
    (tmp_path / "nats.conf").write_text(conf)
    token = "t-" + os.urandom(8).hex()
    server = subprocess.Popen(
        [find_nats_server(), "-c", str(tmp_path / "nats.conf")],
        env=dict(os.environ, NATS_TOKEN=token, POD_NAME="nats-0"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    async def probe(tok: str):
        deadline = time.monotonic() + 15
        while True:
            try:
                nc = await nats.connect(
                    f"nats://127.0.0.1:{port}", token=tok, allow_reconnect=False,
                    connect_timeout=2, max_reconnect_attempts=0,
                )
            except Exception as e:
                if "Authorization" in str(e) or time.monotonic() > deadline:
                    return type(e).__name__ + ": " + str(e)
                await asyncio.sleep(0.1)
                continue
            try:
                info = await nc.jetstream().account_info()
                return f"jetstream ok, {info.streams} streams"
            finally:
                await nc.close()

    try:
        assert asyncio.run(probe(token)) == "jetstream ok, 0 streams"
        assert "Authorization" in asyncio.run(probe("wrong-" + token))
    finally:
        server.terminate()
        server.wait(10)
