"""The job spec: what one job.yaml may say, as frozen pydantic models. Pure data, no I/O.

Field names are a contract with users, docs and checks: add fields, never rename them. Every model forbids
unknown keys (`fields.Model`) and takes its field types from orchestrator/job/fields.py; the `train:` section
is the trainer's own config (orchestrator/trainer/config.py). `orchestrator.job.loading` turns validation
errors into `job.yaml:LINE:COL: field: message`. Defaults that depend on other fields are pydantic's (a
default factory, a field validator); cross-field rules live in `JobSpec._check_consistency`, each a
`FieldError` with the path it is about, all that fail raised together.
"""

# No `from __future__ import annotations` in the model modules: pydantic would compile each field's
# annotation from its string at import (~3 ms of `orch render`); here the class body evaluates them.
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from orchestrator import naming
from orchestrator.apis.registry import AUTO as API_AUTO
from orchestrator.apis.registry import CHOICES as API_CHOICES
from orchestrator.job.fields import (
    LABEL_VALUE,
    AbsolutePath,
    Dns1123Label,
    Dns1123Name,
    Duration,
    EnvName,
    FieldError,
    ImageRef,
    LabelKey,
    LabelValue,
    Model,
    NodeHostname,
    NonNegativeInt,
    PathStr,
    Port,
    PositiveInt,
    Quantity,
    RelativePath,
    Seconds64,
    SecretKey,
    StringValue,
    matching,
    value_problem,
)
from orchestrator.rendering import pod_shape
from orchestrator.trainer.config import (
    DEFAULT_GPU_SAMPLE_SECONDS,
    DEFAULT_METRICS_PORT,
    ENV_MLFLOW_TRACKING_URI,
    TrainSpec,
)

# --- the pods ------------------------------------------------------------------------------------------------


class Resources(Model):
    cpu: Quantity | None = None
    memory: Quantity | None = None
    shm: Quantity | None = None
    """Size of /dev/shm (a memory emptyDir); NCCL and DataLoader workers need more than the default 64M."""


class SecretRef(Model):
    secret: Dns1123Name
    key: SecretKey


class Volume(Model):
    name: Dns1123Label
    mount: AbsolutePath
    read_only: bool = False
    pvc: Dns1123Name | None = None
    empty_dir: Quantity | bool | None = None
    """A size (20Gi) or true for an unbounded emptyDir."""
    config_map: Dns1123Name | None = None
    secret: Dns1123Name | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "Volume":
        sources = [
            s for s in ("pvc", "empty_dir", "config_map", "secret") if getattr(self, s) not in (None, False)
        ]
        if len(sources) != 1:
            found = ", ".join(sources) or "none"
            raise ValueError(
                f"volume {self.name!r} needs exactly one of pvc, empty_dir, config_map, secret "
                f"(found: {found})"
            )
        return self


class Toleration(Model):
    key: LabelKey | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: Seconds64 | None = None


class Topology(Model):
    """Kueue topology-aware scheduling: keep all of the job's pods within one domain of a node label."""

    required: LabelKey | None = None
    """Node label of the topology level every pod must share (e.g. cloud.provider.com/topology-block)."""
    preferred: LabelKey | None = None
    """Like `required`, but Kueue may spread the pods wider when one domain has no room."""

    @model_validator(mode="after")
    def _one_level(self) -> "Topology":
        if (self.required is None) == (self.preferred is None):
            raise ValueError(
                "set exactly one of required or preferred (a node label naming a topology level)"
            )
        return self


def _kueue_name(what: str) -> Any:
    return Annotated[str, AfterValidator(matching(LABEL_VALUE, what, 63))]


