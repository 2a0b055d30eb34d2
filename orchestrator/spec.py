"""The job spec: what one job.yaml may say, as frozen pydantic models. Pure data, no I/O.

Field names are a contract with users, docs and checks: add fields, never rename them. Every model forbids
unknown keys; `orchestrator.loading` turns validation errors into `job.yaml:LINE:COL: field: message`.
Cross-field rules live in `JobSpec._check_consistency`, each raising `FieldError` with the path it is about.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from orchestrator import naming
from orchestrator.apis.registry import AUTO as API_AUTO
from orchestrator.apis.registry import CHOICES as API_CHOICES
from orchestrator.durations import parse_duration
from orchestrator.rendering import pod_shape

DEFAULT_METRICS_PORT = 9400  # metrics.port; `orch top --local` looks here
DEFAULT_GPU_SAMPLE_SECONDS = 5.0
# Where the trainer reads the MLflow server from when the spec does not say (set it from a Secret, say).
ENV_MLFLOW_TRACKING_URI = "ORCH_MLFLOW_TRACKING_URI"

# --- Kubernetes name and value rules (apimachinery's validation.go; the name rules are naming.py's) ---------
# Every pattern is applied with re.fullmatch (Python's `$` would also match before a final newline, so
# `name: "digits\n"` would pass); they carry no anchors of their own.

QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")  # a key of a Secret's data (IsConfigMapKey)
IMAGE_REF = re.compile(r"[!-.0-~][!-~]*")  # printable ASCII without spaces, not starting with /
# A Kubernetes quantity: a number with an optional binary (Ki..Ei), decimal (m, k..E) or exponent suffix.
QUANTITY = re.compile(r"(\d+(\.\d*)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][-+]?\d+)?")
IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")

# Kubernetes' integer fields are int32 (replicas, backoffLimit, ports, ...) or int64 (seconds).
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
BUILTIN_TASKS = ("digits", "gpt", "synthetic")


class FieldError(Exception):
    """A cross-field rule failed. `path` is the field the user must change: dotted (`train.batch_size`), or
    a tuple whose ints index lists (`("pod_overrides", "containers", 0)`).

    Deliberately not a ValueError: pydantic would wrap it and lose the path.
    """

    def __init__(self, path: str | tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.parts: tuple[str | int, ...] = tuple(path.split(".")) if isinstance(path, str) else path
        self.path, self.message = ".".join(str(p) for p in self.parts), message


def show(value: Any, limit: int = 60) -> str:
    """repr() of a user's value for an error message, cut to `limit` characters (a message is one short line)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"


def _check(pattern: re.Pattern[str], what: str, max_length: int | None = None) -> Callable[[str], str]:
    def validate(value: str) -> str:
        if max_length is not None and len(value) > max_length:
            raise ValueError(f"{show(value)} is longer than {max_length} characters")
        if not pattern.fullmatch(value):
            raise ValueError(f"{show(value)} is not a valid {what}")
        return value

    return validate


def _quantity(value: Any) -> str:
    """Accept `cpu: 8` or `memory: 64Gi`; always hand Kubernetes a string."""
    if isinstance(value, bool):
        raise ValueError("must be a quantity like 8, 500m or 64Gi, not a boolean")
    if isinstance(value, (int, float)):
        value = format(value, "g")
    if not isinstance(value, str) or not QUANTITY.fullmatch(value):
        raise ValueError(f"{show(value)} is not a Kubernetes quantity (examples: 8, 500m, 64Gi, 1.5G)")
    return value


def _path(value: str) -> str:
    """A path without control characters, normalised (`/dev/shm/` -> `/dev/shm`, `a//b/./c` -> `a/b/c`)."""
    if not value or CONTROL_CHARACTER.search(value):
        raise ValueError(f"{show(value)} is not a path (empty, or has control characters)")
    normal = posixpath.normpath(value)
    return "/" + normal.lstrip("/") if normal.startswith("/") else normal


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"{show(path)} must be an absolute path")
    return path


def _relative(path: str) -> str:
    if path.startswith("/") or path == ".." or path.startswith("../"):
        raise ValueError(f"{show(path)} must be a relative path inside the claim (no leading /, no ..)")
    return path


def _string_value(value: Any) -> Any:
    """Env values and selectors are strings; let `OMP_NUM_THREADS: 4` through, refuse `true` (ambiguous)."""
    if isinstance(value, bool):
        raise ValueError(
            f'{str(value).lower()} is a YAML boolean; quote it ("{str(value).lower()}") to pass a string'
        )
    if isinstance(value, (int, float)):
        return str(value)
    return value


