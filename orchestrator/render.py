"""JobSpec -> the Kubernetes objects that run it: a pure function through the Jinja2 templates in manifests/.

`render(spec, api=...)` returns plain dicts: ConfigMap, then a PyTorchJob (kubeflow.org/v1, the training
operator) or a TrainingRuntime + TrainJob (trainer.kubeflow.org/v1alpha1, Trainer v2), then a PodMonitor. It
reads the packaged templates and nothing else; no cluster is asked. Every decision (names, labels, the torchrun command, env, volumes, defaults) is made here in
Python; the templates only place the values. `to_yaml` / `to_json` serialise the objects for the CLI.

Facts about the Kubeflow training operator v1.9 this relies on (see docs/jobspec.md):
- it sets PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR/PORT (or PET_RDZV_* when elastic) and
  PET_NPROC_PER_NODE (from spec.nprocPerNode) in every container, and torchrun reads each `--flag` from
  `PET_<FLAG>`; so the command only names what to run, and topology follows the operator (also when the
  Worker replicas are scaled);
- the Master replica must say `replicas: 1`; a job without a Master (elastic) rendezvouses at worker-0;
- the main container must be called `pytorch` and expose the port `pytorchjob-port`.

And about Trainer v2 (kubeflow/trainer master; docs/decisions.md has the design):
- the TrainJob's runtime is a JobSet template; the replicated job labelled
  trainer.kubeflow.org/trainjob-ancestor-step=trainer and its container `node` get the TrainJob's image,
  command, env, resourcesPerNode, and PET_NNODES/NPROC_PER_NODE/NODE_RANK/MASTER_ADDR/MASTER_PORT from the
  torch plugin, so the same torchrun command runs under both APIs;
- orch renders a namespaced TrainingRuntime per job (the whole pod template is orch's), or, with
  `runtime: NAME`, patches a ClusterTrainingRuntime through runtimePatches (only the fields that CRD allows).
"""

from __future__ import annotations

import functools
import json
import re
from typing import TYPE_CHECKING, Any

from orchestrator import launch, naming, runtime_env
from orchestrator.errors import SpecError
from orchestrator.redaction import redact_url
from orchestrator.trainer import tracking

if TYPE_CHECKING:
    import jinja2

    from orchestrator.spec import JobSpec

TEMPLATES = {
    "configmap": "configmap.yaml.j2",
    "pytorchjob": "pytorchjob.yaml.j2",
    "trainingruntime": "trainingruntime.yaml.j2",
    "trainjob": "trainjob.yaml.j2",
    "podmonitor": "podmonitor.yaml.j2",
}
APIS = ("pytorchjob", "trainjob")
API_KINDS = {"pytorchjob": "PyTorchJob", "trainjob": "TrainJob"}  # ORCH_API_KIND, a tag of the MLflow run
TRAINER_MODULE = "orchestrator.trainer"
SHM_PER_GPU_GI = 2  # /dev/shm default: 2Gi per GPU (NCCL ~33M per communicator + pinned DataLoader batches)
SHM_CPU_DEFAULT = "1Gi"  # /dev/shm default of a CPU pod (gloo and DataLoader workers)
CLEAN_POD_POLICY = "Running"  # on finish, delete pods still running (frees GPUs); keep finished ones for logs
# job: OnFailure, so a pod whose agent gave up (or that was killed) comes back and rejoins the rendezvous.
RESTART_POLICIES = {"job": "OnFailure", "on-failure": "OnFailure", "exit-code": "ExitCode", "never": "Never"}
VOLUME_SHM, VOLUME_CONFIG, VOLUME_OUTPUT = "orch-shm", "orch-config", "orch-output"

# Characters PyYAML's reader refuses anywhere in a stream, plus the ones YAML 1.1 reads as line breaks
# (they would be folded inside a quoted scalar). JSON leaves them raw with ensure_ascii=False.
_YAML_UNSAFE = re.compile(
    "[^\x09\x0a\x0d\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]"
)


def yaml_scalar(value: Any) -> str:
    """`value` as JSON that any YAML parser reads back unchanged (the templates' `tojson` filter).

    Unlike Jinja's own `tojson` (HTML escaping, astral characters as surrogate pairs that PyYAML cannot
    rejoin), this keeps text as is and escapes only what a YAML reader would reject or fold.
    """
    text = json.dumps(value, ensure_ascii=False)
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


@functools.cache
def _environment() -> jinja2.Environment:
    import importlib.resources

    import jinja2

    templates = importlib.resources.files("orchestrator.manifests")
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: templates.joinpath(name).read_text(encoding="utf-8")),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["tojson"] = yaml_scalar
    return env


def _render_template(template: str, context: dict[str, Any]) -> dict[str, Any]:
    import yaml

    text = _environment().get_template(template).render(context)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(text, Loader=loader)


def resolve_api(spec: JobSpec, api: str | None = None) -> str:
    """The API `render` renders: `api`, else spec.api; auto is a PyTorchJob (no cluster is asked here;
    `orch submit` resolves auto by discovery before calling render)."""
    chosen = api or spec.api
    return "pytorchjob" if chosen == "auto" else chosen