class Scheduling(Model):
    queue: _kueue_name("Kueue queue name") | None = None  # type: ignore[valid-type]
    """Kueue LocalQueue: rendered as the kueue.x-k8s.io/queue-name label; Kueue admits the whole job at once."""
    priority: _kueue_name("Kueue WorkloadPriorityClass name") | None = None  # type: ignore[valid-type]
    """Kueue WorkloadPriorityClass (the kueue.x-k8s.io/priority-class label); needs `queue`."""
    priority_class: Dns1123Name | None = None
    """The pods' Kubernetes PriorityClass (priorityClassName); with Volcano also the PodGroup's."""
    scheduler: Dns1123Name | None = None
    """schedulerName of the pods, e.g. volcano or scheduler-plugins-scheduler (the coscheduler)."""
    gang: bool | None = None
    """All-or-nothing scheduling of the job's pods. None: on for jobs of more than one pod."""
    topology: Topology | None = None
    """Kueue topology-aware scheduling (needs `queue`)."""
    exclude_nodes: list[NodeHostname] = []
    """Nodes the pods must not run on (their kubernetes.io/hostname): a required node affinity NotIn, merged
    into the job's own affinity. `orch submit --replace` adds the replaced job's suspected nodes."""


class Restart(Model):
    policy: Literal["job", "on-failure", "exit-code", "never"] | None = None
    """job: any pod failing restarts every pod of the job together (resume from the last checkpoint), at most
    `max_restarts` times. on-failure: the failed pod alone restarts (`backoff_limit` bounds it). exit-code:
    like on-failure, but only exit codes >= 128 (signals, OOM kills); 1-127 fail the job at once.
    None (the default) is resolved by JobSpec: job for jobs of more than one node (elastic ones excepted),
    else on-failure; a JobSpec's restart.policy is never None."""
    max_restarts: NonNegativeInt = 3
    """policy job: how many times the whole job may restart before it fails."""
    backoff_limit: NonNegativeInt = 3
    """on-failure / exit-code: pod restarts before the job fails."""


class Output(Model):
    """Where what a run keeps (checkpoints, model.pt, summary.json, TensorBoard's events) goes: a volume
    mounted at the pods' output dir (/orch/output, default an emptyDir), or an object store."""

    pvc: Dns1123Name | None = None
    """PersistentVolumeClaim mounted at the output dir (ReadWriteMany for jobs of more than one node)."""
    sub_path: RelativePath | None = None
    """Folder inside the claim. None: the job's name, so jobs sharing a claim keep apart and a resubmitted
    job finds its checkpoints."""
    url: str | None = None
    """Instead of pvc: an object store, `s3://bucket/prefix` (also gs://, az://). Every rank writes its
    part of each checkpoint there, so jobs of any number of nodes need no shared volume. Credentials come
    from secret_env (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), an S3-compatible store's endpoint from
    env (AWS_ENDPOINT_URL). The prefix is the run's: a resubmitted job resumes from it."""

    @model_validator(mode="after")
    def _one_place(self) -> "Output":
        from orchestrator import storage

        if (self.pvc is None) == (self.url is None):
            raise FieldError((), "set exactly one of pvc (a volume) or url (an object store)")
        if self.url is not None and (problem := storage.url_problem(self.url)):
            raise FieldError("url", problem)
        if self.url is not None and self.sub_path is not None:
            raise FieldError("sub_path", "applies to output.pvc; put the folder in output.url")
        return self


class Elastic(Model):
    min_nodes: PositiveInt
    max_nodes: PositiveInt
    max_restarts: NonNegativeInt = 3

    @model_validator(mode="after")
    def _bounds(self) -> "Elastic":
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) is larger than max_nodes ({self.max_nodes})")
        return self


class Metrics(Model):
    enabled: bool = True
    port: Port = DEFAULT_METRICS_PORT
    release: Annotated[str, AfterValidator(matching(LABEL_VALUE, "label value", 63))] | None = (
        "kube-prometheus-stack"
    )
    """`release` label on the PodMonitor: kube-prometheus-stack selects PodMonitors by its Helm release name."""
    interval: Duration = 15
    """Prometheus scrape interval, seconds (written as 15s)."""
    gpu_sample_seconds: Annotated[float, Field(gt=0)] = DEFAULT_GPU_SAMPLE_SECONDS
    peak_tflops: Annotated[float, Field(gt=0)] | None = None
    """Peak dense TFLOP/s of one GPU for MFU, when the built-in table does not know it."""


class MlflowCredentials(Model):
    """Secret keys handed to the MLflow client as MLFLOW_TRACKING_USERNAME / _PASSWORD / _TOKEN."""

    username: SecretRef | None = None
    password: SecretRef | None = None
    token: SecretRef | None = None