def _stop_budget(value: Any) -> int:
    """train.checkpoint.on_stop: a duration, or false (stored as 0: no checkpoint on stop)."""
    if value is False or (isinstance(value, int) and not isinstance(value, bool) and value == 0):
        return 0
    try:
        return parse_duration(value)
    except ValueError as error:
        raise ValueError(f"{error}, or false to stop without a checkpoint") from None


# --- constrained types: use these for new fields, so every field of a kind obeys the same rule ---------------

Quantity = Annotated[str, BeforeValidator(_quantity)]
Duration = Annotated[int, BeforeValidator(parse_duration)]
StringValue = Annotated[str, BeforeValidator(_string_value)]
Dns1123Label = Annotated[
    str, AfterValidator(_check(naming.DNS1123_LABEL, "DNS-1123 label (lowercase letters, digits, '-')", 63))
]
Dns1123Name = Annotated[
    str,
    AfterValidator(
        _check(naming.DNS1123_SUBDOMAIN, "DNS-1123 name (lowercase letters, digits, '-', '.')", 253)
    ),
]
PathStr = Annotated[str, AfterValidator(_path)]
"""Compared and rendered in normal form, so reserved and duplicate paths are found however they are written."""
AbsolutePath = Annotated[str, AfterValidator(_path), AfterValidator(_absolute)]
RelativePath = Annotated[str, AfterValidator(_path), AfterValidator(_relative)]
PositiveInt = Annotated[int, Field(gt=0, le=INT32_MAX)]
NonNegativeInt = Annotated[int, Field(ge=0, le=INT32_MAX)]
Seconds64 = Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)]
Port = Annotated[int, Field(ge=1, le=65535)]
SecretKey = Annotated[
    str, AfterValidator(_check(SECRET_KEY, "secret key (letters, digits, '-', '_', '.')", 253))
]


def _check_label_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not naming.DNS1123_SUBDOMAIN.fullmatch(prefix)):
        raise ValueError(f"key {show(key)}: prefix {show(prefix)} must be a DNS-1123 subdomain")
    if len(name) > 63 or not QUALIFIED_NAME.fullmatch(name):
        raise ValueError(
            f"key {show(key)} is not a valid Kubernetes label/annotation key "
            "(<= 63 characters: letters, digits, '-', '_', '.', starting and ending alphanumeric)"
        )
    return key


def _check_label_value(value: str) -> str:
    if len(value) > 63 or not LABEL_VALUE.fullmatch(value):
        raise ValueError(
            f"{show(value)} is not a valid label value "
            "(<= 63 characters: letters, digits, '-', '_', '.', starting and ending alphanumeric)"
        )
    return value


# Keys and values are validated one by one, so an error points at the entry's own line.
LabelKey = Annotated[str, AfterValidator(_check_label_key)]
LabelValue = Annotated[str, BeforeValidator(_string_value), AfterValidator(_check_label_value)]
EnvName = Annotated[str, AfterValidator(_check(ENV_NAME, "environment variable name"))]
ImageRef = Annotated[
    str, AfterValidator(_check(IMAGE_REF, "image reference (e.g. ghcr.io/acme/trainer:1.0)"))
]


class Model(BaseModel):
    """Base of every spec model: immutable, unknown keys are errors, defaults are validated too."""

    # allow_inf_nan=False: a float field is finite (`lr: .inf` would be written into train.json as Infinity).
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)


# --- train: the built-in trainer ---------------------------------------------------------------------------


class OptimizerSpec(Model):
    name: Literal["adamw", "adam", "sgd"] = "adamw"
    lr: Annotated[float, Field(gt=0)] = 3.0e-4
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.9
    """SGD only."""
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.999)
    """Adam and AdamW only."""


class ScheduleSpec(Model):
    name: Literal["constant", "linear", "cosine", "step", "plateau"] = "constant"
    warmup_steps: NonNegativeInt = 0
    """Linear warmup from 0 to lr over this many optimizer steps (every schedule)."""
    min_lr: Annotated[float, Field(ge=0)] = 0.0
    """Floor of linear and cosine decay, and of plateau reductions."""
    step_size: PositiveInt = 100
    """step: multiply the rate by `gamma` every `step_size` optimizer steps."""
    gamma: Annotated[float, Field(gt=0, le=1)] = 0.1
    patience: NonNegativeInt = 3
    """plateau: evaluations without improvement before the rate is multiplied by `factor`."""
    factor: Annotated[float, Field(gt=0, lt=1)] = 0.5
    threshold: Annotated[float, Field(ge=0)] = 1.0e-4
    """plateau: relative improvement of the loss that counts as better."""