def render(spec: JobSpec, *, name: str | None = None, api: str | None = None) -> list[dict[str, Any]]:
    """The objects that run `spec` on Kubernetes, in apply order: ConfigMap (train jobs only), the job
    (PyTorchJob; or TrainingRuntime + TrainJob), PodMonitor (when metrics are enabled). `name` overrides
    spec.name (e.g. a unique submit name); `api` overrides spec.api (pytorchjob | trainjob | auto)."""
    from orchestrator.spec import api_problem, trainjob_name_problem

    if not spec.image:
        raise SpecError("required to render or submit (the training image the pods run)", field="image")
    chosen = resolve_api(spec, api)
    if chosen not in APIS:
        raise SpecError(f"{chosen!r} is not one of auto, pytorchjob, trainjob", field="api")
    if problem := api_problem(spec, chosen):
        raise SpecError(problem[1], field=problem[0])
    if chosen == "trainjob" and name and (too_long := trainjob_name_problem(name, spec.nodes)):
        raise SpecError(too_long, field="name")
    if found := tracking.spec_problem(spec, local=False):
        raise SpecError(found[1], field=".".join(found[0]))
    context = _context(spec, name or spec.name, api=chosen)
    objects = []
    if spec.train is not None:
        objects.append(_render_template(TEMPLATES["configmap"], context))
    if chosen == "pytorchjob":
        job = _render_template(TEMPLATES["pytorchjob"], context)
        if spec.pod_overrides:
            overrides = portable_overrides(spec.pod_overrides, naming.CONTAINER_NAME)
            for replica in job["spec"]["pytorchReplicaSpecs"].values():
                pod = replica["template"]
                pod["spec"] = merge_overrides(pod["spec"], overrides)
        objects.append(job)
    else:
        context.update(_trainjob_context(spec, context))
        if spec.runtime is None:
            objects.append(_render_template(TEMPLATES["trainingruntime"], context))
        objects.append(_render_template(TEMPLATES["trainjob"], context))
    if spec.metrics.enabled:
        objects.append(_render_template(TEMPLATES["podmonitor"], context))
    return objects


def _context(spec: JobSpec, name: str, *, api: str = "pytorchjob") -> dict[str, Any]:
    """Every value the templates place, computed from the spec."""
    training_labels = {**spec.labels, **naming.standard_labels(name, naming.COMPONENT_TRAINING)}
    monitor_labels = {**spec.labels, **naming.standard_labels(name, naming.COMPONENT_MONITORING)}
    if spec.metrics.release:
        monitor_labels[naming.LABEL_PROMETHEUS_RELEASE] = spec.metrics.release
    return {
        "name": name,
        "namespace": spec.namespace,
        "job_labels": {**training_labels, **_kueue_labels(spec)},
        "pod_labels": training_labels,
        "annotations": {
            **spec.annotations,
            **tracking_annotation(spec, name, api),
            **_output_annotation(spec),
        },
        "pod_annotations": {
            **spec.annotations,
            **_topology_annotations(spec, name, api),
            **_volcano_queue_annotation(spec),
        },
        "nproc_per_node": str(spec.procs_per_node),
        "run_policy": _run_policy(spec),
        "elastic_policy": _elastic_policy(spec),
        "replicas": _replicas(spec),
        "restart_policy": RESTART_POLICIES[spec.restart.policy or "on-failure"],
        "pod_security_context": {"seccompProfile": {"type": "RuntimeDefault"}},
        "termination_grace_seconds": termination_grace_seconds(spec),
        "container_security_context": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "service_account": spec.service_account,
        "priority_class": spec.scheduling.priority_class,
        "scheduler_name": spec.scheduling.scheduler,
        "node_selector": dict(spec.node_selector),
        "tolerations": [_toleration(t) for t in spec.tolerations],
        "affinity": spec.affinity,
        "image_pull_secrets": [{"name": secret} for secret in spec.image_pull_secrets],
        "container_name": naming.CONTAINER_NAME,
        "image": spec.image,
        "command": torchrun_command(spec),
        "env": _env(spec, name, api),
        "ports": _ports(spec),
        "resources": _resources(spec),
        "volume_mounts": _volume_mounts(spec),
        "volumes": _volumes(spec, name),
        "config_map_name": naming.config_map_name(name),
        "config_labels": {**spec.labels, **naming.standard_labels(name, naming.COMPONENT_CONFIG)},
        "train_config_key": naming.TRAIN_CONFIG_KEY,
        "train_json": train_json(spec),
        "monitor_labels": monitor_labels,
        "monitor_selector": {naming.LABEL_JOB: name},
        "pod_target_labels": [naming.LABEL_JOB],
        "metrics_port_name": naming.METRICS_PORT_NAME,
        # A named runtime's pods do not declare orch's port (runtimePatches have no ports): the PodMonitor
        # scrapes the pod IP at the port number instead (see podmonitor.yaml.j2).
        "metrics_port_number": spec.metrics.port if spec.runtime is not None and api == "trainjob" else None,
        "training_container": naming.TRAINJOB_CONTAINER_NAME,
        "metrics_interval": f"{spec.metrics.interval}s",
    }


# --- queues and gangs (both APIs) ---------------------------------------------------------------------------


def kueue_queue(spec: JobSpec) -> str | None:
    """The Kueue LocalQueue: scheduling.queue, unless Volcano schedules the job (then it is Volcano's queue)."""
    if spec.scheduling.scheduler == naming.SCHEDULER_VOLCANO:
        return None
    return spec.scheduling.queue