def _no_credentials(uri: str) -> str:
    """A tracking URI is written into the job's annotation, run headers and logs: a password (or a token as
    the user) in it would be too. MLflow takes them from its own variables instead."""
    user_info = uri.partition("://")[2].split("/", 1)[0].rpartition("@")[0] if "://" in uri else ""
    if user_info:
        raise ValueError(
            "holds a credential (user:password@ in the URI), which would be written into the job's "
            "annotation and logs: put the password in a Secret and name it in tracking.mlflow.credentials "
            "(orch run: set MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD in the shell)"
        )
    return uri


class MlflowTracking(Model):
    tracking_uri: Annotated[str, Field(min_length=1), AfterValidator(_no_credentials)] | None = None
    """None: the run-time environment says (ORCH_MLFLOW_TRACKING_URI, e.g. from a Secret, or MLFLOW_TRACKING_URI).
    Without credentials: those go in tracking.mlflow.credentials (Secrets)."""
    experiment: Annotated[str, Field(min_length=1)] | None = None
    """None: the job name."""
    run_name: Annotated[str, Field(min_length=1)] | None = None
    """None: the job name (the submitted name on a cluster)."""
    log_model: bool = True
    """Upload model.pt as an artifact of the run (summary.json always is)."""
    credentials: MlflowCredentials = Field(default_factory=MlflowCredentials)


class Tracking(Model):
    """Experiment tracking by the built-in trainer (rank 0): see docs/tracking.md."""

    tensorboard: bool = False
    """Event files under <output dir>/tensorboard/: scalars at every log step and evaluation."""
    mlflow: MlflowTracking | None = None
    """One MLflow run per job: params, metrics, summary.json and model.pt; a resumed job continues it."""


# --- the job -------------------------------------------------------------------------------------------------


if TYPE_CHECKING:
    ApiKey = str
else:
    ApiKey = Literal[API_CHOICES]  # auto and every registered job API (orchestrator/apis/registry.py)


