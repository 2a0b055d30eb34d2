"""Kubeflow Trainer v2: `trainer.kubeflow.org/v1alpha1` TrainJob, run by JobSet.

Writing (kubeflow/trainer master; docs/decisions.md has the design):
- the TrainJob's runtime is a JobSet template; the replicated job labelled
  trainer.kubeflow.org/trainjob-ancestor-step=trainer and its container `node` get the TrainJob's image,
  command, env, resourcesPerNode, and PET_NNODES/NPROC_PER_NODE/NODE_RANK/MASTER_ADDR/MASTER_PORT from the
  torch plugin, so the same torchrun command runs under both APIs;
- orch renders a namespaced TrainingRuntime per job (the whole pod template is orch's), or, with
  `runtime: NAME`, patches a ClusterTrainingRuntime through runtimePatches (only the fields that CRD allows);
- `TrainingRuntime` and `TrainJob` are the typed parts manifests/trainingruntime.yaml.j2 and trainjob.yaml.j2
  write those objects from.

Reading:
The trainer controller turns a TrainJob plus its runtime (a TrainingRuntime orch renders per job, or a
ClusterTrainingRuntime named by `runtime:`) into a JobSet of the same name; JobSet creates one Job per
replicated job and the Job the pods. Facts read from the source (kubeflow/trainer pkg/apis/trainer/v1alpha1,
pkg/constants; kubernetes-sigs/jobset api/jobset/v1alpha2, pkg/constants):
- conditions: Suspended, Complete, Failed, in every release (pkg/apis/trainer/v1alpha1/trainjob_types.go);
  Complete and Failed are the JobSet's own, copied with their reason and message (pkg/runtime/framework/
  plugins/jobset/jobset.go `Status`). There is no Created or Running condition: progress is read from
  `status.jobsStatus`, the JobSet's replicatedJobsStatus, counted in child Jobs (ready: every pod of that
  Job ready; active: a pod running or pending; failed: the Job failed), and from the pods.
- the training pods belong to the replicated job "node" and their container is named "node"; the torch plugin
  injects PET_NNODES / PET_NPROC_PER_NODE / PET_NODE_RANK (the Job completion index) / PET_MASTER_ADDR /
  PET_MASTER_PORT into it.
- JobSet labels every pod `jobset.sigs.k8s.io/jobset-name`, `.../replicatedjob-name`, `.../job-index` and
  `.../restart-attempt` (how many times the whole JobSet was recreated); the Job controller adds
  `batch.kubernetes.io/job-completion-index`.

Over 600 lines, kept whole: everything that differs for Trainer v2 is here (what it refuses, two objects
and a runtime patch, the JobSet restart rules, phases derived from child Jobs and pods, `orch doctor`'s
checks of the Trainer release), as docs/decisions.md keeps one module per job API.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from orchestrator import naming
from orchestrator.apis.base import JobAPI, SetupCheck, SetupReads
from orchestrator.apis.registry import REGISTRY
from orchestrator.kube import read
from orchestrator.kube.kinds import CONFIGMAP, JOBSET, PODMONITOR, Resource
from orchestrator.rendering import pod, scheduling, templates
from orchestrator.rendering.parts import Container, ContainerField, JobParts, Metadata, PodLayout

if TYPE_CHECKING:
    from orchestrator.job.spec import JobSpec

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

# What the trainer's JobSet builder looks for (pkg/constants/constants.go): the replicated job labelled
# ancestor=trainer, its container `node` (pods are <job>-node-0-<i>).
LABEL_TRAINJOB_ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINJOB_ANCESTOR_TRAINER = "trainer"
RUNTIME_PATCH_MANAGER = "orch.dev/render"  # runtimePatches[].manager of orch's patch
TRAINJOB_TEMPLATE, RUNTIME_TEMPLATE = "trainjob.yaml.j2", "trainingruntime.yaml.j2"
EXIT_CODES_PERMANENT = list(range(1, 128))  # restart.policy exit-code: 1-127 fail the job, signals retry

# torchrun's settings that the torch plugin injects; its webhook refuses them in trainer.env.
RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
# Pod spec fields a TrainJob's runtimePatches may set (the TrainJob CRD), and what a container patch may say.
RUNTIME_PATCH_POD_FIELDS = (
    "affinity",
    "containers",
    "imagePullSecrets",
    "initContainers",
    "nodeSelector",
    "schedulingGates",
    "securityContext",
    "serviceAccountName",
    "terminationGracePeriodSeconds",
    "tolerations",
    "volumes",
)
RUNTIME_PATCH_CONTAINER_FIELDS = ("name", "volumeMounts", "securityContext")

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
    versions = read.objects(read.dig(crd, "spec", "versions"))
    served = next((v for v in versions if v.get("name") == VERSION), None)
    spec = read.dig(served, "schema", "openAPIV3Schema", "properties", "spec", "properties")
    if not isinstance(spec, dict):
        return None
    if "runtimePatches" in spec:
        pod = read.dig(
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
    operator = REGISTRY[key].operator
    install = f"{INSTALL} (see {DOCS})"
    docs = DOCS
    setup_reads = SetupReads(crd=CRD_NAME, cluster_lists=(CLUSTER_TRAINING_RUNTIME,), groups=(JOBSET.group,))

    # --- writing ---

    def spec_problem(self, spec: JobSpec, name: str) -> tuple[str, str] | None:
        if spec.elastic is not None:
            return (
                "elastic",
                "TrainJob (Trainer v2) has no elastic training (removed in v2.2); use api: pytorchjob",
            )
        if spec.ttl_after_finished is not None:
            return (
                "ttl_after_finished",
                "TrainJob has no TTL (a JobSet TTL makes the controller re-run it, kubeflow/trainer#3737); "
                "remove it and `orch delete` finished jobs",
            )
        if problem := name_problem(name, spec.nodes):
            return "name", problem
        if reserved := sorted(set(spec.env) & set(RESERVED_ENV)):
            return "env", f"{reserved[0]} is set by Trainer v2's torch plugin; TrainJob refuses it in the env"
        if spec.runtime is not None:
            return _runtime_patch_problem(spec)
        return None

    def render(self, spec: JobSpec, parts: JobParts) -> list[dict[str, Any]]:
        """orch's TrainingRuntime (how the pods look: the whole JobSet template), unless `runtime:` names
        one, then the TrainJob (what runs: image, command, env, sizes)."""
        objects = []
        if spec.runtime is None:
            runtime = _training_runtime(spec, parts)
            objects.append(templates.render_template(RUNTIME_TEMPLATE, runtime=runtime))
        objects.append(templates.render_template(TRAINJOB_TEMPLATE, job=_trainjob(spec, parts)))
        return objects

    def restarts_replace_pods(self, spec: JobSpec) -> bool:
        """JobSet's whole-job restart and ExitCode retries create new pods; a runtime decides for itself
        (orch cannot tell)."""
        return spec.runtime is None and spec.restart.policy in ("job", "exit-code")

    def retry_limit(self, spec: JobSpec) -> int | None:
        return None  # the batch Job's backoffLimit and podFailurePolicy bound them

    def warnings(self, spec: JobSpec) -> list[str]:
        return []

    def groups_pod_sets(self, spec: JobSpec) -> bool:
        # One replicated job is one PodSet, and Kueue refuses a group that is not of exactly 2 PodSets
        # (pkg/controller/jobframework/tas_validation.go ValidatePodSetGroupingTopology).
        return False

    # --- reading ---

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

    # The status model is imported where a job is read, not with the module: `orch render` reads none (~4 ms).
    def phase(self, job: dict[str, Any], pods: Sequence[Any] = ()) -> str:
        from orchestrator import status

        return self.phase_condition(job, pods).get("type") or status.UNKNOWN

    def phase_condition(self, job: dict[str, Any], pods: Sequence[Any] = ()) -> dict[str, Any]:
        """{type (orch's phase), reason, message}: a True Failed/Complete/Suspended condition as it is;
        otherwise derived from jobsStatus and, where given, the pods (a job with a crash-looping pod or a
        failed child Job is Restarting, one whose pods are not all ready yet is Pending, saying how many
        run)."""
        from orchestrator import status

        decided = status.phase_by_precedence(job, PHASE_PRECEDENCE)
        if decided == status.UNKNOWN:
            return {"type": status.UNKNOWN}
        if decided != status.PENDING:
            return {**read.true_condition(job, decided), "type": ORCH_PHASE.get(decided, decided)}
        children = read.objects(read.dig(job, "status", "jobsStatus"))
        total = {key: sum(read.to_int(c.get(key)) for c in children) for key in ("ready", "active", "failed")}
        attempt = self.restarts(job, list(pods))
        running = [p for p in pods if read.container_running(p, self.container)]
        crashing = [p for p in pods if read.container_waiting_reason(p, self.container) == "CrashLoopBackOff"]
        if total["failed"]:
            failed = ", ".join(read.text(c.get("name")) for c in children if read.to_int(c.get("failed")))
            return condition(
                "Restarting", "JobFailed", f"child Job {failed} failed; JobSet is recreating every pod"
            )
        if crashing:
            crashed = crashing[0]
            restarts = read.restart_count(crashed, self.container)
            name = read.text(read.dig(crashed, "metadata", "name"))
            return condition("Restarting", "CrashLoopBackOff", f"pod {name} restarted {restarts} times")
        after = f" (after {attempt} whole-job restart{'s' * (attempt != 1)})" if attempt else ""
        if total["ready"]:
            return condition("Running", "JobsReady", f"every pod ready{after}")
        if pods:
            reason = "Restarting" if attempt else "PodsStarting"
            phase = "Restarting" if attempt else status.PENDING
            return condition(phase, reason, f"{len(running)} of {len(pods)} pods running{after}")
        if total["active"]:
            return condition(status.PENDING, "PodsStarting", "pods created, not all ready")
        return condition(status.PENDING, "", "")

    def replicas(self, job: dict[str, Any]) -> dict[str, dict[str, int]]:
        """Per replicated job, its child Jobs (not pods: that is what the TrainJob counts)."""
        from orchestrator import status

        children = read.objects(read.dig(job, "status", "jobsStatus"))
        return {read.text(c.get("name")) or "?": status.replica_counts(c) for c in children}

    def pod_role(self, pod: dict[str, Any]) -> tuple[str, int]:
        index = read.dig(pod, "metadata", "labels", LABEL_COMPLETION_INDEX)
        if index is None:
            index = read.dig(pod, "metadata", "annotations", LABEL_COMPLETION_INDEX)
        role = read.text(read.dig(pod, "metadata", "labels", LABEL_REPLICATED_JOB)) or "?"
        return role, read.to_int(index)

    def node_rank(self, job: dict[str, Any], role: str, index: int) -> int:
        return index  # PET_NODE_RANK is the Job completion index of the "node" pods

    def display_order(self, role: str, index: int) -> tuple[int, int]:
        """By completion index: the "node" pods are alike (the torch runtime has no launcher pod)."""
        return (0, index)

    def nodes_and_gpus(self, job: dict[str, Any]) -> tuple[int, int]:
        """From `spec.trainer` (numNodes, resourcesPerNode); 0 where the runtime alone decides."""
        trainer = read.dig(job, "spec", "trainer")
        gpus = read.dig(trainer, "resourcesPerNode", "limits", naming.GPU_RESOURCE)
        return read.to_int(read.dig(trainer, "numNodes")), read.to_int(gpus)

    def pod_templates(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """None in the TrainJob: its pod template is the runtime's."""
        return []

    def related_names(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> set[str]:
        """The TrainJob and its JobSet (same name), the child Jobs (<jobset>-<replicated job>-<index>), the pods."""
        name = read.text(read.dig(job, "metadata", "name"))
        children = read.objects(read.dig(job, "status", "jobsStatus"))
        names = (
            {name}
            | {f"{name}-{read.text(c.get('name')) or TRAINER_NODE}-0" for c in children}
            | {f"{name}-{TRAINER_NODE}-0"}
        )
        for p in pods:
            names.add(read.text(read.dig(p, "metadata", "name")))
            replicated = read.text(read.dig(p, "metadata", "labels", LABEL_REPLICATED_JOB))
            index = read.text(read.dig(p, "metadata", "labels", LABEL_JOB_INDEX))
            if replicated and index:
                names.add(f"{name}-{replicated}-{index}")
        return names

    def restarts(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> int:
        """How many times JobSet recreated every pod (its restart attempt, on each pod)."""
        return max(
            (read.to_int(read.dig(p, "metadata", "labels", LABEL_RESTART_ATTEMPT)) for p in pods),
            default=0,
        )  # fmt: skip

    # --- orch doctor --cluster ---

    def setup_checks(self, found: dict[str, Any]) -> list[SetupCheck]:
        """JobSet (which runs TrainJobs), the ClusterTrainingRuntimes, and which Trainer release's fields the
        TrainJob CRD has."""
        kind = CLUSTER_TRAINING_RUNTIME.kind
        crd = found.get("crd")
        return [
            _jobset_check(JOBSET.group, (found.get("groups") or {}).get(JOBSET.group) or []),
            _runtimes_check((found.get("lists") or {}).get(kind), (found.get("list_errors") or {}).get(kind)),
            _trainer_level_check(feature_level(crd) if crd is not None else None, found.get("crd_error")),
        ]


def _jobset_check(group: str, versions: list[str]) -> SetupCheck:
    if versions:
        return ("JobSet", "OK", f"{group} {', '.join(versions)}", "")
    return (
        "JobSet",
        "FAIL",
        f"{group} is not served: TrainJobs cannot start without it",
        "install JobSet (the Kubeflow Trainer Helm chart installs it as a dependency)",
    )


def _runtimes_check(names: list[str] | None, error: str | None) -> SetupCheck:
    if names is None:
        return (
            "training runtimes",
            "WARN",
            f"cannot list ClusterTrainingRuntimes ({error})",
            "only `runtime: NAME` needs them; ask an admin which runtimes exist",
        )
    if not names:
        return (
            "training runtimes",
            "OK",
            "no ClusterTrainingRuntimes (orch renders a TrainingRuntime per job)",
            "",
        )
    return ("training runtimes", "OK", f"ClusterTrainingRuntimes: {', '.join(names)}", "")


def _trainer_level_check(level: str | None, error: str | None) -> SetupCheck:
    """Which Trainer release's TrainJob fields the cluster serves, and what orch cannot do there."""
    name = "Trainer features"
    if level is None:
        why = (
            f"cannot read the TrainJob CRD ({error})" if error else "the TrainJob CRD's schema is unreadable"
        )
        return (name, "OK", f"unknown: {why}; deadline and runtime: NAME need Trainer v2.2+", "")
    missing = FEATURES_MISSING.get(level, "")
    if not missing:
        return (name, "OK", f"TrainJob fields of Trainer {level}: everything orch renders", "")
    return (
        name,
        "WARN",
        f"TrainJob fields of Trainer {level}: {missing}",
        "orch refuses such a submit with one line naming the field; upgrade Trainer to use them",
    )


def condition(phase: str, reason: str, message: str) -> dict[str, str]:
    return {"type": phase, "reason": reason, "message": message}


API: JobAPI = TrainJobAPI()


# --- what a TrainJob cannot carry ----------------------------------------------------------------------------


def name_problem(name: str, nodes: int) -> str | None:
    """JobSet's webhook refuses a JobSet whose longest pod name, <name>-node-0-<index>-<5 random>, is not a
    DNS-1035 label (at most 63 characters); the Trainer creates that JobSet after accepting the TrainJob."""
    longest = f"{name}-node-0-{nodes - 1}-abcde"
    if len(longest) <= 63:
        return None
    return (
        f"{len(name)} characters is too long for a TrainJob of {nodes} nodes: JobSet names its pods "
        f"<name>-node-0-<index>-<5 random> within 63 characters; use at most {63 - len(longest) + len(name)}"
    )


def _runtime_patch_problem(spec: JobSpec) -> tuple[str, str] | None:
    """What a TrainJob cannot carry in runtimePatches when it runs on someone else's runtime."""
    why = f"runtimePatches cannot set it; the ClusterTrainingRuntime {spec.runtime!r} decides"
    for field, value in (
        ("scheduling.scheduler", spec.scheduling.scheduler),
        ("scheduling.priority_class", spec.scheduling.priority_class),
        ("scheduling.gang", spec.scheduling.gang),
    ):
        if value is not None:
            return field, f"{why} (remove it, or drop runtime: to let orch render the runtime)"
    for key, value in spec.pod_overrides.items():
        if key not in RUNTIME_PATCH_POD_FIELDS:
            return (
                f"pod_overrides.{key}",
                f"{why} (runtimePatches may set {', '.join(RUNTIME_PATCH_POD_FIELDS)})",
            )
        if problem := _runtime_container_problem(spec.runtime or "", key, value):
            return problem
        if key == "containers" and isinstance(value, list):
            for container in value:
                extra = (
                    sorted(set(container) - set(RUNTIME_PATCH_CONTAINER_FIELDS))
                    if isinstance(container, dict)
                    else []
                )
                if extra:
                    return f"pod_overrides.containers.{extra[0]}", f"{why} (a container patch may set name, "
                    "volumeMounts and securityContext)"
    return None


def _runtime_container_problem(runtime: str, key: str, value: Any) -> tuple[str, str] | None:
    """Trainer's webhook refuses a runtime patch naming an initContainer or a container that the runtime's
    job does not have (pkg/runtime/framework/plugins/jobset/jobset.go Validate: "must not have
    initContainer/container that doesn't exist in the runtime job"). A ClusterTrainingRuntime is not read at
    validate time, so only what every runtime orch supports has may be patched: the main container."""
    if key == "initContainers" and value:
        return (
            "pod_overrides.initContainers",
            f"a runtime patch can only change init containers the ClusterTrainingRuntime {runtime!r} already "
            "has, which orch cannot know; add it to the runtime, or drop runtime: to let orch render one",
        )
    if key == "containers" and isinstance(value, list):
        from orchestrator.apis import all_apis  # the registry imports this module

        main = [api.container for api in all_apis()]  # pod_overrides' names of the main container
        for index, container in enumerate(value):
            name = container.get("name") if isinstance(container, dict) else None
            if name not in main:
                return (
                    "pod_overrides.containers",
                    f"[{index}] {name!r} is not the runtime's training container: a runtime patch can only "
                    f"change containers the ClusterTrainingRuntime {runtime!r} has; patch "
                    f"{' or '.join(main)}, or drop runtime: to add them",
                )
    return None


# --- the spec in Trainer v2's terms ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainJob:
    """What manifests/trainjob.yaml.j2 writes: what runs (image, command, env, nodes, processes and resources
    per node) on which runtime, and, on a ClusterTrainingRuntime, orch's pod in its runtime patch."""

    metadata: Metadata
    runtime: str  # runtimeRef.name
    runtime_kind: str  # TrainingRuntime (orch's, of the same name) | ClusterTrainingRuntime (`runtime:`)
    container: Container  # orch's: its image, command and env travel here
    nodes: int
    procs_per_node: int
    resources_per_node: dict[str, Any]
    suspend: bool  # Kueue resumes it once the whole Workload is admitted
    deadline: int | None  # activeDeadlineSeconds
    patch_pod: dict[str, Any] | None  # `runtime: NAME`: the pod fields the TrainJob CRD lets a patch set
    group: ClassVar[str] = GROUP
    node: ClassVar[str] = TRAINER_NODE
    patch_manager: ClassVar[str] = RUNTIME_PATCH_MANAGER


def _trainjob(spec: JobSpec, parts: JobParts) -> TrainJob:
    """Image, command, env and resources travel in spec.trainer (the torch plugin puts them on the `node`
    container); a runtime patch carries only what the CRD allows (`spec_problem` refused the rest)."""
    patch_layout = PodLayout(TRAINER_NODE, carries=frozenset(), grace=False)
    return TrainJob(
        metadata=parts.metadata,
        runtime=spec.runtime or parts.metadata.name,
        runtime_kind=CLUSTER_TRAINING_RUNTIME.kind if spec.runtime else TRAINING_RUNTIME.kind,
        container=parts.pod.container,
        nodes=spec.nodes,
        procs_per_node=spec.procs_per_node,
        resources_per_node=_resources_per_node(parts),
        suspend=scheduling.kueue_queue(spec) is not None,
        deadline=spec.deadline,
        patch_pod=pod.template(parts.pod, patch_layout) if spec.runtime is not None else None,
    )


def _resources_per_node(parts: JobParts) -> dict[str, Any]:
    """The `node` container's resources: orch's (GPUs, cpu, memory) merged with what pod_overrides add to the
    main container (EFA, RDMA, hugepages...). All of them go in trainer.resourcesPerNode, because Trainer
    v2.1/v2.2 replace the runtime container's resources with it (pkg/runtime/framework/plugins/jobset/
    builder.go Trainer: `WithResources(requirements)`; v2.3 merges), so extras left in the runtime were lost."""
    merged = pod.template(parts.pod, PodLayout(TRAINER_NODE, carries=frozenset({"resources"})))
    resources = pod.main_container(merged, TRAINER_NODE).get("resources")
    return resources if isinstance(resources, dict) else {}


@dataclass(frozen=True)
class JobSetRestart:
    """restart.policy in JobSet's and its batch Jobs' terms (`_jobset_restart` says how each policy maps)."""

    pod_restart_policy: str
    backoff_limit: int  # the batch Job's
    pod_failure_rules: tuple[dict[str, Any], ...] = ()  # the batch Job's podFailurePolicy.rules
    max_restarts: int | None = None  # JobSet failurePolicy.maxRestarts (None: JobSet's default)
    jobset_rules: tuple[dict[str, Any], ...] = ()  # JobSet failurePolicy.rules (none: no failurePolicy)


@dataclass(frozen=True)
class TrainingRuntime:
    """What manifests/trainingruntime.yaml.j2 writes: a TrainingRuntime shaped like Trainer v2's
    torch-distributed runtime (one replicated job `node`, labelled ancestor=trainer, container `node`), with
    orch's whole pod template and restart rules."""

    metadata: Metadata
    nodes: int
    gang: str | None  # podGroupPolicy's plugin: volcano | coscheduling
    template_annotations: dict[str, str]  # the JobSet template's
    restart: JobSetRestart
    pod_template: dict[str, Any]
    node: ClassVar[str] = TRAINER_NODE
    ancestor_label: ClassVar[dict[str, str]] = {LABEL_TRAINJOB_ANCESTOR: TRAINJOB_ANCESTOR_TRAINER}


def _training_runtime(spec: JobSpec, parts: JobParts) -> TrainingRuntime:
    """Env and resources travel in the TrainJob's spec.trainer (the torch plugin puts them on the container);
    the torch plugin adds the master port itself."""
    restart = _jobset_restart(spec)
    carried: frozenset[ContainerField] = frozenset({"image", "command", "ports"})
    layout = PodLayout(TRAINER_NODE, carries=carried, restart_policy=restart.pod_restart_policy)
    pod_template = pod.template(parts.pod, layout)
    pod.main_container(pod_template, TRAINER_NODE).pop("resources", None)  # in trainer.resourcesPerNode
    gang = scheduling.gang_scheduler(spec)
    annotations = {}
    if gang == "volcano" and spec.scheduling.queue:
        # Trainer v2's volcano plugin reads the PodGroup's queue from the JobSet template's annotations.
        annotations[naming.ANNOTATION_VOLCANO_QUEUE] = spec.scheduling.queue
    labels = {**spec.labels, **naming.standard_labels(parts.metadata.name, naming.COMPONENT_RUNTIME)}
    return TrainingRuntime(
        metadata=Metadata(parts.metadata.name, parts.metadata.namespace, labels),
        nodes=spec.nodes,
        gang=gang,
        template_annotations=annotations,
        restart=restart,
        pod_template=pod_template,
    )


# A pod that was preempted, evicted, drained or lost with its node carries this condition (the scheduler's
# preemption, the Eviction API, the taint manager and PodGC set it; Kubernetes >= 1.26, GA in 1.31).
DISRUPTED_POD = {"type": "DisruptionTarget", "status": "True"}
# batch/v1's Failed reason for a Job that a podFailurePolicy FailJob rule failed (JobReasonPodFailurePolicy).
JOB_FAILED_BY_POD_FAILURE_POLICY = "PodFailurePolicy"


def _jobset_restart(spec: JobSpec) -> JobSetRestart:
    """restart.policy as the pod's restartPolicy, the batch Job's backoffLimit and podFailurePolicy, and
    JobSet's failurePolicy.

    job: a failed pod fails its Job at once (Never, backoffLimit 0) and JobSet's failurePolicy recreates
    every Job of the JobSet, so all pods restart together, at most max_restarts times. A disrupted pod
    (preemption, eviction) fails its Job through the podFailurePolicy instead (reason PodFailurePolicy), and
    JobSet's rule for that reason restarts without counting (RestartJobSetAndIgnoreMaxRestarts): preemption
    does not spend max_restarts. Any other failure has reason BackoffLimitExceeded and gets JobSet's
    default action, RestartJobSet, which counts (jobset pkg/controllers/failure_policy.go).
    on-failure: the kubelet restarts the failed container in place; backoffLimit bounds the Job (a
    podFailurePolicy needs restartPolicy Never, so a disrupted pod counts here).
    exit-code: the v1 ExitCode policy as a podFailurePolicy: a disrupted pod is replaced without counting
    (Ignore), exit codes 1-127 fail the Job at once and JobSet fails with it (FailJobSet: a permanent
    failure), others (signals, OOM kills, the pod's SIGTERM) count against backoffLimit and get a new pod.
    never: one failure fails the job.
    Every Trainer v2 release carries these fields (its JobSet: v0.8 in v2.0 .. v0.12 in v2.3)."""
    policy = spec.restart.policy
    if policy == "job":
        restart_uncounted = {
            "name": "Disruption",
            "action": "RestartJobSetAndIgnoreMaxRestarts",
            "onJobFailureReasons": [JOB_FAILED_BY_POD_FAILURE_POLICY],
        }
        return JobSetRestart(
            "Never",
            backoff_limit=0,
            pod_failure_rules=({"action": "FailJob", "onPodConditions": [DISRUPTED_POD]},),
            max_restarts=spec.restart.max_restarts,
            jobset_rules=(restart_uncounted,),
        )
    if policy == "exit-code":
        permanent_exit_codes = {
            "containerName": TRAINER_NODE,
            "operator": "In",
            "values": EXIT_CODES_PERMANENT,
        }
        permanent = {
            "name": "ProgramError",
            "action": "FailJobSet",
            "onJobFailureReasons": [JOB_FAILED_BY_POD_FAILURE_POLICY],
        }
        return JobSetRestart(
            "Never",
            backoff_limit=spec.restart.backoff_limit,
            pod_failure_rules=(
                {"action": "Ignore", "onPodConditions": [DISRUPTED_POD]},
                {"action": "FailJob", "onExitCodes": permanent_exit_codes},
            ),
            jobset_rules=(permanent,),
        )
    if policy == "never":
        return JobSetRestart("Never", backoff_limit=0)
    return JobSetRestart("OnFailure", backoff_limit=spec.restart.backoff_limit)
