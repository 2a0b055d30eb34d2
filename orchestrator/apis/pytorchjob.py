"""Kubeflow Training Operator v1: `kubeflow.org/v1` PyTorchJob (Master + Worker replicas).

Writing (manifests/pytorchjob.yaml.j2 writes the `PyTorchJob` part that `render` builds). Facts about the operator v1.9 this
relies on (see docs/jobspec.md):
- it sets PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR/PORT (or PET_RDZV_* when elastic) and
  PET_NPROC_PER_NODE (from spec.nprocPerNode) in every container, and torchrun reads each `--flag` from
  `PET_<FLAG>`; so the command only names what to run, and topology follows the operator (also when the
  Worker replicas are scaled);
- the Master replica must say `replicas: 1`; a job without a Master (elastic) rendezvouses at worker-0;
- the main container must be called `pytorch` and expose the port `pytorchjob-port`.

Reading: the operator's conditions are a history, not a state: `kubectl get`'s `conditions[-1].type` may be a
condition whose status is "False" (Suspended=False after a resume, Running=False after success). So the phase
is the highest-precedence condition whose status is "True" (see `PHASE_PRECEDENCE`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator import naming
from orchestrator.apis.base import JobAPI, SetupCheck, SetupReads
from orchestrator.apis.registry import REGISTRY
from orchestrator.kube import read
from orchestrator.kube.kinds import CONFIGMAP, PODMONITOR, Resource
from orchestrator.rendering import pod, scheduling, templates
from orchestrator.rendering.parts import JobParts, Metadata, PodLayout, Port

if TYPE_CHECKING:
    from orchestrator.job.spec import JobSpec

RESOURCE = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
DOCS = "https://www.kubeflow.org/docs/components/trainer/legacy-v1/"
INSTALL = 'kubectl apply --server-side -k "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.4"'

TEMPLATE = "pytorchjob.yaml.j2"

CONTAINER = "pytorch"  # the operator requires it; logs and exit codes are read from it
RDZV_PORT_NAME = "pytorchjob-port"  # the operator reads MASTER_PORT / the rendezvous port from this port
RDZV_PORT = 23456
# Labels the operator (v1.9) puts on the pods it creates (read-only for orch).
LABEL_OPERATOR_JOB_NAME = "training.kubeflow.org/job-name"
LABEL_REPLICA_TYPE = "training.kubeflow.org/replica-type"  # "master" | "worker" (lower case)
LABEL_REPLICA_INDEX = "training.kubeflow.org/replica-index"

# job: OnFailure, so a pod whose agent gave up (or that was killed) comes back and rejoins the rendezvous.
RESTART_POLICIES = {"job": "OnFailure", "on-failure": "OnFailure", "exit-code": "ExitCode", "never": "Never"}

MAX_SORTED_WORKERS = 100_000  # node_rank sorts the Worker names; more replicas than this is a malformed spec

# Highest first. Once Failed=True the operator stops updating conditions, so it wins over everything.
PHASE_PRECEDENCE = ("Failed", "Succeeded", "Suspended", "Restarting", "Running", "Created")


@dataclass(frozen=True)
class Replica:
    type: str  # "Master" | "Worker"
    count: int


@dataclass(frozen=True)
class GangPolicy:
    """runPolicy.schedulingPolicy: the v1 operator (run with --gang-scheduler-name) creates a PodGroup from
    it; minAvailable is every pod of the job. Volcano's PodGroup also takes the queue and priority class."""

    min_available: int
    queue: str | None = None
    priority_class: str | None = None


@dataclass(frozen=True)
class ElasticPolicy:
    """elasticPolicy: torchrun's c10d rendezvous between min and max Worker replicas."""

    min_replicas: int
    max_replicas: int
    max_restarts: int


@dataclass(frozen=True)
class PyTorchJob:
    """What manifests/pytorchjob.yaml.j2 writes: the job's metadata, its runPolicy and elasticPolicy, and
    one replica spec per replica type, each running `pod_template` (pod.template: overrides merged)."""

    metadata: Metadata
    nproc_per_node: str
    backoff_limit: int
    deadline: int | None  # activeDeadlineSeconds
    ttl_after_finished: int | None
    gang: GangPolicy | None
    suspend: bool  # created suspended: Kueue resumes the job once its Workload (every pod) is admitted
    elastic: ElasticPolicy | None
    replicas: tuple[Replica, ...]
    restart_policy: str
    pod_template: dict[str, Any]