class JobSpec(Model):
    name: Annotated[
        str,
        AfterValidator(
            matching(
                naming.DNS1035_LABEL,
                "job name: a DNS-1035 label (lowercase letters, digits and '-', starting with a letter)",
                naming.MAX_JOB_NAME_LENGTH,
            )
        ),
    ]
    namespace: Dns1123Label | None = None
    api: ApiKey = API_AUTO
    """Which Kubeflow API runs the job: a key of orchestrator/apis/registry.py, or auto (`orch render`: the
    first key; `orch submit`: the first the cluster serves)."""
    runtime: Dns1123Name | None = None
    """TrainJob only: a ClusterTrainingRuntime the platform provides. None: orch renders a TrainingRuntime
    of its own next to the TrainJob."""
    image: ImageRef | None = None
    workspace: Literal[False] | PathStr | None = None
    """The folder (relative to job.yaml) whose files `orch submit --build` ships as a thin layer over `image`
    (orchestrator/imaging/workspace.py). None: job.yaml's folder when it holds the code the job names; false: none."""
    nodes: PositiveInt = 1
    gpus_per_node: NonNegativeInt = 0
    procs_per_node: PositiveInt = Field(default_factory=lambda fields: fields["gpus_per_node"] or 1)
    """Default: gpus_per_node, or 1 without GPUs (from its validated value: `gpus_per_node: "4"` is 4)."""
    resources: Resources = Field(default_factory=Resources)
    train: TrainSpec | None = None
    command: Annotated[list[StringValue], Field(min_length=1)] | None = None
    env: dict[EnvName, StringValue] = {}
    secret_env: dict[EnvName, SecretRef] = {}
    volumes: list[Volume] = []
    node_selector: dict[LabelKey, LabelValue] = {}
    tolerations: list[Toleration] = []
    affinity: dict[str, Any] | None = None
    image_pull_secrets: list[Dns1123Name] = []
    service_account: Dns1123Name | None = None
    scheduling: Scheduling = Field(default_factory=Scheduling)
    elastic: Elastic | None = None  # before restart: restart's default policy depends on it
    restart: Restart = Field(default_factory=Restart)
    output: Output | None = None
    deadline: Duration | None = None
    """activeDeadlineSeconds of the job."""
    ttl_after_finished: Duration | None = None
    metrics: Metrics = Field(default_factory=Metrics)
    tracking: Tracking = Field(default_factory=Tracking)
    labels: dict[LabelKey, LabelValue] = {}
    annotations: dict[LabelKey, StringValue] = {}
    pod_overrides: dict[str, Any] = {}
    """Advanced: deep-merged into the pod template spec of every replica; checked against the shape of a
    Kubernetes pod spec (field names, types, a `name` on items of named lists), like `affinity`."""

    @model_validator(mode="before")
    @classmethod
    def _json_values(cls, data: Any) -> Any:
        if (found := value_problem(data)) is not None:
            raise FieldError(*found)
        return data

    @field_validator("restart")
    @classmethod
    def _restart_policy(cls, restart: Restart, info: ValidationInfo) -> Restart:
        """restart.policy's default, chosen from the validated fields above it (`nodes: "3"` is 3 here)."""
        if restart.model_fields_set and info.data.get("runtime") is not None:
            raise ValueError(
                "with runtime: the ClusterTrainingRuntime's JobSet failurePolicy decides restarts "
                "(runtimePatches cannot set it); remove restart, or drop runtime:"
            )
        if restart.policy is not None or "nodes" not in info.data:
            return restart
        # One pod restarted alone cannot rejoin its peers' communicator (the job hangs), so jobs of more
        # than one node restart whole; elastic jobs re-form through torchrun's own agent.
        whole = info.data["nodes"] > 1 and info.data.get("elastic") is None
        policy = "job" if whole else "on-failure"
        # Built from validated values; its fields_set stays what the user wrote (the policy was not).
        return Restart.model_construct(restart.model_fields_set, **{**dict(restart), "policy": policy})

    @model_validator(mode="after")
    def _check_consistency(self) -> "JobSpec":
        """Every rule over several fields; all that fail are raised together (the loader reports each)."""
        found: list[FieldError] = []
        for field, kind in (("affinity", "V1Affinity"), ("pod_overrides", pod_shape.ROOT)):
            value = getattr(self, field)
            if value is not None and (shape := pod_shape.problem(value, kind)) is not None:
                found.append(FieldError((field, *shape[0]), shape[1]))
        if (self.train is None) == (self.command is None):
            found.append(
                FieldError(
                    "train",
                    "set exactly one of train (the built-in trainer) or command (your own "
                    "script, launched by torchrun)",
                )
            )
        if self.gpus_per_node and self.procs_per_node != self.gpus_per_node:
            found.append(
                FieldError(
                    "procs_per_node",
                    f"procs_per_node ({self.procs_per_node}) must equal gpus_per_node "
                    f"({self.gpus_per_node}): each process drives one GPU",
                )
            )
        if self.train is not None and (problem := self.train.batch_problem(self.world_size)):
            field = "train.micro_batch_size" if self.train.micro_batch_size else "train.batch_size"
            found.append(FieldError(field, problem))
        if self.elastic is not None and not self.elastic.min_nodes <= self.nodes <= self.elastic.max_nodes:
            found.append(
                FieldError(
                    "elastic",
                    f"nodes ({self.nodes}) must lie between elastic.min_nodes "
                    f"({self.elastic.min_nodes}) and elastic.max_nodes ({self.elastic.max_nodes})",
                )
            )
        names = [v.name for v in self.volumes]
        if dup := next((n for n in names if names.count(n) > 1), None):
            found.append(FieldError("volumes", f"volume name {dup!r} is used twice"))
        mounts = [v.mount for v in self.volumes]
        if dup := next((m for m in mounts if mounts.count(m) > 1 or m in RESERVED_MOUNTS), None):
            reason = "is reserved by orch" if dup in RESERVED_MOUNTS else "is used twice"
            found.append(FieldError("volumes", f"mount path {dup!r} {reason}"))
        if clash := sorted(set(self.env) & set(self.secret_env)):
            found.append(FieldError("secret_env", f"{clash[0]!r} is set in both env and secret_env"))
        if self.elastic is not None and self.restart.policy == "job":
            found.append(
                FieldError(
                    "restart.policy",
                    "elastic jobs restart through torchrun's elastic agent (elastic.max_restarts); "
                    "drop restart.policy: job or elastic",
                )
            )
        for field in ("priority", "topology"):
            if getattr(self.scheduling, field) is not None and self.scheduling.queue is None:
                found.append(
                    FieldError(
                        f"scheduling.{field}",
                        f"needs scheduling.queue (Kueue applies {field} to queued jobs)",
                    )
                )
            if (
                getattr(self.scheduling, field) is not None
                and self.scheduling.scheduler == naming.SCHEDULER_VOLCANO
            ):
                found.append(
                    FieldError(
                        f"scheduling.{field}",
                        f"is Kueue's, and with scheduler: {naming.SCHEDULER_VOLCANO} the job goes to Volcano's queue, "
                        f"not Kueue's: nothing would carry it (Volcano's priority is scheduling.priority_class)",
                    )
                )
        found += self._tracking_rules()
        if found:
            raise FieldError.joined(found)
        return self

    def _tracking_rules(self) -> list[FieldError]:
        found: list[FieldError] = []
        tracking = self.tracking
        if (tracking.tensorboard or tracking.mlflow) and self.train is None:
            found.append(
                FieldError(
                    "tracking",
                    "applies to the built-in trainer (train:); a command job logs itself "
                    "(set MLFLOW_TRACKING_URI in env for your script)",
                )
            )
        if tracking.mlflow is not None:
            for key, env_name in MLFLOW_CREDENTIAL_ENV.items():
                if getattr(tracking.mlflow.credentials, key) and env_name in {**self.env, **self.secret_env}:
                    found.append(
                        FieldError(
                            f"tracking.mlflow.credentials.{key}",
                            f"{env_name} is also set in env or secret_env",
                        )
                    )
        return found

    def tracking_problem(self, environ: Mapping[str, str], *, in_pod: bool) -> tuple[str, str] | None:
        """(field, why) when the job's MLflow tracking cannot work where it will run, else None. `environ`
        is what the trainer will see: this shell and the job's env for `orch run`; the names in env and
        secret_env for the pods (`in_pod`), where a file store must also outlive the pod."""
        mlflow = self.tracking.mlflow
        if mlflow is None:
            return None
        field, uri = "tracking.mlflow.tracking_uri", mlflow.tracking_uri
        if not uri and not (environ.get(ENV_MLFLOW_TRACKING_URI) or environ.get("MLFLOW_TRACKING_URI")):
            return field, (
                f"no MLflow server: set tracking.mlflow.tracking_uri, or {ENV_MLFLOW_TRACKING_URI} "
                "(e.g. from a Secret through secret_env)"
            )
        if in_pod and uri and (store := local_store_path(uri)):
            # A file store (`file:`, a path, `sqlite:`) written inside a pod is lost with the pod unless it
            # lies in the output dir or on a writable volume.
            kept = [naming.OUTPUT_DIR] + [v.mount for v in self.volumes if not v.read_only]
            if not (
                store.startswith("/")
                and any(store == k or store.startswith(k.rstrip("/") + "/") for k in kept)
            ):
                return field, (
                    f"{uri!r} is a store inside the pod, lost with it: use an MLflow server, or a path under "
                    f"{naming.OUTPUT_DIR} or a writable volume (e.g. file:{naming.OUTPUT_DIR}/mlruns)"
                )
        return None

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def gang(self) -> bool:
        """Whether the pods are scheduled all or nothing: scheduling.gang, else on for more than one pod."""
        return self.scheduling.gang if self.scheduling.gang is not None else self.nodes > 1


# tracking.mlflow.credentials -> the environment variables the MLflow client reads.
MLFLOW_CREDENTIAL_ENV = {
    "username": "MLFLOW_TRACKING_USERNAME",
    "password": "MLFLOW_TRACKING_PASSWORD",
    "token": "MLFLOW_TRACKING_TOKEN",
}


def local_store_path(uri: str) -> str | None:
    """The path of a store MLflow keeps in files (`file:`, a plain path, `sqlite:///`), or None for a server."""
    for prefix in ("sqlite:///", "file://", "file:"):
        if uri.startswith(prefix):
            return uri[len(prefix) :]
    return None if "://" in uri else uri


# Paths orch mounts into every pod (see manifests/pytorchjob.yaml.j2); a user volume cannot take them.
RESERVED_MOUNTS = ("/dev/shm", "/etc/orch", "/orch/output")