def gang_scheduler(spec: JobSpec) -> str | None:
    """ "volcano" or "coscheduling" when a PodGroup gang-schedules the pods, else None."""
    if not spec.gang:
        return None
    return {
        naming.SCHEDULER_VOLCANO: "volcano",
        naming.SCHEDULER_COSCHEDULING: "coscheduling",
    }.get(spec.scheduling.scheduler or "")


def _kueue_labels(spec: JobSpec) -> dict[str, str]:
    """On the job object: Kueue creates one Workload for it and admits all its pods at once."""
    queue = kueue_queue(spec)
    if queue is None:
        return {}
    labels = {naming.LABEL_KUEUE_QUEUE: queue}
    if spec.scheduling.priority:
        labels[naming.LABEL_KUEUE_PRIORITY] = spec.scheduling.priority
    return labels


def _output_annotation(spec: JobSpec) -> dict[str, str]:
    """output.url on the job object, for `orch status` (the pods get it as ORCH_OUTPUT_URL)."""
    if spec.output is None or spec.output.url is None:
        return {}
    return {naming.ANNOTATION_OUTPUT_URL: spec.output.url}


def _topology_annotations(spec: JobSpec, name: str, api: str) -> dict[str, str]:
    """Kueue topology-aware scheduling, on every pod template. A PyTorchJob with a Master and Workers has
    two PodSets: one podset-group-name makes Kueue place both in one domain of the required level. A TrainJob
    (one replicated job, one PodSet) never gets one: Kueue refuses a group that is not of exactly 2 PodSets
    (pkg/controller/jobframework/tas_validation.go ValidatePodSetGroupingTopology)."""
    topology = spec.scheduling.topology
    if topology is None or kueue_queue(spec) is None:
        return {}
    if topology.required:
        annotations = {naming.ANNOTATION_KUEUE_REQUIRED_TOPOLOGY: topology.required}
        if api == "pytorchjob" and _master_and_workers(spec):
            annotations[naming.ANNOTATION_KUEUE_PODSET_GROUP] = name
        return annotations
    return {naming.ANNOTATION_KUEUE_PREFERRED_TOPOLOGY: str(topology.preferred)}


def _volcano_queue_annotation(spec: JobSpec) -> dict[str, str]:
    """On every pod template when Volcano schedules the job in a queue. A pod without a PodGroup of its own
    (one-pod jobs, `gang: false`) gets one from Volcano's podgroup controller, whose queue is this pod
    annotation, else "default" (volcano pkg/controllers/podgroup/pg_controller_handler.go); the queue of a
    gang's PodGroup comes from the job (schedulingPolicy / the runtime's template annotation)."""
    if spec.scheduling.scheduler != naming.SCHEDULER_VOLCANO or not spec.scheduling.queue:
        return {}
    return {naming.ANNOTATION_VOLCANO_QUEUE: spec.scheduling.queue}


def _scheduling_policy(spec: JobSpec) -> dict[str, Any] | None:
    """PyTorchJob runPolicy.schedulingPolicy: the v1 operator (run with --gang-scheduler-name) creates a
    PodGroup from it; minAvailable is every pod of the job."""
    scheduler = gang_scheduler(spec)
    if scheduler is None:
        return None
    policy: dict[str, Any] = {"minAvailable": spec.nodes}
    if scheduler == "volcano":
        if spec.scheduling.queue:
            policy["queue"] = spec.scheduling.queue
        if spec.scheduling.priority_class:
            policy["priorityClass"] = spec.scheduling.priority_class
    return policy


def warnings(spec: JobSpec, api: str | None = None) -> list[str]:
    """What `orch submit` should tell the user once before creating the job (pure; empty when all is well):
    pods that may be scheduled partially, and checkpoints that a restart would lose."""
    chosen = resolve_api(spec, api)
    found = []
    unguarded = kueue_queue(spec) is None and gang_scheduler(spec) is None
    if spec.nodes > 1 and spec.scheduling.gang is not False and spec.runtime is None and unguarded:
        found.append(
            f"nothing prevents partial scheduling: {spec.nodes} pods may start while others wait for "
            "room, holding their GPUs in the rendezvous; set scheduling.queue (Kueue) or "
            f"scheduling.scheduler: {naming.SCHEDULER_VOLCANO} | {naming.SCHEDULER_COSCHEDULING} "
            "(docs/cluster.md, Queues, gangs and recovery)"
        )
    if _restarts_replace_pods(spec, chosen) and not _output_on_volume(spec):
        found.append(
            f"restart.policy {spec.restart.policy} replaces pods, and the output dir {naming.OUTPUT_DIR} "
            "(checkpoints) is an emptyDir that goes with them: a restarted job starts from step 0; set "
            "output: {pvc: CLAIM}, output: {url: s3://BUCKET/PREFIX} or a train.checkpoint.dir on a pvc volume"
        )
    if chosen == "pytorchjob" and spec.restart.policy == "exit-code" and spec.output is None:
        found.append(
            "restart.policy exit-code on a PyTorchJob: the v1 operator recreates a pod that exits >= 128 "
            f"without limit; orch's launcher counts the starts in {naming.OUTPUT_DIR}, an emptyDir that goes "
            f"with each pod, so backoff_limit ({spec.restart.backoff_limit}) does not bound the retries; set "
            "output: {pvc: CLAIM}, or a deadline"
        )
    if chosen == "pytorchjob" and spec.restart.policy == "job" and spec.nodes > 1:
        found.append(pytorchjob_max_restarts_meaning(spec))
    return found


