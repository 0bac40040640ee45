"""The Kubernetes objects ``KubernetesJob`` creates for a mesh it provisions.

Monarch creates a ``MonarchMesh`` custom resource and relies on its operator
to make the pods. Here there is no operator: a provisioned mesh is the same
kind of host pods as ``deploy/kubernetes/40-hosts.yaml`` (``monarch host``
agents that dial out to the broker at ``nats://nats:4222`` with the token of
the ``monarch-nats`` Secret, read through the environment, never on a
command line), laid out as a StatefulSet so that pod ``<mesh>-<i>`` runs the
agent named ``<mesh>-<i>``: rank i of the mesh, as Monarch ranks pods by
their index. A headless Service ``<mesh>-svc`` governs it (Monarch's name
for the mesh's service).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

MESH_LABEL = "mesh"  # the agent label (and pod label) naming a pod's mesh, as in 40-hosts.yaml
BROKER_URL = "nats://nats:4222"  # deploy/kubernetes/30-nats.yaml's Service
TOKEN_SECRET = ("monarch-nats", "token")  # deploy/kubernetes/10-secret.yaml


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """As Monarch 0.7's: the image of a provisioned mesh's pods and what they need.

    ``image`` must have this project installed (the repository's Dockerfile);
    ``resources``: requests and limits (``{"nvidia.com/gpu": 4}``);
    ``enable_fuse``: privileged, with the node's ``/dev/fuse``;
    ``shared_memory_size``: a memory-backed ``/dev/shm`` of that size.
    """

    image: str
    resources: dict[str, str | int] | None = None
    enable_fuse: bool = False
    shared_memory_size: str | None = None


def _host_container(name: str, image: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "host",
        "command": ["monarch", "host", "--labels", f"{MESH_LABEL}={name}"],
        "env": [
            {"name": "MONARCH_NATS_URL", "value": BROKER_URL},
            {
                "name": "MONARCH_NATS_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": TOKEN_SECRET[0], "key": TOKEN_SECRET[1]}},
            },
        ],
    }
    if image is not None:
        container["image"] = image
    return container


def _apply_image_spec(spec: dict[str, Any], image: ImageSpec) -> None:
    container = spec["containers"][0]
    if image.resources:
        amounts = {k: str(v) for k, v in image.resources.items()}
        container["resources"] = {"requests": dict(amounts), "limits": dict(amounts)}
    volumes, mounts = spec.setdefault("volumes", []), container.setdefault("volumeMounts", [])
    if image.shared_memory_size is not None:
        volumes.append(
            {
                "name": "dshm",
                "emptyDir": {"medium": "Memory", "sizeLimit": image.shared_memory_size},
            }
        )
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if image.enable_fuse:
        container["securityContext"] = {"privileged": True}
        volumes.append({"name": "fuse", "hostPath": {"path": "/dev/fuse"}})
        mounts.append({"name": "fuse", "mountPath": "/dev/fuse"})
    if not volumes:
        del spec["volumes"]
    if not mounts:
        del container["volumeMounts"]


def pod_template_of(
    name: str, image_spec: ImageSpec | None, pod_template: dict[str, Any] | None
) -> dict[str, Any]:
    """The pod template of mesh ``name``: from ``image_spec``, or the user's own ``pod_template``
    (a dict) with the mesh's label added and, in a first container without a
    command, the host agent's command and environment."""
    labels = {"app": "monarch-host", MESH_LABEL: name}
    if image_spec is not None:
        spec: dict[str, Any] = {
            "terminationGracePeriodSeconds": 30,
            "containers": [_host_container(name, image_spec.image)],
        }
        _apply_image_spec(spec, image_spec)
        return {"metadata": {"labels": labels}, "spec": spec}
    template = copy.deepcopy(pod_template or {})
    template.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
    containers = template.setdefault("spec", {}).setdefault("containers", [])
    if not containers:
        raise ValueError("pod_template has no containers: give at least the image's container")
    first = containers[0]
    if "command" not in first and "args" not in first:
        ours = _host_container(name, None)
        first["command"] = ours["command"]
        first["env"] = [*first.get("env", []), *ours["env"]]
    return template


def mesh_objects(
    name: str,
    namespace: str,
    replicas: int,
    template: dict[str, Any],
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The headless Service and the StatefulSet of a provisioned mesh."""
    selector = {"app": "monarch-host", MESH_LABEL: name}
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {**selector, **(labels or {})},
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{name}-svc", "namespace": namespace, "labels": dict(selector)},
        "spec": {"clusterIP": "None", "selector": dict(selector)},
    }
    stateful_set = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta,
        "spec": {
            "serviceName": f"{name}-svc",
            "replicas": replicas,
            "podManagementPolicy": "Parallel",  # all ranks start at once, as Monarch's
            "selector": {"matchLabels": dict(selector)},
            "template": template,
        },
    }
    return [service, stateful_set]
