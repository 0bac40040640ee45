"""Monarch 0.7's ``KubernetesJob``: host meshes from pods, for a cluster set up as ``deploy/kubernetes``.

In Monarch the client dials every worker pod's port. Here the pods run
``monarch host`` agents that register with the cluster's broker (the
manifests in ``deploy/kubernetes``), so a mesh is found the way every job of
ours finds its hosts: the live agents carrying the mesh's labels. The client
must reach that broker: it runs in the cluster (``50-client-job.yaml``), or
outside it through ``kubectl port-forward svc/nats 4222`` with ``attach_to``
(or ``MONARCH_NATS_URL``) naming the forwarded port.

Two kinds of mesh, as in Monarch:

* *pre-provisioned* (``add_mesh(name, n)``): the pods exist already (the
  ``monarch-hosts`` Deployment, your own); ``state()`` waits for ``n`` agents
  labelled ``mesh=<name>`` (or those of ``label_selector``: ``k=v`` terms, which
  the agents must carry as ``--labels``), ranked by agent (pod) name, where
  Monarch ranks by the pod-index label. ``kill()`` raises, as Monarch's: the
  job did not make those pods.
* *provisioned* (``image_spec=`` or ``pod_template=``): ``apply()`` creates a
  StatefulSet of such pods with ``kubectl apply`` (Monarch creates a
  MonarchMesh resource for its operator; there is no operator here, see
  :mod:`monarch.job.kubernetes_manifests`), ranked by pod index; ``kill()``
  deletes it. ``kubectl`` must be installed and configured (``kubeconfig``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

from monarch.actor import HostMesh
from monarch.hosts.attach import attach_host_mesh
from monarch.job.job import JobState, JobTrait
from monarch.job.kubernetes_manifests import (
    MESH_LABEL,
    ImageSpec,
    mesh_objects,
    pod_template_of,
)

__all__ = ["ImageSpec", "KubeConfig", "KubernetesJob"]

log = logging.getLogger(__name__)

_DEFAULT_PORT = 26600
_DEFAULT_RANK_LABEL = "apps.kubernetes.io/pod-index"
_DEFAULT_WAIT = 600.0  # seconds state() waits for a mesh's agents when timeout is None
_KUBECTL_TIMEOUT = 120.0


@dataclasses.dataclass(frozen=True)
class KubeConfig:
    """Which cluster ``kubectl`` talks to: ``local``, a kubeconfig file, or (None) the
    in-cluster or default configuration. Monarch's ``remote`` (an in-memory client
    configuration) is not supported: write it to a file and use ``from_path``."""

    local: Path | None = None

    @classmethod
    def from_path(cls, path: str | Path) -> KubeConfig:
        return cls(local=Path(path))

    def kubectl_args(self) -> list[str]:
        return ["--kubeconfig", str(self.local)] if self.local is not None else []


def _check_name(name: str) -> None:
    """Monarch's rule for mesh names (an RFC 1123 label, letters and digits only)."""
    if not name:
        raise ValueError("Empty mesh name is invalid.")
    if len(name) > 63:
        raise ValueError(f"Mesh name '{name}' is invalid. Name must contain at most 63 characters.")
    if not name.isalnum() or not name.islower() or not name.isascii():
        raise ValueError(
            f"Mesh name '{name}' is invalid. Name must contain only lowercase alphanumeric "
            "characters."
        )
    if not name[0].isalpha():
        raise ValueError(
            f"Mesh name '{name}' is invalid. Name must start with an alphabetic character."
        )


def agent_labels(name: str, label_selector: str | None) -> dict[str, str]:
    """The agent labels a mesh's hosts carry: ``mesh=<name>``, or ``label_selector``'s terms."""
    if label_selector is None:
        return {MESH_LABEL: name}
    labels = {}
    for term in filter(None, (t.strip() for t in label_selector.split(","))):
        key, sep, value = term.replace("==", "=").partition("=")
        if not sep or not key.strip() or "!" in key or " " in key.strip():
            raise ValueError(
                f"label_selector term {term!r} is not key=value: agents are matched on "
                "equality terms only (the labels they were started with, `monarch host --labels`)"
            )
        labels[key.strip()] = value.strip()
    return labels