def pytorchjob_max_restarts_meaning(spec: JobSpec) -> str:
    """What restart.max_restarts bounds on a PyTorchJob, in one line. Each pod's torchrun agent counts only
    its own workers' failures (a peer's restart is a membership change, which does not count: torch's
    agent/server/api.py `_invoke_run`), and an agent that gave up exits and is restarted by the kubelet
    with a fresh count, until the container restarts summed over the pods pass backoffLimit."""
    restarts, backoff = spec.restart.max_restarts, _backoff_limit(spec)
    most = restarts * (spec.nodes + backoff) + backoff
    return (
        f"restart.max_restarts {restarts} on a PyTorchJob bounds each pod's torchrun agent, not the job: the "
        f"{spec.nodes} pods may re-form the group up to {most} times (max_restarts x (nodes + backoffLimit "
        f"{backoff}) + backoffLimit); a TrainJob restarts the whole job exactly {restarts} times"
    )


def _restarts_replace_pods(spec: JobSpec, api: str) -> bool:
    """Whether a restart creates new pods (a new emptyDir) rather than restarting containers in place:
    TrainJob's whole-JobSet restart, and ExitCode / restartPolicy Never retries on both APIs."""
    if spec.runtime is not None:
        return False  # the runtime decides; orch cannot tell
    if spec.restart.policy == "exit-code":
        return True
    return api == "trainjob" and spec.restart.policy == "job"


def _output_on_volume(spec: JobSpec) -> bool:
    """Whether what a restart must find again lives on a PersistentVolumeClaim (or an object store)."""
    if spec.output is not None:
        return True
    claims = [v.mount.rstrip("/") + "/" for v in spec.volumes if v.pvc is not None and not v.read_only]
    if spec.train is None:
        return bool(claims)  # a command job may write anywhere; a writable claim is the best sign
    directory = spec.train.checkpoint.dir
    return bool(directory and directory.startswith("/") and any(directory.startswith(c) for c in claims))


# --- Trainer v2: TrainingRuntime + TrainJob ---------------------------------------------------------------------

EXIT_CODES_PERMANENT = list(range(1, 128))  # restart.policy exit-code: 1-127 fail the job, signals retry


def _trainjob_context(spec: JobSpec, context: dict[str, Any]) -> dict[str, Any]:
    """The TrainJob (what runs: image, command, env, sizes) and, unless `runtime:` names one, the
    TrainingRuntime orch renders beside it (how the pods look: the whole JobSet template)."""
    name = context["name"]
    trainer: dict[str, Any] = {
        "image": spec.image,
        "command": context["command"],
        "env": context["env"],
        "numNodes": spec.nodes,
        "numProcPerNode": spec.procs_per_node,
    }
    if resources := _resources_per_node(spec, context):
        trainer["resourcesPerNode"] = resources
    job_spec: dict[str, Any] = {
        "runtimeRef": {
            "name": spec.runtime or name,
            "apiGroup": naming.TRAINER_API_GROUP,
            "kind": "ClusterTrainingRuntime" if spec.runtime else "TrainingRuntime",
        },
        "trainer": trainer,
    }
    if kueue_queue(spec) is not None:
        job_spec["suspend"] = True  # Kueue resumes it once the whole Workload is admitted
    if spec.deadline is not None:
        job_spec["activeDeadlineSeconds"] = spec.deadline
    if spec.runtime is not None:
        job_spec["runtimePatches"] = [_runtime_patch(spec, context)]
    return {
        "trainjob_spec": job_spec,
        "runtime_labels": {**spec.labels, **naming.standard_labels(name, naming.COMPONENT_RUNTIME)},
        "runtime_spec": None if spec.runtime else _runtime_spec(spec, context),
    }


def _resources_per_node(spec: JobSpec, context: dict[str, Any]) -> dict[str, Any]:
    """The `node` container's resources: orch's (GPUs, cpu, memory) merged with what pod_overrides add to the
    main container (EFA, RDMA, hugepages...). All of them go in trainer.resourcesPerNode, because Trainer
    v2.1/v2.2 replace the runtime container's resources with it (pkg/runtime/framework/plugins/jobset/
    builder.go Trainer: `WithResources(requirements)`; v2.3 merges), so extras left in the runtime were lost."""
    resources = context["resources"] or {}
    overrides = portable_overrides(spec.pod_overrides, naming.TRAINJOB_CONTAINER_NAME)
    containers = overrides.get("containers")
    for container in containers if isinstance(containers, list) else []:
        if isinstance(container, dict) and container.get("name") == naming.TRAINJOB_CONTAINER_NAME:
            extra = container.get("resources")
            if isinstance(extra, dict):
                resources = merge_overrides(resources, extra)
    return resources if isinstance(resources, dict) else {}