class CheckpointSpec(Model):
    # `async` is a Python keyword: the field is async_, read and written as `async`.
    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, populate_by_name=True, serialize_by_alias=True
    )

    dir: PathStr | None = None
    """None: <output dir>/checkpoints. A relative path is taken under the output dir. Every rank reads
    and writes its part here: on more than one node, a volume all pods share."""
    every_steps: NonNegativeInt = 200
    """0: only at the end."""
    keep: PositiveInt = 2
    """Complete (verified) checkpoints kept; ones that do not verify are neither counted nor deleted."""
    async_: bool = Field(False, alias="async")
    """Write in the background (torch.distributed.checkpoint.async_save): training waits only for the
    state to be copied in memory."""
    on_stop: Annotated[int, BeforeValidator(_stop_budget)] = 120
    """On SIGTERM (preemption, node drain, `kubectl delete`) or the first Ctrl-C of `orch run`: finish the
    step, write a checkpoint and exit 128+signal (retryable), within this long: the pods'
    terminationGracePeriodSeconds is this plus 30 s, and torchrun waits this long before it
    kills its ranks. false (0 when read back): stop at once, losing the steps since the last checkpoint."""


class FsdpSpec(Model):
    reshard_after_forward: bool = True
    """Free each unit's gathered parameters after its forward and gather them again for the backward
    (less memory, one more all-gather per unit); False keeps them until the backward."""


class TrainSpec(Model):
    task: str = "digits"
    task_args: dict[str, Any] = {}
    batch_size: PositiveInt = 256
    """GLOBAL samples per optimizer step, whatever the world size."""
    micro_batch_size: PositiveInt | None = None
    """Samples per process per forward pass. None: batch_size / world (no accumulation)."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    optimizer: OptimizerSpec = OptimizerSpec()
    schedule: ScheduleSpec = ScheduleSpec()
    max_steps: PositiveInt | None = None
    epochs: PositiveInt | None = None
    grad_clip: Annotated[float, Field(ge=0)] | None = 1.0
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0
    """Seeds torch, numpy (whose seeds are 32-bit) and the data order."""
    log_every: PositiveInt = 10
    eval_every: NonNegativeInt = 100
    """Optimizer steps between evaluations; 0: only at the end."""
    checkpoint: CheckpointSpec = CheckpointSpec()
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """ddp: every rank holds the whole model; fsdp: parameters, gradients and optimizer state sharded
    over the ranks (torch FSDP2). Same mathematics; see docs/trainer.md."""
    fsdp: FsdpSpec = FsdpSpec()
    nonfinite_loss: Literal["stop", "skip"] = "stop"
    tf32: bool = True
    cuda_alloc_conf: str = "expandable_segments:True"
    """PYTORCH_CUDA_ALLOC_CONF unless the environment already sets it (the seed's 'GPU memory growth')."""
    compile: bool = False
    num_workers: NonNegativeInt = 0
    deterministic: bool = False
    """torch.use_deterministic_algorithms: bitwise-reproducible runs and resumes, at a cost in speed."""
    collective_timeout: Duration = 600
    """How long a rank waits in a collective (for a peer that died or hangs) before it fails: long enough for
    rank 0 to write a checkpoint or evaluate while the others wait, short enough to notice a lost node."""

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str) -> str:
        if task not in BUILTIN_TASKS and not IMPORT_PATH.fullmatch(task):
            raise ValueError(
                f"{show(task)} is neither a built-in task ({', '.join(BUILTIN_TASKS)}) "
                "nor an import path like 'mypkg.tasks:make_task'"
            )
        return task

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> TrainSpec:
        if self.max_steps is not None and self.epochs is not None:
            raise ValueError("set max_steps or epochs, not both")
        return self

    def micro_batch(self, world_size: int) -> int:
        return self.micro_batch_size or self.batch_size // world_size

    def accumulation(self, world_size: int) -> int:
        """Micro-steps per optimizer step: batch_size / (micro_batch_size x world_size)."""
        return self.batch_size // (self.micro_batch(world_size) * world_size)

    def batch_problem(self, world_size: int) -> str | None:
        """Why this batch cannot be split over `world_size` processes, or None."""
        micro = self.micro_batch(world_size)
        if self.micro_batch_size is None and (micro < 1 or self.batch_size % world_size):
            return (
                f"batch_size {self.batch_size} is not divisible by the world size {world_size} "
                f"(nodes x procs_per_node); pick a multiple of {world_size}, or set micro_batch_size"
            )
        if self.batch_size % (micro * world_size):
            return (
                f"batch_size {self.batch_size} is not divisible by micro_batch_size {micro} x "
                f"world size {world_size}; pick a batch_size that is a multiple of {micro * world_size}"
            )
        return None


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
    def _one_source(self) -> Volume:
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
    def _one_level(self) -> Topology:
        if (self.required is None) == (self.preferred is None):
            raise ValueError(
                "set exactly one of required or preferred (a node label naming a topology level)"
            )
        return self


