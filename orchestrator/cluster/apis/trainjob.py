"""Kubeflow Trainer v2: `trainer.kubeflow.org/v1alpha1` TrainJob, run by JobSet.

The trainer controller turns a TrainJob plus its runtime (a TrainingRuntime orch renders per job, or a
ClusterTrainingRuntime named by `runtime:`) into a JobSet of the same name; JobSet creates one Job per
replicated job and the Job the pods. Facts read from the source (kubeflow/trainer pkg/apis/trainer/v1alpha1,
pkg/constants; kubernetes-sigs/jobset api/jobset/v1alpha2, pkg/constants):
- conditions: Created (reason JobsCreationSucceeded / JobsBuildFailed / JobsCreationFailed), Suspended,
  Complete, Failed. There is no Running condition: running is read from `status.jobsStatus` (per replicated
  job: ready / active / succeeded / failed child Jobs), copied from the JobSet.
- the training pods belong to the replicated job "node" and their container is named "node"; the torch plugin
  injects PET_NNODES / PET_NPROC_PER_NODE / PET_NODE_RANK (the Job completion index) / PET_MASTER_ADDR /
  PET_MASTER_PORT into it.
- JobSet labels every pod `jobset.sigs.k8s.io/jobset-name`, `.../replicatedjob-name`, `.../job-index` and
  `.../restart-attempt` (how many times the whole JobSet was recreated); the Job controller adds
  `batch.kubernetes.io/job-completion-index`.
"""

from __future__ import annotations

import re
from typing import Any

from orchestrator import status
from orchestrator.cluster.resources import CONFIGMAP, PODMONITOR, Resource

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
RESOURCE = Resource(GROUP, VERSION, "trainjobs", "TrainJob")
TRAINING_RUNTIME = Resource(GROUP, VERSION, "trainingruntimes", "TrainingRuntime")
CLUSTER_TRAINING_RUNTIME = Resource(GROUP, VERSION, "clustertrainingruntimes", "ClusterTrainingRuntime")
DOCS = "https://www.kubeflow.org/docs/components/trainer/operator-guides/installation/"
INSTALL = (
    "helm install kubeflow-trainer oci://ghcr.io/kubeflow/charts/kubeflow-trainer "
    "--namespace kubeflow-system --create-namespace --set runtimes.defaultEnabled=true"
)

# Labels JobSet and the Job controller put on the pods (read-only for orch).
LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
LABEL_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
LABEL_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
LABEL_RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
LABEL_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
TRAINER_NODE = "node"  # the replicated job and container the trainer's torch plugin configures

# The webhooks look the runtime up in the manager's informer cache, which lags its create by up to seconds:
# Trainer (pkg/runtime/core/trainingruntime.go ValidateObjects: "specified trainingRuntime must be created before
# the TrainJob is created") and Kueue (pkg/controller/jobs/trainjob/trainjob_controller.go getChildJobSet:
# "runtime '%s' not found"). orch creates the runtime a moment before the TrainJob, so these are retried.
RUNTIME_NOT_SEEN_YET = re.compile(r"must be created before the TrainJob is created|runtime '[^']*' not found")

# TrainJob fields by the Trainer release that added them (pkg/apis/trainer/v1alpha1/trainjob_types.go at
# v2.1.0/v2.2.0/v2.3.0), for a strict create refused by an older CRD: (pattern, version, what orch set it from
# and what to do).
FIELDS_SINCE = (
    (
        re.compile(r"spec\.activeDeadlineSeconds"),
        "v2.2",
        "job.yaml's deadline: remove deadline",
    ),
    (
        re.compile(r"spec\.runtimePatches.*\.terminationGracePeriodSeconds"),
        "v2.3",
        "the pods' termination grace period with runtime: NAME: remove it from pod_overrides, or drop runtime:",
    ),
    (
        re.compile(r"spec\.runtimePatches"),
        "v2.2",
        "runtime: NAME (v2.1 has podTemplateOverrides, which orch does not write): drop runtime: so orch "
        "renders its own TrainingRuntime",
    ),
)

CRD_NAME = f"{RESOURCE.plural}.{GROUP}"
# What each Trainer release can run of what orch renders (docs/cluster.md, "Trainer and Kueue versions").
FEATURES_MISSING = {
    "v2.0": "no deadline, no runtime: NAME (no activeDeadlineSeconds, runtimePatches)",
    "v2.1": "no deadline, no runtime: NAME (no activeDeadlineSeconds, runtimePatches)",
    "v2.2": "no terminationGracePeriodSeconds in a runtime: NAME job's patch",
    "v2.3": "",
}


def feature_level(crd: dict[str, Any]) -> str | None:
    """The Trainer release whose TrainJob fields the CRD's schema has ("v2.0" ... "v2.3"; later releases read
    as "v2.3"), from the fields that came with each (trainjob_types.go at each tag); None if unreadable."""
    versions = status.objects(status.dig(crd, "spec", "versions"))
    served = next((v for v in versions if v.get("name") == VERSION), None)
    spec = status.dig(served, "schema", "openAPIV3Schema", "properties", "spec", "properties")
    if not isinstance(spec, dict):
        return None
    if "runtimePatches" in spec:
        pod = status.dig(
            spec, "runtimePatches", "items", "properties", "trainingRuntimeSpec", "properties", "template",
            "properties", "spec", "properties", "replicatedJobs", "items", "properties", "template",
            "properties", "spec", "properties", "template", "properties", "spec", "properties",
        )  # fmt: skip
        return "v2.3" if isinstance(pod, dict) and "terminationGracePeriodSeconds" in pod else "v2.2"
    if "podTemplateOverrides" in spec:
        return "v2.1"
    return "v2.0" if "podSpecOverrides" in spec else None