def _runtime_spec(spec: JobSpec, context: dict[str, Any]) -> dict[str, Any]:
    """A TrainingRuntime spec shaped like Trainer v2's torch-distributed runtime (one replicated job `node`,
    labelled ancestor=trainer, container `node`), with orch's whole pod template and restart rules."""
    restart_policy, job_rules, failure_policy = _jobset_restart(spec)
    pod = {
        "restartPolicy": restart_policy,
        **_pod_fields(context),
        **_grace(context),
        "containers": [
            {
                "name": naming.TRAINJOB_CONTAINER_NAME,
                "image": spec.image,
                "command": context["command"],
                **({"ports": [_metrics_port(spec)]} if spec.metrics.enabled else {}),
                "securityContext": context["container_security_context"],
                "volumeMounts": context["volume_mounts"],
            }
        ],
        "volumes": context["volumes"],
    }
    if context["priority_class"]:
        pod["priorityClassName"] = context["priority_class"]
    if context["scheduler_name"]:
        pod["schedulerName"] = context["scheduler_name"]
    if spec.pod_overrides:
        pod = merge_overrides(pod, portable_overrides(spec.pod_overrides, naming.TRAINJOB_CONTAINER_NAME))
        for container in pod["containers"]:
            if isinstance(container, dict) and container.get("name") == naming.TRAINJOB_CONTAINER_NAME:
                container.pop("resources", None)  # in trainer.resourcesPerNode (see _resources_per_node)
    pod_metadata: dict[str, Any] = {"labels": context["pod_labels"]}
    if context["pod_annotations"]:
        pod_metadata["annotations"] = context["pod_annotations"]
    jobset: dict[str, Any] = {
        "replicatedJobs": [
            {
                "name": naming.TRAINJOB_REPLICATED_JOB,
                "replicas": 1,
                "template": {
                    "metadata": {
                        "labels": {naming.LABEL_TRAINJOB_ANCESTOR: naming.TRAINJOB_ANCESTOR_TRAINER}
                    },
                    "spec": {**job_rules, "template": {"metadata": pod_metadata, "spec": pod}},
                },
            }
        ]
    }
    if failure_policy is not None:
        jobset["failurePolicy"] = failure_policy
    runtime: dict[str, Any] = {"mlPolicy": {"numNodes": spec.nodes, "torch": {}}}
    scheduler = gang_scheduler(spec)
    if scheduler == "volcano":
        runtime["podGroupPolicy"] = {"volcano": {}}
    elif scheduler == "coscheduling":
        runtime["podGroupPolicy"] = {"coscheduling": {}}
    template: dict[str, Any] = {"spec": jobset}
    if scheduler == "volcano" and spec.scheduling.queue:
        # Trainer v2's volcano plugin reads the PodGroup's queue from the JobSet template's annotations.
        template["metadata"] = {"annotations": {naming.ANNOTATION_VOLCANO_QUEUE: spec.scheduling.queue}}
    runtime["template"] = template
    return runtime


def _grace(context: dict[str, Any]) -> dict[str, Any]:
    grace = context["termination_grace_seconds"]
    return {} if grace is None else {"terminationGracePeriodSeconds": grace}


def _pod_fields(context: dict[str, Any]) -> dict[str, Any]:
    """The optional pod spec fields both the runtime and a runtime patch carry."""
    fields: dict[str, Any] = {"securityContext": context["pod_security_context"]}
    if context["service_account"]:
        fields["serviceAccountName"] = context["service_account"]
    for key, value in (
        ("nodeSelector", context["node_selector"]),
        ("tolerations", context["tolerations"]),
        ("affinity", context["affinity"]),
        ("imagePullSecrets", context["image_pull_secrets"]),
    ):
        if value:
            fields[key] = value
    return fields


def _jobset_restart(spec: JobSpec) -> tuple[str, dict[str, Any], dict[str, Any] | None]:
    """(pod restartPolicy, batch Job fields, JobSet failurePolicy) for restart.policy.

    job: a failed pod fails its Job at once (Never, backoffLimit 0) and JobSet's failurePolicy recreates
    every Job of the JobSet, so all pods restart together, at most max_restarts times.
    on-failure: the kubelet restarts the failed container in place; backoffLimit bounds the Job.
    exit-code: the v1 ExitCode policy as a podFailurePolicy: exit codes 1-127 fail the Job at once, others
    (signals, OOM kills) count against backoffLimit and get a new pod.
    never: one failure fails the job."""
    policy = spec.restart.policy
    if policy == "job":
        return "Never", {"backoffLimit": 0}, {"maxRestarts": spec.restart.max_restarts}
    if policy == "exit-code":
        rules = [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": naming.TRAINJOB_CONTAINER_NAME,
                    "operator": "In",
                    "values": EXIT_CODES_PERMANENT,
                },
            }
        ]
        return (
            "Never",
            {"backoffLimit": spec.restart.backoff_limit, "podFailurePolicy": {"rules": rules}},
            None,
        )
    if policy == "never":
        return "Never", {"backoffLimit": 0}, None
    return "OnFailure", {"backoffLimit": spec.restart.backoff_limit}, None


