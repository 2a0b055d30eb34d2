"""`JobAPI`: what each job API module (orchestrator/apis/<key>.py) provides. Imports no API module.

Everything above the API modules (render, submit, status, list, logs, wait, delete, doctor) is written
against this interface only. Its methods are pure functions: of the spec (what the API refuses, the objects
it renders) or of the objects the cluster returned (phase, replicas, pods); the I/O stays in
`orchestrator.cluster`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.kube.kinds import Resource

if TYPE_CHECKING:
    from orchestrator.job.spec import JobSpec
    from orchestrator.rendering.parts import JobParts


@dataclass(frozen=True)
class SetupReads:
    """What `orch doctor --cluster` reads where an API is served, beyond its own kind (cluster/probes.py reads
    them; the API module judges what was found, in `setup_checks`)."""

    crd: str | None = None  # the job kind's CRD, by name (which release's fields the cluster serves)
    cluster_lists: tuple[Resource, ...] = ()  # cluster-scoped kinds whose objects' names matter (runtimes)
    groups: tuple[str, ...] = ()  # API groups it needs served (what runs its jobs: JobSet)


# One line of `orch doctor`: (name, "OK" | "WARN" | "FAIL", detail, fix; "" when OK).
SetupCheck = tuple[str, str, str, str]


class JobAPI(Protocol):
    key: str  # the value of job.yaml's `api:` and of `--api`: "pytorchjob" | "trainjob"
    resource: Resource  # the job object itself
    owned: tuple[Resource, ...]  # other kinds a submit of this API may create, owned by the job
    before: tuple[Resource, ...]  # of those, the ones the job refers to: created first, owned once it exists
    restarts_whole_job: bool  # whether `restarts` counts restarts of every pod together (else of one pod)
    # an admission denial of the job's create that passes once the webhook's cache has caught up (retried)
    transient_denial: re.Pattern[str] | None
    container: str  # the training container: its log is the job's log, its exit code decides the job
    operator: str  # what serves it, in words: "Kubeflow training operator"
    install: str  # one line: how a cluster admin installs it (and where its docs are)
    docs: str  # the upstream docs page of the API (docs tables, `orch doctor`)
    setup_reads: SetupReads  # what `orch doctor --cluster` reads where the API is served

    # --- writing: from a validated spec ---

    def spec_problem(self, spec: JobSpec, name: str) -> tuple[str, str] | None:
        """(field, why) when `spec`, submitted as `name`, cannot run as this API; None when it can."""
        ...

    def render(self, spec: JobSpec, parts: JobParts) -> list[dict[str, Any]]:
        """The API's objects in apply order (the job last), written from the job's parts (the job object's
        metadata, the pod: rendering/parts.py) and the API's own translation of `spec`."""
        ...

    def restarts_replace_pods(self, spec: JobSpec) -> bool:
        """Whether a restart of this job creates new pods (a new emptyDir) rather than restarting containers."""
        ...

    def retry_limit(self, spec: JobSpec) -> int | None:
        """How many exit-code retries orchestrator.launch allows, where the controller does not bound them
        itself; None: the controller does (0 is a limit too)."""
        ...

    def warnings(self, spec: JobSpec) -> list[str]:
        """What the job risks on this API in particular (render.warnings adds the shared ones)."""
        ...

    def groups_pod_sets(self, spec: JobSpec) -> bool:
        """Whether Kueue's topology-aware scheduling needs a podset group (the job has several PodSets)."""
        ...

    # --- reading: from the objects the cluster returned ---

    def unknown_field(self, field: str) -> str | None:
        """One line for a field of the job that the cluster's CRD lacks (an older release): which release
        has it and what to do; None when orch knows nothing better than the server's words."""
        ...

    def pod_selector(self, name: str) -> str:
        """Label selector of the job's pods, with the labels its controller puts on them."""
        ...

    def phase(self, job: dict[str, Any], pods: Sequence[Any] = ()) -> str:
        """orch's phase of the job (status.PHASES), from the API's own conditions (and its pods, where the
        API's conditions do not say enough and they were read)."""
        ...

    def phase_condition(self, job: dict[str, Any], pods: Sequence[Any] = ()) -> dict[str, Any]:
        """The condition that decided the phase (its reason and message explain it); {} if none."""
        ...

    def replicas(self, job: dict[str, Any]) -> dict[str, dict[str, int]]:
        """{role: {active, succeeded, failed}} as the job's status counts them."""
        ...

    def pod_role(self, pod: dict[str, Any]) -> tuple[str, int]:
        """(role, index) of one of the job's pods, from its labels: ("master", 0), ("worker", 2), ("node", 1)."""
        ...

    def node_rank(self, job: dict[str, Any], role: str, index: int) -> int:
        """The torchrun node rank of the pod with this role and index (`orch logs --rank`)."""
        ...

    def display_order(self, role: str, index: int) -> tuple[int, int]:
        """Where the pod with this role and index is listed (`orch status`, `orch logs`), as a sort key: the
        pod the others start from (a master or launcher) first, then by replica index. Not the rank order:
        the ranks of an elastic job's pods are numbered by its rendezvous (`node_rank` says them)."""
        ...

    def nodes_and_gpus(self, job: dict[str, Any]) -> tuple[int, int]:
        """(pods, GPUs per pod) from the job's spec (`orch list`)."""
        ...

    def pod_templates(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """The pod templates the job object itself carries, as they stand in it (changing one changes the
        job); [] where another object holds them (a TrainJob's are in its runtime)."""
        ...

    def related_names(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> set[str]:
        """Names of the objects whose warning events belong to the job (the job, its pods, ...)."""
        ...

    def restarts(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> int:
        """How many times the job (or, where the API cannot restart it whole, a pod of it) restarted."""
        ...

    # --- orch doctor --cluster: from what `setup_reads` found ---

    def setup_checks(self, found: dict[str, Any]) -> list[SetupCheck]:
        """Whether what the API needs besides its kind is there, where the API is served. `found`: `crd` (or
        None with `crd_error`), `lists` ({kind: names, or None with `list_errors`[kind]}), `groups`
        ({group: served versions})."""
        ...
