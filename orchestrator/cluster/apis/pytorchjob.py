"""Kubeflow Training Operator v1: `kubeflow.org/v1` PyTorchJob (Master + Worker replicas).

The operator's conditions are a history, not a state: `kubectl get`'s `conditions[-1].type` may be a
condition whose status is "False" (Suspended=False after a resume, Running=False after success). So the phase
is the highest-precedence condition whose status is "True" (see `PHASE_PRECEDENCE`).
"""

from __future__ import annotations

import re
from typing import Any

from orchestrator import naming, status
from orchestrator.cluster.resources import CONFIGMAP, PODMONITOR, Resource

RESOURCE = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
DOCS = "https://www.kubeflow.org/docs/components/trainer/legacy-v1/"
INSTALL = 'kubectl apply --server-side -k "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.4"'

# Highest first. Once Failed=True the operator stops updating conditions, so it wins over everything.
PHASE_PRECEDENCE = ("Failed", "Succeeded", "Suspended", "Restarting", "Running", "Created")


class PyTorchJobAPI:
    key = "pytorchjob"
    resource = RESOURCE
    owned: tuple[Resource, ...] = (CONFIGMAP, PODMONITOR)
    before: tuple[Resource, ...] = ()
    restarts_whole_job = False
    transient_denial: re.Pattern[str] | None = None
    container = naming.CONTAINER_NAME  # the operator requires this name
    operator = "Kubeflow training operator"
    install = f"{INSTALL} (see {DOCS})"

    def unknown_field(self, field: str) -> str | None:
        return None  # every field orch writes is in the v1.9 CRD

    def pod_selector(self, name: str) -> str:
        return f"{naming.LABEL_OPERATOR_JOB_NAME}={name}"

    def phase(self, job: dict[str, Any]) -> str:
        return status.phase_by_precedence(job, PHASE_PRECEDENCE)

    def phase_condition(self, job: dict[str, Any]) -> dict[str, Any]:
        return status.true_condition(job, self.phase(job))

    def replicas(self, job: dict[str, Any]) -> dict[str, dict[str, int]]:
        counts = status.dig(job, "status", "replicaStatuses")
        counts = counts if isinstance(counts, dict) else {}
        return {str(role): status.replica_counts(c) for role, c in sorted(counts.items())}

    def pod_role(self, pod: dict[str, Any]) -> tuple[str, int]:
        labels = status.dig(pod, "metadata", "labels")
        role = status.text(status.dig(labels, naming.LABEL_REPLICA_TYPE)) or "?"
        return role, status.to_int(status.dig(labels, naming.LABEL_REPLICA_INDEX))

    def node_rank(self, job: dict[str, Any], role: str, index: int) -> int:
        has_master = status.dig(job, "spec", "pytorchReplicaSpecs", "Master") is not None
        return 0 if role == "master" else index + (1 if has_master else 0)

    def nodes_and_gpus(self, job: dict[str, Any]) -> tuple[int, int]:
        """Master + Worker replicas, and the `pytorch` container's GPUs."""
        replica_specs = status.dig(job, "spec", "pytorchReplicaSpecs")
        specs = (
            [r for r in replica_specs.values() if isinstance(r, dict)]
            if isinstance(replica_specs, dict)
            else []
        )
        nodes = sum(status.to_int(r.get("replicas")) for r in specs)
        gpus = max((status.template_gpus(r.get("template"), self.container) for r in specs), default=0)
        return nodes, gpus

    def related_names(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> set[str]:
        names = {status.text(status.dig(p, "metadata", "name")) for p in pods}
        return {status.text(status.dig(job, "metadata", "name"))} | names

    def restarts(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> int:
        """The operator restarts pods, not the job: the most any pod's `pytorch` container restarted."""
        return max((status.restart_count(p, self.container) for p in pods), default=0)


API = PyTorchJobAPI()