def _runtime_patch(spec: JobSpec, context: dict[str, Any]) -> dict[str, Any]:
    """runtimePatches entry for a ClusterTrainingRuntime (`runtime: NAME`): the pod fields the TrainJob CRD
    lets a patch set. Env, image, command and resources travel in spec.trainer; what a patch cannot carry was
    refused by spec.api_problem."""
    pod: dict[str, Any] = {
        **_pod_fields(context),
        "containers": [
            {
                "name": naming.TRAINJOB_CONTAINER_NAME,
                "securityContext": context["container_security_context"],
                "volumeMounts": context["volume_mounts"],
            }
        ],
        "volumes": context["volumes"],
    }
    if spec.pod_overrides:
        pod = merge_overrides(pod, portable_overrides(spec.pod_overrides, naming.TRAINJOB_CONTAINER_NAME))
    pod_metadata: dict[str, Any] = {"labels": context["pod_labels"]}
    if context["pod_annotations"]:
        pod_metadata["annotations"] = context["pod_annotations"]
    replicated_job = {
        "name": naming.TRAINJOB_REPLICATED_JOB,
        "template": {"spec": {"template": {"metadata": pod_metadata, "spec": pod}}},
    }
    return {
        "manager": naming.RUNTIME_PATCH_MANAGER,
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [replicated_job]}}},
    }


TORCHRUN_SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
STOP_MARGIN_SECONDS = 30  # past train.checkpoint.on_stop: torchrun's own exit, the tracking deadline


def termination_grace_seconds(spec: JobSpec) -> int | None:
    """The pods' terminationGracePeriodSeconds: long enough for the trainer's stop checkpoint after a
    SIGTERM (train.checkpoint.on_stop) and torchrun's exit; None (Kubernetes' 30 s) for command jobs and
    on_stop: false. Not rendered into a ClusterTrainingRuntime's runtimePatches (`runtime: NAME`): a patch
    accepts the field only from Trainer v2.3, so that runtime's own pod template decides."""
    if spec.train is None or not spec.train.checkpoint.on_stop:
        return None
    return spec.train.checkpoint.on_stop + STOP_MARGIN_SECONDS


def train_json(spec: JobSpec) -> str | None:
    """The ConfigMap's train.json: what `python -m orchestrator.trainer --config` reads."""
    return runtime_env.train_json(spec.train) if spec.train is not None else None


LAUNCHER = ["python", "-m", "orchestrator.launch"]  # torchrun whose exit code keeps the failure's class


def torchrun_command(spec: JobSpec) -> list[str]:
    """torchrun with the per-pod process count; nnodes, node rank and the rendezvous come from the
    operator's PET_* env. A `command:` job runs as given (`--no-python`: torchrun execs it directly).

    Train jobs (orch's image) start torchrun through orchestrator.launch, whose exit code tells a signal or
    a SIGTERM of the pod (>= 128, retryable) from a program error (1-127): plain torchrun exits 1 for both.
    A `command:` job may bring an image without orch, so it gets the launcher only where the exit code
    decides something (restart.policy exit-code; docs/jobspec.md says its image needs orch then)."""
    needs_launcher = spec.train is not None or spec.restart.policy == "exit-code"
    launcher = [*(LAUNCHER if needs_launcher else ["torchrun"]), f"--nproc-per-node={spec.procs_per_node}"]
    if spec.command is not None:
        return [*launcher, "--no-python", *spec.command]
    return [*launcher, "-m", TRAINER_MODULE, "--config", naming.TRAIN_CONFIG_PATH]


def _elastic_agent(spec: JobSpec) -> bool:
    """Whether torchrun runs as an elastic agent: `elastic:` jobs, and restart.policy job on a PyTorchJob
    (min = max = nodes: any failed process makes every agent restart its workers and re-form the group)."""
    return spec.elastic is not None or spec.restart.policy == "job"


def _master_and_workers(spec: JobSpec) -> bool:
    return not _elastic_agent(spec) and spec.nodes > 1


def _replicas(spec: JobSpec) -> list[dict[str, Any]]:
    if _elastic_agent(spec):
        # Elastic jobs are Workers only: the operator points PET_RDZV_ENDPOINT at worker-0 and scales Workers.
        return [{"type": "Worker", "count": spec.nodes}]
    replicas = [{"type": "Master", "count": 1}]
    if spec.nodes > 1:  # Worker replicas: 0 makes the operator create and delete a pod in a loop
        replicas.append({"type": "Worker", "count": spec.nodes - 1})
    return replicas


def _backoff_limit(spec: JobSpec) -> int:
    """runPolicy.backoffLimit: container restarts (summed over the pods) before the job fails. Under
    restart.policy job a restart that goes through the pods (an agent gave up, a pod was killed) restarts up
    to every pod once, so the bound is max_restarts x nodes."""
    if spec.restart.policy == "job":
        return spec.restart.max_restarts * spec.nodes
    return spec.restart.backoff_limit


def _run_policy(spec: JobSpec) -> dict[str, Any]:
    policy: dict[str, Any] = {"cleanPodPolicy": CLEAN_POD_POLICY, "backoffLimit": _backoff_limit(spec)}
    if spec.deadline is not None:
        policy["activeDeadlineSeconds"] = spec.deadline
    if spec.ttl_after_finished is not None:
        policy["ttlSecondsAfterFinished"] = spec.ttl_after_finished
    if (scheduling := _scheduling_policy(spec)) is not None:
        policy["schedulingPolicy"] = scheduling
    if kueue_queue(spec) is not None:
        # Created suspended: Kueue resumes the job once its Workload (every pod) is admitted.
        policy["suspend"] = True
    return policy


