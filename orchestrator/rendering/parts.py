"""The parts the rendered objects are written from: frozen dataclasses, built once from the validated spec.

`render.render` builds a `JobParts` (the job object's metadata, the pod every replica runs, the ConfigMap's
and the PodMonitor's parts: the pod's in pod.py, the rest in render.py); each kind's Jinja2 template in
manifests/ writes its object from them, and each API module (orchestrator/apis/) adds its own part for its
job object. A field is one attribute here, set where its part is built, and one line in the template that
writes it (manifests/pod.yaml.j2 for the pod). A value that is a whole Kubernetes field (a toleration, an
env item's valueFrom, a volume's source) is kept in the API's shape, as JSON, and placed with `tojson`.
Imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

# The fields of orch's container that an API may carry elsewhere than in the pod (or leave to its runtime).
ContainerField = Literal["image", "command", "env", "ports", "resources"]
EVERY_FIELD: frozenset[ContainerField] = frozenset(get_args(ContainerField))


@dataclass(frozen=True)
class Metadata:
    """An object's metadata (manifests/parts.j2 writes it)."""

    name: str
    namespace: str | None
    labels: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EnvVar:
    """One item of a container's env: a value, or a reference (`value_from`: a fieldRef, a secretKeyRef)."""

    name: str
    value: str | None = None
    value_from: dict[str, Any] | None = None


@dataclass(frozen=True)
class Port:
    name: str
    number: int
    protocol: str = "TCP"


@dataclass(frozen=True)
class Resources:
    """The container's requests and limits (a resource name -> a quantity)."""

    requests: dict[str, str]
    limits: dict[str, str]


@dataclass(frozen=True)
class VolumeMount:
    name: str
    path: str
    read_only: bool = False
    sub_path: str | None = None


@dataclass(frozen=True)
class Volume:
    name: str
    type: str  # the source's field: emptyDir, configMap, persistentVolumeClaim, secret
    source: dict[str, Any]  # that field's value


@dataclass(frozen=True)
class Container:
    """orch's main container, with every field it may carry; an API's `PodLayout` says which travel in the
    pod (a TrainJob passes image, command, env and resources in its spec.trainer instead)."""

    image: str
    command: list[str]
    env: tuple[EnvVar, ...]
    resources: Resources
    ports: tuple[Port, ...]  # orch's own (the exporter's); an API adds its ports in its PodLayout
    volume_mounts: tuple[VolumeMount, ...]


@dataclass(frozen=True)
class Pod:
    """The pod every replica of every API runs (pod.parts builds it, manifests/pod.yaml.j2 writes it)."""

    labels: dict[str, str]
    annotations: dict[str, str]
    service_account: str | None
    priority_class: str | None
    scheduler_name: str | None
    node_selector: dict[str, str]
    tolerations: tuple[dict[str, Any], ...]
    affinity: dict[str, Any] | None  # the job's, with the node affinity that keeps off `excluded_nodes`
    excluded_nodes: tuple[str, ...]  # scheduling.exclude_nodes (pod.template keeps pod_overrides to them)
    image_pull_secrets: tuple[str, ...]
    termination_grace_seconds: int | None  # None: Kubernetes' default (30 s)
    container: Container
    volumes: tuple[Volume, ...]
    overrides: dict[str, Any]  # pod_overrides, merged into the written pod last (pod.template)
    main_containers: tuple[str, ...]  # every API's main container name: an override named so patches orch's


@dataclass(frozen=True)
class PodLayout:
    """How one API holds the pod: its main container's name, which of the container's fields travel in the
    pod (`carries`; the others travel elsewhere, or are the runtime's), the API's own ports (written before
    orch's), the pod's restartPolicy where the API puts it in the pod, and whether the pod may carry
    terminationGracePeriodSeconds (a Trainer runtime patch accepts it only from v2.3)."""

    container: str
    carries: frozenset[ContainerField] = EVERY_FIELD
    api_ports: tuple[Port, ...] = ()
    restart_policy: str | None = None
    grace: bool = True


@dataclass(frozen=True)
class ConfigMap:
    """The ConfigMap holding train.json (manifests/configmap.yaml.j2)."""

    metadata: Metadata
    key: str
    train_json: str


@dataclass(frozen=True)
class PodMonitor:
    """The Prometheus operator's PodMonitor of the job's pods (manifests/podmonitor.yaml.j2)."""

    metadata: Metadata
    selector: dict[str, str]
    pod_target_labels: tuple[str, ...]
    port_name: str
    # Set where the pods do not declare orch's port (a named runtime's runtimePatches have no ports): the
    # PodMonitor then scrapes the pod IP at this number instead.
    port_number: int | None
    container: str  # the training container (whose targets are kept when scraping by number)
    interval: str


@dataclass(frozen=True)
class JobParts:
    """Everything an API writes its objects from (`JobAPI.render`), besides the spec it translates."""

    metadata: Metadata  # the job object's
    pod: Pod
    config_map: ConfigMap | None  # train jobs
    pod_monitor: PodMonitor | None  # metrics enabled