class PyTorchJobAPI:
    key = "pytorchjob"
    resource = RESOURCE
    owned: tuple[Resource, ...] = (CONFIGMAP, PODMONITOR)
    before: tuple[Resource, ...] = ()
    restarts_whole_job = False
    transient_denial: re.Pattern[str] | None = None
    container = CONTAINER
    operator = REGISTRY[key].operator
    install = f"{INSTALL} (see {DOCS})"
    docs = DOCS
    setup_reads = SetupReads()

    # --- writing ---

    def spec_problem(self, spec: JobSpec, name: str) -> tuple[str, str] | None:
        if spec.runtime is not None:
            return "runtime", "names a Trainer v2 ClusterTrainingRuntime; it needs api: trainjob"
        return None

    def render(self, spec: JobSpec, parts: JobParts) -> list[dict[str, Any]]:
        layout = PodLayout(container=CONTAINER, api_ports=(Port(RDZV_PORT_NAME, RDZV_PORT),))
        job = PyTorchJob(
            metadata=parts.metadata,
            nproc_per_node=str(spec.procs_per_node),
            backoff_limit=_backoff_limit(spec),
            deadline=spec.deadline,
            ttl_after_finished=spec.ttl_after_finished,
            gang=_gang_policy(spec),
            suspend=scheduling.kueue_queue(spec) is not None,
            elastic=_elastic_policy(spec),
            replicas=_replicas(spec),
            restart_policy=RESTART_POLICIES[spec.restart.policy or "on-failure"],
            pod_template=pod.template(parts.pod, layout),
        )
        return [templates.render_template(TEMPLATE, job=job)]

    def restarts_replace_pods(self, spec: JobSpec) -> bool:
        """ExitCode retries get a new pod; the other policies restart containers in place."""
        return spec.restart.policy == "exit-code"

    def retry_limit(self, spec: JobSpec) -> int | None:
        """The v1 operator recreates a pod that exits >= 128 without limit under ExitCode (launch.py)."""
        return spec.restart.backoff_limit if spec.restart.policy == "exit-code" else None

    def warnings(self, spec: JobSpec) -> list[str]:
        found = []
        if spec.restart.policy == "exit-code" and (spec.output is None or spec.output.pvc is None):
            found.append(
                "restart.policy exit-code on a PyTorchJob: the v1 operator recreates a pod that exits >= 128 "
                f"without limit; orch's launcher counts the starts in {naming.OUTPUT_DIR}, an emptyDir that "
                f"goes with each pod, so backoff_limit ({spec.restart.backoff_limit}) does not bound the "
                "retries; set output: {pvc: CLAIM}, or a deadline"
            )
        if spec.restart.policy == "job" and spec.nodes > 1:
            found.append(max_restarts_meaning(spec))
        return found

    def groups_pod_sets(self, spec: JobSpec) -> bool:
        return master_and_workers(spec)

    # --- reading ---

    def unknown_field(self, field: str) -> str | None:
        return None  # every field orch writes is in the v1.9 CRD

    def pod_selector(self, name: str) -> str:
        return f"{LABEL_OPERATOR_JOB_NAME}={name}"

    # The status model is imported where a job is read, not with the module: `orch render` reads none (~4 ms).
    def phase(self, job: dict[str, Any], pods: Sequence[Any] = ()) -> str:
        from orchestrator import status

        return status.phase_by_precedence(job, PHASE_PRECEDENCE)

    def phase_condition(self, job: dict[str, Any], pods: Sequence[Any] = ()) -> dict[str, Any]:
        return read.true_condition(job, self.phase(job))

    def replicas(self, job: dict[str, Any]) -> dict[str, dict[str, int]]:
        from orchestrator import status

        counts = read.dig(job, "status", "replicaStatuses")
        counts = counts if isinstance(counts, dict) else {}
        return {str(role): status.replica_counts(c) for role, c in sorted(counts.items())}

    def pod_role(self, pod: dict[str, Any]) -> tuple[str, int]:
        labels = read.dig(pod, "metadata", "labels")
        role = read.text(read.dig(labels, LABEL_REPLICA_TYPE)) or "?"
        return role, read.to_int(read.dig(labels, LABEL_REPLICA_INDEX))

    def node_rank(self, job: dict[str, Any], role: str, index: int) -> int:
        """Master + Workers (static rendezvous): the operator's PET_NODE_RANK, master 0 and worker i i+1.

        Workers only (elastic jobs, restart.policy job): the c10d rendezvous numbers the nodes by their
        sorted addresses, each agent's FQDN, which starts with its pod name NAME-worker-I
        (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py: `enumerate(sorted(state.participants))`),
        so worker-10 is rank 2 of 12. This assumes every Worker replica joined the round (min = max, as
        restart.policy job renders it); with fewer, ranks follow the sorted names of those that did."""
        replica_specs = read.dig(job, "spec", "pytorchReplicaSpecs")
        if read.dig(replica_specs, "Master") is not None:
            return 0 if role == "master" else index + 1
        workers = read.to_int(read.dig(replica_specs, "Worker", "replicas"))
        if not 0 <= index < workers <= MAX_SORTED_WORKERS:
            return index  # not a replica of the spec (or a spec no cluster runs): nothing to sort
        return sorted(range(workers), key=str).index(index)  # NAME-worker-I sorts as str(I) does

    def display_order(self, role: str, index: int) -> tuple[int, int]:
        """The Master replica, then the Workers by index (worker-2 before worker-10, whatever their ranks)."""
        return (0 if role == "master" else 1, index)

    def nodes_and_gpus(self, job: dict[str, Any]) -> tuple[int, int]:
        """Master + Worker replicas, and the `pytorch` container's GPUs."""
        replica_specs = read.dig(job, "spec", "pytorchReplicaSpecs")
        specs = (
            [r for r in replica_specs.values() if isinstance(r, dict)]
            if isinstance(replica_specs, dict)
            else []
        )
        nodes = sum(read.to_int(r.get("replicas")) for r in specs)
        gpus = max((read.template_gpus(r.get("template"), self.container) for r in specs), default=0)
        return nodes, gpus

    def setup_checks(self, found: dict[str, Any]) -> list[SetupCheck]:
        return []  # the operator alone runs PyTorchJobs

    def pod_templates(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """Each replica's template (Master, Worker)."""
        replica_specs = read.dig(job, "spec", "pytorchReplicaSpecs")
        replicas = replica_specs.values() if isinstance(replica_specs, dict) else []
        return [
            r["template"] for r in replicas if isinstance(r, dict) and isinstance(r.get("template"), dict)
        ]

    def related_names(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> set[str]:
        names = {read.text(read.dig(p, "metadata", "name")) for p in pods}
        return {read.text(read.dig(job, "metadata", "name"))} | names

    def restarts(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> int:
        """The operator restarts pods, not the job: the most any pod's `pytorch` container restarted."""
        return max((read.restart_count(p, self.container) for p in pods), default=0)


API: JobAPI = PyTorchJobAPI()


# --- restarts, elasticity and gangs: the spec in the operator's terms --------------------------------------


def max_restarts_meaning(spec: JobSpec) -> str:
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


def elastic_agent(spec: JobSpec) -> bool:
    """Whether torchrun runs as an elastic agent: `elastic:` jobs, and restart.policy job (min = max = nodes:
    any failed process makes every agent restart its workers and re-form the group)."""
    return spec.elastic is not None or spec.restart.policy == "job"


def master_and_workers(spec: JobSpec) -> bool:
    return not elastic_agent(spec) and spec.nodes > 1


def _replicas(spec: JobSpec) -> tuple[Replica, ...]:
    if elastic_agent(spec):
        # Elastic jobs are Workers only: the operator points PET_RDZV_ENDPOINT at worker-0 and scales Workers.
        return (Replica("Worker", spec.nodes),)
    if spec.nodes > 1:  # Worker replicas: 0 makes the operator create and delete a pod in a loop
        return (Replica("Master", 1), Replica("Worker", spec.nodes - 1))
    return (Replica("Master", 1),)


def _backoff_limit(spec: JobSpec) -> int:
    """runPolicy.backoffLimit: container restarts (summed over the pods) before the job fails. Under
    restart.policy job a restart that goes through the pods (an agent gave up, a pod was killed) restarts up
    to every pod once, so the bound is max_restarts x nodes."""
    if spec.restart.policy == "job":
        return spec.restart.max_restarts * spec.nodes
    return spec.restart.backoff_limit


def _gang_policy(spec: JobSpec) -> GangPolicy | None:
    scheduler = scheduling.gang_scheduler(spec)
    if scheduler is None:
        return None
    if scheduler == "volcano":
        return GangPolicy(spec.nodes, spec.scheduling.queue, spec.scheduling.priority_class)
    return GangPolicy(spec.nodes)


def _elastic_policy(spec: JobSpec) -> ElasticPolicy | None:
    if spec.elastic is not None:
        return ElasticPolicy(spec.elastic.min_nodes, spec.elastic.max_nodes, spec.elastic.max_restarts)
    if spec.restart.policy == "job":
        return ElasticPolicy(spec.nodes, spec.nodes, spec.restart.max_restarts)
    return None