class KubernetesJob(JobTrait):
    """Host meshes of ``monarch host`` pods in Kubernetes namespace ``namespace`` (see the module)."""

    def __init__(
        self,
        namespace: str,
        timeout: int | None = None,
        kubeconfig: KubeConfig | None = None,
        attach_to: str | None = None,
    ) -> None:
        if kubeconfig is not None and not isinstance(kubeconfig, KubeConfig):
            raise TypeError(f"kubeconfig must be a KubeConfig, got {kubeconfig!r}")
        super().__init__()
        self._namespace = namespace
        self._timeout = timeout
        self._kubeconfig = kubeconfig or KubeConfig()
        self._attach_to = attach_to
        self._meshes: dict[str, dict[str, Any]] = {}

    def add_mesh(
        self,
        name: str,
        num_replicas: int,
        label_selector: str | None = None,
        pod_rank_label: str = _DEFAULT_RANK_LABEL,
        image_spec: ImageSpec | None = None,
        port: int = _DEFAULT_PORT,
        pod_template: dict[str, Any] | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> None:
        """Add mesh ``name`` of ``num_replicas`` hosts; ValueError on a bad name or conflicting
        arguments (Monarch's rules). ``port`` (Monarch's worker port) is accepted and
        unused: agents dial out to the broker. ``pod_template`` is a dict here."""
        _check_name(name)
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"num_replicas must be a positive int, got {num_replicas!r}")
        provisioned = image_spec is not None or pod_template is not None
        if image_spec is not None and pod_template is not None:
            raise ValueError("'image_spec' and 'pod_template' are mutually exclusive.")
        if provisioned and label_selector is not None:
            raise ValueError("'label_selector' cannot be customized when provisioning.")
        if provisioned and pod_rank_label != _DEFAULT_RANK_LABEL:
            raise ValueError("'pod_rank_label' cannot be customized when provisioning.")
        if not provisioned and (labels is not None or annotations is not None):
            raise ValueError("'labels' and 'annotations' can only be set when provisioning.")
        del port
        self._meshes[name] = {
            "num_replicas": num_replicas,
            "agent_labels": agent_labels(name, label_selector),
            "provisioned": provisioned,
            "objects": mesh_objects(
                name,
                self._namespace,
                num_replicas,
                pod_template_of(name, image_spec, pod_template),
                labels,
                annotations,
            )
            if provisioned
            else None,
        }

    # -- JobTrait ------------------------------------------------------------------

    def _kubectl(self, *args: str, stdin: str | None = None) -> str:
        cmd = ["kubectl", *self._kubeconfig.kubectl_args(), "-n", self._namespace, *args]
        try:
            r = subprocess.run(
                cmd, input=stdin, capture_output=True, text=True, timeout=_KUBECTL_TIMEOUT
            )
        except FileNotFoundError:
            raise RuntimeError(
                "KubernetesJob provisions meshes with kubectl, which is not installed"
            ) from None
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"`kubectl {' '.join(args)}` did not finish within "
                               f"{_KUBECTL_TIMEOUT:g} s") from None  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(
                f"`kubectl {' '.join(args)}` failed ({r.returncode}): {r.stderr.strip()}"
            )
        return r.stdout

    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise NotImplementedError(
                "KubernetesJob batch mode (apply(client_script=...)) is not supported: run the "
                "client as a Job in the cluster (deploy/kubernetes/50-client-job.yaml)"
            )
        objects = [o for m in self._meshes.values() if m["provisioned"] for o in m["objects"]]
        if objects:
            manifest = {"apiVersion": "v1", "kind": "List", "items": objects}
            self._kubectl("apply", "-f", "-", stdin=json.dumps(manifest))

    def _use_broker(self) -> None:
        """``attach_to`` is the broker here (a forwarded ``svc/nats`` port)."""
        if self._attach_to and not os.environ.get("MONARCH_NATS_URL"):
            scheme, sep, rest = self._attach_to.partition("://")
            os.environ["MONARCH_NATS_URL"] = f"nats://{rest}" if sep else f"nats://{scheme}"

    def _state(self) -> JobState:
        self._use_broker()
        wait = float(self._timeout) if self._timeout is not None else _DEFAULT_WAIT
        hosts: dict[str, HostMesh] = {}
        for name, mesh in self._meshes.items():
            n, labels = mesh["num_replicas"], mesh["agent_labels"]
            # A provisioned mesh's pod <name>-<i> runs agent <name>-<i>: rank i.
            workers = [f"{name}-{i}" for i in range(n)] if mesh["provisioned"] else None
            try:
                hosts[name] = attach_host_mesh(
                    workers=workers, hosts=None if workers else n, labels=labels, timeout=wait
                )
            except TimeoutError as e:
                raise TimeoutError(
                    f"KubernetesJob: mesh {name!r} ({n} pods labelled {labels}, namespace "
                    f"{self._namespace!r}) not ready within {wait:g} s: {e}"
                ) from None
        return JobState(hosts)

    def _kill(self) -> None:
        provisioned = [n for n, m in self._meshes.items() if m["provisioned"]]
        if not provisioned:
            raise NotImplementedError("KubernetesJob currently does not support killing pods.")
        names = [f"statefulset/{n}" for n in provisioned] + [
            f"service/{n}-svc" for n in provisioned
        ]
        self._kubectl("delete", "--ignore-not-found", "--wait=false", *names)

    def can_run(self, spec: JobTrait) -> bool:
        """Same namespace and meshes, and every mesh's agents are live now."""
        if not (
            isinstance(spec, KubernetesJob)
            and spec._namespace == self._namespace
            and spec._meshes == self._meshes
        ):
            return False
        self._use_broker()
        try:
            for mesh in self._meshes.values():
                attach_host_mesh(hosts=mesh["num_replicas"], labels=mesh["agent_labels"], timeout=5)
        except TimeoutError:
            return False
        return True