def _elastic_policy(spec: JobSpec) -> dict[str, Any] | None:
    if spec.elastic is None:
        if spec.restart.policy != "job":
            return None
        return {
            "rdzvBackend": "c10d",
            "minReplicas": spec.nodes,
            "maxReplicas": spec.nodes,
            "maxRestarts": spec.restart.max_restarts,
        }
    return {
        "rdzvBackend": "c10d",
        "minReplicas": spec.elastic.min_nodes,
        "maxReplicas": spec.elastic.max_nodes,
        "maxRestarts": spec.elastic.max_restarts,
    }


def _toleration(toleration: Any) -> dict[str, Any]:
    rendered = {
        "key": toleration.key,
        "operator": toleration.operator,
        "value": toleration.value,
        "effect": toleration.effect,
        "tolerationSeconds": toleration.toleration_seconds,
    }
    return {k: v for k, v in rendered.items() if v is not None}


def _env(spec: JobSpec, name: str, api: str = "pytorchjob") -> list[dict[str, Any]]:
    """orch's runtime facts first, then the user's env (which wins on a clash), then secretKeyRefs."""
    output_url = spec.output.url if spec.output is not None else None  # the object store keeps the outputs
    runtime = runtime_env.RuntimeEnv.for_job(
        spec, name=name, output_dir=naming.OUTPUT_DIR, output_url=output_url, api_kind=API_KINDS[api]
    )
    values = runtime.to_env()
    if spec.train is not None and spec.train.cuda_alloc_conf:
        values["PYTORCH_CUDA_ALLOC_CONF"] = spec.train.cuda_alloc_conf
    retry_limit = _retry_limit(spec, api)
    if retry_limit is not None:
        values[launch.ENV_RETRY_LIMIT] = str(retry_limit)
    if spec.train is not None and spec.train.checkpoint.on_stop:
        # torchrun's wait for its ranks' stop checkpoint before it SIGKILLs them (read from torch 2.12)
        values[TORCHRUN_SHUTDOWN_TIMEOUT_ENV] = str(spec.train.checkpoint.on_stop)
    values.update(spec.env)
    env: list[dict[str, Any]] = [
        {"name": k, "value": v} for k, v in values.items() if k not in spec.secret_env
    ]
    if (
        retry_limit is not None
    ):  # the start count is kept per submission (orch submit annotates the pod templates)
        env.append(
            {
                "name": launch.ENV_SUBMISSION,
                "valueFrom": {
                    "fieldRef": {"fieldPath": f"metadata.annotations['{naming.ANNOTATION_SUBMISSION}']"}
                },
            }
        )
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}}
        for k, ref in {**_tracking_secrets(spec), **spec.secret_env}.items()
    ]
    if spec.tracking.mlflow is not None and runtime_env.ENV_NAMESPACE not in {*spec.env, *spec.secret_env}:
        env.append(
            {
                "name": runtime_env.ENV_NAMESPACE,
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            }
        )
    return env


def _retry_limit(spec: JobSpec, api: str) -> int | None:
    """ORCH_RETRY_LIMIT for orchestrator.launch: a PyTorchJob's exit-code retries, which the v1 operator
    does not bound itself (orchestrator/launch.py). 0 is a limit too, hence None for "none"."""
    if api == "pytorchjob" and spec.restart.policy == "exit-code":
        return spec.restart.backoff_limit
    return None


def _tracking_secrets(spec: JobSpec) -> dict[str, Any]:
    """tracking.mlflow.credentials -> MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN from their Secrets."""
    from orchestrator.spec import MLFLOW_CREDENTIAL_ENV

    if spec.tracking.mlflow is None:
        return {}
    credentials = spec.tracking.mlflow.credentials
    return {
        env_name: getattr(credentials, key)
        for key, env_name in MLFLOW_CREDENTIAL_ENV.items()
        if getattr(credentials, key) is not None
    }


def tracking_annotation(spec: JobSpec, name: str, api: str) -> dict[str, str]:
    """Where the job's run is recorded, for `orch status` (the pods cannot write to their job)."""
    settings = runtime_env.TrackingSettings.for_job(spec, name=name, api_kind=API_KINDS[api])
    if not settings.enabled:
        return {}
    record: dict[str, Any] = {}
    if settings.mlflow:
        record["mlflow"] = {
            # validation refuses a URI with a credential; redacted again so none can reach the annotation
            "tracking_uri": redact_url(settings.mlflow_tracking_uri)
            if settings.mlflow_tracking_uri
            else None,
            "experiment": settings.mlflow_experiment,
            "run_name": settings.mlflow_run_name,
        }
    if settings.tensorboard_dir:
        record["tensorboard"] = f"{naming.OUTPUT_DIR}/{settings.tensorboard_dir}"
    return {naming.ANNOTATION_TRACKING: json.dumps(record, separators=(",", ":"))}


def _ports(spec: JobSpec) -> list[dict[str, Any]]:
    ports = [{"name": naming.RDZV_PORT_NAME, "containerPort": naming.RDZV_PORT, "protocol": "TCP"}]
    if spec.metrics.enabled:
        ports.append(_metrics_port(spec))
    return ports


def _metrics_port(spec: JobSpec) -> dict[str, Any]:
    return {"name": naming.METRICS_PORT_NAME, "containerPort": spec.metrics.port, "protocol": "TCP"}