def _kueue_name(what: str) -> Any:
    return Annotated[str, AfterValidator(_check(LABEL_VALUE, what, 63))]


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
    def _one_place(self) -> Output:
        from orchestrator import storage

        if (self.pvc is None) == (self.url is None):
            raise FieldError("output", "set exactly one of pvc (a volume) or url (an object store)")
        if self.url is not None and (problem := storage.url_problem(self.url)):
            raise FieldError("output.url", problem)
        if self.url is not None and self.sub_path is not None:
            raise FieldError("output.sub_path", "applies to output.pvc; put the folder in output.url")
        return self


class Elastic(Model):
    min_nodes: PositiveInt
    max_nodes: PositiveInt
    max_restarts: NonNegativeInt = 3

    @model_validator(mode="after")
    def _bounds(self) -> Elastic:
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) is larger than max_nodes ({self.max_nodes})")
        return self


class Metrics(Model):
    enabled: bool = True
    port: Port = DEFAULT_METRICS_PORT
    release: Annotated[str, AfterValidator(_check(LABEL_VALUE, "label value", 63))] | None = (
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
    credentials: MlflowCredentials = MlflowCredentials()


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
            _check(
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
    (orchestrator/workspace.py). None: job.yaml's folder when it holds the code the job names; false: none."""
    nodes: PositiveInt = 1
    gpus_per_node: NonNegativeInt = 0
    procs_per_node: PositiveInt = Field(None, validate_default=False)  # type: ignore[assignment]
    """None: gpus_per_node, or 1 without GPUs (resolved after validation)."""
    resources: Resources = Resources()
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
    scheduling: Scheduling = Scheduling()
    restart: Restart = Restart()
    elastic: Elastic | None = None
    output: Output | None = None
    deadline: Duration | None = None
    """activeDeadlineSeconds of the job."""
    ttl_after_finished: Duration | None = None
    metrics: Metrics = Metrics()
    tracking: Tracking = Tracking()
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

    def _resolve_defaults(self) -> None:
        """Defaults that depend on other fields, chosen from their validated values (`nodes: "3"` is 3 here)."""
        if self.procs_per_node is None:
            object.__setattr__(self, "procs_per_node", self.gpus_per_node or 1)
        if self.restart.model_fields_set and self.runtime is not None:
            raise FieldError(
                "restart",
                "with runtime: the ClusterTrainingRuntime's JobSet failurePolicy decides restarts "
                "(runtimePatches cannot set it); remove restart, or drop runtime:",
            )
        if self.restart.policy is None:
            # One pod restarted alone cannot rejoin its peers' communicator (the job hangs), so jobs of
            # more than one node restart whole; elastic jobs re-form through torchrun's own agent.
            policy = "job" if self.nodes > 1 and self.elastic is None else "on-failure"
            restart = self.restart.model_copy(update={"policy": policy})
            object.__setattr__(restart, "__pydantic_fields_set__", set(self.restart.model_fields_set))
            object.__setattr__(self, "restart", restart)

    @model_validator(mode="after")
    def _check_consistency(self) -> JobSpec:
        self._resolve_defaults()
        for field, kind in (("affinity", "V1Affinity"), ("pod_overrides", pod_shape.ROOT)):
            value = getattr(self, field)
            if value is not None and (found := pod_shape.problem(value, kind)) is not None:
                raise FieldError((field, *found[0]), found[1])
        if (self.train is None) == (self.command is None):
            raise FieldError(
                "train",
                "set exactly one of train (the built-in trainer) or command (your own "
                "script, launched by torchrun)",
            )
        if self.gpus_per_node and self.procs_per_node != self.gpus_per_node:
            raise FieldError(
                "procs_per_node",
                f"procs_per_node ({self.procs_per_node}) must equal gpus_per_node "
                f"({self.gpus_per_node}): each process drives one GPU",
            )
        if self.train is not None and (problem := self.train.batch_problem(self.world_size)):
            field = "train.micro_batch_size" if self.train.micro_batch_size else "train.batch_size"
            raise FieldError(field, problem)
        if self.elastic is not None and not self.elastic.min_nodes <= self.nodes <= self.elastic.max_nodes:
            raise FieldError(
                "elastic",
                f"nodes ({self.nodes}) must lie between elastic.min_nodes "
                f"({self.elastic.min_nodes}) and elastic.max_nodes ({self.elastic.max_nodes})",
            )
        names = [v.name for v in self.volumes]
        if dup := next((n for n in names if names.count(n) > 1), None):
            raise FieldError("volumes", f"volume name {dup!r} is used twice")
        mounts = [v.mount for v in self.volumes]
        if dup := next((m for m in mounts if mounts.count(m) > 1 or m in RESERVED_MOUNTS), None):
            reason = "is reserved by orch" if dup in RESERVED_MOUNTS else "is used twice"
            raise FieldError("volumes", f"mount path {dup!r} {reason}")
        if clash := sorted(set(self.env) & set(self.secret_env)):
            raise FieldError("secret_env", f"{clash[0]!r} is set in both env and secret_env")
        if self.elastic is not None and self.restart.policy == "job":
            raise FieldError(
                "restart.policy",
                "elastic jobs restart through torchrun's elastic agent (elastic.max_restarts); "
                "drop restart.policy: job or elastic",
            )
        for field in ("priority", "topology"):
            if getattr(self.scheduling, field) is not None and self.scheduling.queue is None:
                raise FieldError(
                    f"scheduling.{field}", f"needs scheduling.queue (Kueue applies {field} to queued jobs)"
                )
            if (
                getattr(self.scheduling, field) is not None
                and self.scheduling.scheduler == naming.SCHEDULER_VOLCANO
            ):
                raise FieldError(
                    f"scheduling.{field}",
                    f"is Kueue's, and with scheduler: {naming.SCHEDULER_VOLCANO} the job goes to Volcano's queue, "
                    f"not Kueue's: nothing would carry it (Volcano's priority is scheduling.priority_class)",
                )
        self._check_tracking()
        return self

    def _check_tracking(self) -> None:
        tracking = self.tracking
        if (tracking.tensorboard or tracking.mlflow) and self.train is None:
            raise FieldError(
                "tracking",
                "applies to the built-in trainer (train:); a command job logs itself "
                "(set MLFLOW_TRACKING_URI in env for your script)",
            )
        if tracking.mlflow is not None:
            for key, env_name in MLFLOW_CREDENTIAL_ENV.items():
                if getattr(tracking.mlflow.credentials, key) and env_name in {**self.env, **self.secret_env}:
                    raise FieldError(
                        f"tracking.mlflow.credentials.{key}", f"{env_name} is also set in env or secret_env"
                    )

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


# Free strings may hold these control characters (a multi-line env value or script argument); no others.
ALLOWED_CONTROL_CHARACTERS = "\t\n"


def value_problem(value: Any, path: tuple[str | int, ...] = ()) -> tuple[tuple[str | int, ...], str] | None:
    """(path, why) for the first value in `value` (at any depth, keys included) that a job cannot hold: one
    rule for every value, whether it came from YAML or a Python dict. A value is JSON (strings, numbers,
    booleans, null, lists, mappings with string keys: a date or bytes would crash render or `-o json`), and a
    string holds no control character other than tab and newline (NUL, ESC or CR never reach a pod's
    environment, a command line or a terminal). The character is named, the value never shown (it may be a
    secret)."""
    if isinstance(value, str):
        bad = next((c for c in value if _is_control(c)), None)
        if bad is None:
            return None
        return path, (
            f"holds the control character U+{ord(bad):04X} at position {value.index(bad)}; "
            "a string may hold tab and newline, no other control character"
        )
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return path, f"key {show(key)} is not a string"
            if (found := value_problem(key, (*path, key))) is not None:
                return found
            if (found := value_problem(item, (*path, key))) is not None:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            if (found := value_problem(item, (*path, index))) is not None:
                return found
        return None
    if value is None or isinstance(value, (bool, int, float, BaseModel)):
        return None
    return (
        path,
        f"a {type(value).__name__} has no JSON form (strings, numbers, booleans, null, lists, mappings)",
    )


def _is_control(character: str) -> bool:
    code = ord(character)
    return (code < 0x20 or 0x7F <= code <= 0x9F) and character not in ALLOWED_CONTROL_CHARACTERS


# Paths orch mounts into every pod (see manifests/pytorchjob.yaml.j2); a user volume cannot take them.
RESERVED_MOUNTS = ("/dev/shm", "/etc/orch", "/orch/output")