# Highest first; "Succeeded" is orch's word for the API's "Complete" (one vocabulary for every API).
PHASE_PRECEDENCE = ("Failed", "Complete", "Suspended")
ORCH_PHASE = {"Complete": "Succeeded"}


class TrainJobAPI:
    key = "trainjob"
    resource = RESOURCE
    owned: tuple[Resource, ...] = (CONFIGMAP, TRAINING_RUNTIME, PODMONITOR)
    # The trainer's webhook rejects a TrainJob whose TrainingRuntime does not exist yet (core/trainingruntime.go
    # ValidateObjects: "specified trainingRuntime must be created before the TrainJob is created").
    before: tuple[Resource, ...] = (TRAINING_RUNTIME,)
    restarts_whole_job = True
    transient_denial: re.Pattern[str] | None = RUNTIME_NOT_SEEN_YET
    container = TRAINER_NODE
    operator = "Kubeflow Trainer v2"
    install = f"{INSTALL} (see {DOCS})"

    def unknown_field(self, field: str) -> str | None:
        """Why the cluster's TrainJob CRD lacks `field` (a strict create named it) and what to do."""
        for pattern, version, remedy in FIELDS_SINCE:
            if pattern.fullmatch(field) or pattern.match(field):
                return (
                    f"this cluster's Trainer has no TrainJob field {field}: it came with Trainer {version}; "
                    f"orch set it from {remedy}, or ask a cluster admin to upgrade Trainer to {version} or later"
                )
        return None

    def pod_selector(self, name: str) -> str:
        return f"{LABEL_JOBSET_NAME}={name},{LABEL_REPLICATED_JOB}={TRAINER_NODE}"

    def phase(self, job: dict[str, Any]) -> str:
        decided = status.phase_by_precedence(job, PHASE_PRECEDENCE)
        if decided != status.PENDING:
            return ORCH_PHASE.get(decided, decided)
        children = status.objects(status.dig(job, "status", "jobsStatus"))
        if any(status.to_int(c.get("ready")) > 0 for c in children):
            return "Running"
        if status.true_condition(job, "Created") or children:
            return "Created"
        return status.PENDING

    def phase_condition(self, job: dict[str, Any]) -> dict[str, Any]:
        decided = status.phase_by_precedence(job, PHASE_PRECEDENCE)
        return status.true_condition(job, decided if decided != status.PENDING else "Created")

    def replicas(self, job: dict[str, Any]) -> dict[str, dict[str, int]]:
        """Per replicated job, its child Jobs (not pods: that is what the TrainJob counts)."""
        children = status.objects(status.dig(job, "status", "jobsStatus"))
        return {status.text(c.get("name")) or "?": status.replica_counts(c) for c in children}

    def pod_role(self, pod: dict[str, Any]) -> tuple[str, int]:
        index = status.dig(pod, "metadata", "labels", LABEL_COMPLETION_INDEX)
        if index is None:
            index = status.dig(pod, "metadata", "annotations", LABEL_COMPLETION_INDEX)
        role = status.text(status.dig(pod, "metadata", "labels", LABEL_REPLICATED_JOB)) or "?"
        return role, status.to_int(index)

    def node_rank(self, job: dict[str, Any], role: str, index: int) -> int:
        return index  # PET_NODE_RANK is the Job completion index of the "node" pods

    def nodes_and_gpus(self, job: dict[str, Any]) -> tuple[int, int]:
        """From `spec.trainer` (numNodes, resourcesPerNode); 0 where the runtime alone decides."""
        trainer = status.dig(job, "spec", "trainer")
        gpus = status.dig(trainer, "resourcesPerNode", "limits", status.GPU_RESOURCE)
        return status.to_int(status.dig(trainer, "numNodes")), status.to_int(gpus)

    def related_names(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> set[str]:
        """The TrainJob and its JobSet (same name), the child Jobs (<jobset>-<replicated job>-<index>), the pods."""
        name = status.text(status.dig(job, "metadata", "name"))
        children = status.objects(status.dig(job, "status", "jobsStatus"))
        names = (
            {name}
            | {f"{name}-{status.text(c.get('name')) or TRAINER_NODE}-0" for c in children}
            | {f"{name}-{TRAINER_NODE}-0"}
        )
        for p in pods:
            names.add(status.text(status.dig(p, "metadata", "name")))
            replicated = status.text(status.dig(p, "metadata", "labels", LABEL_REPLICATED_JOB))
            index = status.text(status.dig(p, "metadata", "labels", LABEL_JOB_INDEX))
            if replicated and index:
                names.add(f"{name}-{replicated}-{index}")
        return names

    def restarts(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> int:
        """How many times JobSet recreated every pod (its restart attempt, on each pod)."""
        return max(
            (status.to_int(status.dig(p, "metadata", "labels", LABEL_RESTART_ATTEMPT)) for p in pods),
            default=0,
        )  # fmt: skip


API = TrainJobAPI()