def _resources(spec: JobSpec) -> dict[str, Any]:
    """CPU is requested, not limited (a CPU limit throttles DataLoader and NCCL threads); memory and GPUs are
    both requested and limited. The /dev/shm emptyDir counts against the memory limit."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if spec.resources.cpu:
        requests["cpu"] = spec.resources.cpu
    if spec.resources.memory:
        requests["memory"] = limits["memory"] = spec.resources.memory
    if spec.gpus_per_node:
        requests[naming.GPU_RESOURCE] = limits[naming.GPU_RESOURCE] = str(spec.gpus_per_node)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def shm_size(spec: JobSpec) -> str:
    """/dev/shm sizeLimit: resources.shm, else 2Gi per GPU (1Gi on a CPU pod). Pods get 64M without it."""
    if spec.resources.shm:
        return spec.resources.shm
    return f"{SHM_PER_GPU_GI * spec.gpus_per_node}Gi" if spec.gpus_per_node else SHM_CPU_DEFAULT


def _volume_mounts(spec: JobSpec) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [{"name": VOLUME_SHM, "mountPath": "/dev/shm"}]
    if spec.train is not None:
        mounts.append({"name": VOLUME_CONFIG, "mountPath": naming.CONFIG_DIR, "readOnly": True})
    output = {"name": VOLUME_OUTPUT, "mountPath": naming.OUTPUT_DIR}
    if spec.output is not None and spec.output.pvc is not None:
        output["subPath"] = spec.output.sub_path or spec.name
    mounts.append(output)
    for volume in spec.volumes:
        mount: dict[str, Any] = {"name": volume.name, "mountPath": volume.mount}
        if volume.read_only:
            mount["readOnly"] = True
        mounts.append(mount)
    return mounts


def _volumes(spec: JobSpec, name: str) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": VOLUME_SHM, "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(spec)}}
    ]
    if spec.train is not None:
        volumes.append({"name": VOLUME_CONFIG, "configMap": {"name": naming.config_map_name(name)}})
    if spec.output is not None and spec.output.pvc is not None:
        volumes.append({"name": VOLUME_OUTPUT, "persistentVolumeClaim": {"claimName": spec.output.pvc}})
    else:  # no output, or an object store (output.url): the local side (logs, TensorBoard's files) only
        volumes.append({"name": VOLUME_OUTPUT, "emptyDir": {}})
    for volume in spec.volumes:
        volumes.append({"name": volume.name, **_volume_source(volume)})
    return volumes


def _volume_source(volume: Any) -> dict[str, Any]:
    if volume.pvc is not None:
        claim: dict[str, Any] = {"claimName": volume.pvc}
        if volume.read_only:
            claim["readOnly"] = True
        return {"persistentVolumeClaim": claim}
    if volume.config_map is not None:
        return {"configMap": {"name": volume.config_map}}
    if volume.secret is not None:
        return {"secret": {"secretName": volume.secret}}
    size = volume.empty_dir
    return {"emptyDir": {"sizeLimit": size} if isinstance(size, str) else {}}


MAIN_CONTAINER_NAMES = (naming.CONTAINER_NAME, naming.TRAINJOB_CONTAINER_NAME)


def portable_overrides(overrides: dict[str, Any], main: str) -> dict[str, Any]:
    """pod_overrides for one API: a container named `pytorch` (PyTorchJob's) or `node` (TrainJob's) is orch's
    main container on either API, so one job file's overrides patch the trainer under both."""
    containers = overrides.get("containers")
    if not isinstance(containers, list):
        return overrides
    renamed = [
        {**c, "name": main} if isinstance(c, dict) and c.get("name") in MAIN_CONTAINER_NAMES else c
        for c in containers
    ]
    return {**overrides, "containers": renamed}


def merge_overrides(base: Any, overrides: Any) -> Any:
    """Deep-merge `pod_overrides` into a pod spec, the way `kubectl patch --type strategic` would for the
    fields users touch: mappings merge key by key, `null` deletes a key, lists of named items (containers,
    volumes, env, ports) merge item by item on `name`, any other list or value replaces the old one."""
    if isinstance(base, dict) and isinstance(overrides, dict):
        merged = dict(base)
        for key, value in overrides.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = merge_overrides(merged[key], value)
            else:
                merged[key] = value
        return merged
    if (
        isinstance(base, list)
        and isinstance(overrides, list)
        and _named_items(base)
        and _named_items(overrides)
    ):
        merged_list = list(base)
        index = {item["name"]: i for i, item in enumerate(merged_list)}
        for item in overrides:
            if item["name"] in index:
                merged_list[index[item["name"]]] = merge_overrides(merged_list[index[item["name"]]], item)
            else:
                merged_list.append(item)
        return merged_list
    return overrides


def _named_items(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(item, dict) and "name" in item for item in items)


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """Multi-document YAML, keys in render order (what `kubectl apply -f -` reads)."""
    return _yaml().dump_all(
        objects, Dumper=_dumper(), sort_keys=False, allow_unicode=True, default_flow_style=False, width=100
    )


def _yaml() -> Any:
    import yaml

    return yaml


@functools.cache
def _dumper() -> type:
    """SafeDumper that writes multi-line strings (train.json) as `|` blocks, so the YAML stays readable."""
    yaml = _yaml()

    class Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
        pass

    def represent_str(dumper: Any, value: str) -> Any:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, represent_str)
    return Dumper


def to_json(objects: list[dict[str, Any]]) -> str:
    """One JSON `List` object holding every item (what `kubectl apply -f -` reads)."""
    return (
        json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2, ensure_ascii=False)
        + "\n"
    )
