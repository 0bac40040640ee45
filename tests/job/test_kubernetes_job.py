"""``monarch.job.kubernetes.KubernetesJob``, as far as it can be tested without a cluster.

* A pre-provisioned mesh on real ``monarch host`` agents, started as the pods of
  ``deploy/kubernetes/40-hosts.yaml`` start them (``--labels mesh=<name>``).
* The objects a provisioned mesh is made of, validated against the Kubernetes
  schemas (``kubernetes-validate``, offline) and compared with the deploy manifests.
* ``apply()``/``kill()`` of a provisioned mesh: no cluster here, so ``kubectl`` is a
  stand-in script on ``PATH`` that records its arguments and input.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from monarch.actor import Actor, endpoint
from monarch.job.kubernetes import ImageSpec, KubeConfig, KubernetesJob
from tests.hosts.agents import ROOT, start_agent, unique_label

kv = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is in the test extra: pip install -e .[test]"
)
K8S_VERSION = "1.30.0"


class Hostname(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def test_a_pre_provisioned_mesh_is_its_labelled_agents(nats_url, tmp_path):
    mesh = "m" + unique_label()
    agents = [start_agent(f"{mesh}-pod{i}", "--labels", f"mesh={mesh}") for i in range(2)]
    try:
        for a in agents:
            a.wait_ready()
        job = KubernetesJob("monarch", timeout=60)
        job.add_mesh(mesh, 2)
        state = job.state(cached_path=str(tmp_path / "job.pkl"))
        procs = getattr(state, mesh).spawn_procs(per_host={"gpus": 1})
        pids = procs.spawn("pods", Hostname).pid.call().get(timeout=60)
        assert len(set(pids.values())) == 2
        procs.stop().get(timeout=60)
        assert job.can_run(job)  # a second script with this spec reuses the job
        with pytest.raises(NotImplementedError, match="does not support killing pods"):
            job.kill()  # the job did not make those pods
    finally:
        for a in agents:
            a.stop()


def test_a_pre_provisioned_mesh_that_never_comes_up_fails_naming_it(nats_url):
    job = KubernetesJob("monarch", timeout=1)
    job.add_mesh("nowhere", 1, label_selector="app=monarch-host,mesh==nowhere" + unique_label())
    with pytest.raises(TimeoutError, match="mesh 'nowhere'"):
        job.state(cached_path=None)


def provisioned_objects() -> list[dict]:
    job = KubernetesJob("monarch")
    job.add_mesh(
        "trainers",
        4,
        image_spec=ImageSpec(
            "monarch-nats:dev", resources={"nvidia.com/gpu": 8, "cpu": "4"},
            shared_memory_size="16Gi", enable_fuse=True,
        ),
        labels={"team": "a"},
        annotations={"note": "x"},
    )  # fmt: skip
    job.add_mesh(
        "eval",
        1,
        pod_template={"spec": {"containers": [{"name": "main", "image": "monarch-nats:dev"}]}},
    )
    return [o for m in job._meshes.values() for o in m["objects"]]


def test_provisioned_meshes_are_valid_kubernetes_and_start_hosts_like_the_deploy_manifests():
    objects = provisioned_objects()
    for o in objects:
        kv.validate(o, K8S_VERSION, strict=True)  # raises naming the field
    deployed = yaml.safe_load((ROOT / "deploy/kubernetes/40-hosts.yaml").read_text())
    deployed_host = deployed["spec"]["template"]["spec"]["containers"][0]
    sets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "StatefulSet"}
    assert sets["trainers"]["spec"]["replicas"] == 4 and sets["eval"]["spec"]["replicas"] == 1
    for name, s in sets.items():
        container = s["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["monarch", "host", "--labels", f"mesh={name}"]
        assert container["env"] == deployed_host["env"]  # same broker, token from the Secret
        assert s["spec"]["serviceName"] == f"{name}-svc"
    trainer = sets["trainers"]["spec"]["template"]["spec"]
    assert trainer["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert {v["name"] for v in trainer["volumes"]} == {"dshm", "fuse"}
    assert sets["trainers"]["metadata"]["labels"]["team"] == "a"


def fake_kubectl(tmp_path: Path, monkeypatch, exit_code: int = 0) -> Path:
    log = tmp_path / "kubectl.log"
    script = tmp_path / "bin" / "kubectl"
    script.parent.mkdir()
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$*" >> {log}\n'
        f'if [ "$5" = "apply" ]; then cat > {tmp_path}/applied.json; fi\n'
        f'echo "stand-in kubectl said no" >&2; exit {exit_code}\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")
    return log


def test_apply_and_kill_of_a_provisioned_mesh_run_kubectl(tmp_path, monkeypatch):
    log = fake_kubectl(tmp_path, monkeypatch)
    job = KubernetesJob("team-ns", kubeconfig=KubeConfig.from_path(tmp_path / "kc"))
    job.add_mesh("trainers", 2, image_spec=ImageSpec("monarch-nats:dev"))
    job.apply()
    applied = json.loads((tmp_path / "applied.json").read_text())
    assert applied["items"] == job._meshes["trainers"]["objects"]
    job.kill()
    calls = log.read_text().splitlines()
    kc = f"--kubeconfig {tmp_path / 'kc'} -n team-ns"
    assert calls == [
        f"{kc} apply -f -",
        f"{kc} delete --ignore-not-found --wait=false statefulset/trainers service/trainers-svc",
    ]


def test_a_failing_kubectl_is_a_clear_error(tmp_path, monkeypatch):
    fake_kubectl(tmp_path, monkeypatch, exit_code=1)
    job = KubernetesJob("team-ns")
    job.add_mesh("trainers", 1, image_spec=ImageSpec("monarch-nats:dev"))
    with pytest.raises(RuntimeError, match="stand-in kubectl said no"):
        job.apply()


@pytest.mark.parametrize(
    "args, message",
    [
        (("Trainers", 1), "lowercase"),
        (("1trainers", 1), "start with an alphabetic"),
        (("a" * 64, 1), "at most 63"),
        (("trainers", 0), "positive int"),
        (("trainers", 1, "mesh in (a,b)"), "equality terms only"),
    ],
)
def test_add_mesh_refuses_bad_input_as_monarch_does(args, message):
    with pytest.raises(ValueError, match=message):
        KubernetesJob("monarch").add_mesh(*args)


def test_add_mesh_refuses_conflicting_provisioning_arguments():
    job = KubernetesJob("monarch")
    image = ImageSpec("monarch-nats:dev")
    with pytest.raises(ValueError, match="mutually exclusive"):
        job.add_mesh("a", 1, image_spec=image, pod_template={"spec": {}})
    with pytest.raises(ValueError, match="label_selector"):
        job.add_mesh("a", 1, label_selector="x=y", image_spec=image)
    with pytest.raises(ValueError, match="only be set when provisioning"):
        job.add_mesh("a", 1, labels={"k": "v"})
    with pytest.raises(ValueError, match="no containers"):
        job.add_mesh("a", 1, pod_template={"spec": {"containers": []}})
