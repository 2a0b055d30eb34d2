"""The trainer's config: job.yaml's `train:` section, which the trainer reads back as train.json.

`TrainSpec` and its parts (optimizer, schedule, checkpoint, fsdp) are frozen pydantic models with the job
spec's field types (orchestrator/job/fields.py); the job spec holds a TrainSpec as its `train` field, and
`runtime_env` writes it into train.json and reads it back in the trainer. Kept beside the trainer that
reads it (as torchtitan keeps each config beside its owner), and importable without torch and without the
rest of the trainer: `orch render` validates a job through it, and `tests/test_layers.py` lets the job
spec, runtime_env and `orch run`'s plan import this module, no other of the trainer's.

Also here: the defaults of what the trainer reads from its environment besides train.json (the metrics
exporter's port and GPU sample period, the variable naming the MLflow server), which job.yaml's
`metrics:` and `tracking:` sections default to.
"""

# No `from __future__ import annotations` in the model modules: pydantic would compile each field's
# annotation from its string at import (~3 ms of `orch render`); here the class body evaluates them.
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from orchestrator.job.durations import parse_duration
from orchestrator.job.fields import Duration, FieldError, Model, NonNegativeInt, PathOrUrl, PositiveInt, show

DEFAULT_METRICS_PORT = 9400  # metrics.port; `orch top --local` looks here
DEFAULT_GPU_SAMPLE_SECONDS = 5.0
# Where the trainer reads the MLflow server from when the spec does not say (set it from a Secret, say).
ENV_MLFLOW_TRACKING_URI = "ORCH_MLFLOW_TRACKING_URI"

BUILTIN_TASKS = ("digits", "gpt", "synthetic")
IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")  # a plug-in task: "mypkg.tasks:make_task"


def _stop_budget(value: Any) -> int:
    """train.checkpoint.on_stop: a duration, or false (stored as 0: no checkpoint on stop)."""
    if value is False or (isinstance(value, int) and not isinstance(value, bool) and value == 0):
        return 0
    try:
        return parse_duration(value)
    except ValueError as error:
        raise ValueError(f"{error}, or false to stop without a checkpoint") from None


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
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)  # merged with Model's

    dir: PathOrUrl | None = None
    """None: <output dir>/checkpoints. A relative path is taken under the output dir; a URL (s3://, gs://,
    az://) is an object store's prefix. Every rank reads and writes its part here: on more than one node, a
    volume all pods share, or a store."""
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


def _preflight_switch(value: Any) -> Any:
    """train.preflight: true / false is the switch; a mapping sets the rest too."""
    return {"enabled": value} if isinstance(value, bool) else value


class PreflightSpec(Model):
    """The check every rank makes before step 0 (orchestrator/trainer/preflight.py, docs/trainer.md)."""

    enabled: bool | None = None
    """None: on when the trainer runs on GPUs (CUDA), off on CPU."""
    max_slowdown: Annotated[float, Field(gt=1)] = 1.5
    """A rank is far slower when a part of its timed work (a matmul; on GPUs also a host-to-device copy) takes
    more than this many times the median of the other ranks' time for it."""
    timeout: Annotated[Duration, Field(ge=1)] = 120
    """How long the ranks wait for every rank's report (the barrier) and for the timed all-reduce: a rank
    that is not there by then is named as bad."""


class TrainSpec(Model):
    task: str = "digits"
    task_args: dict[str, Any] = {}
    batch_size: PositiveInt = 256
    """GLOBAL samples per optimizer step, whatever the world size."""
    micro_batch_size: PositiveInt | None = None
    """Samples per process per forward pass. None: batch_size / world (no accumulation)."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    max_steps: PositiveInt | None = None
    epochs: PositiveInt | None = None
    grad_clip: Annotated[float, Field(ge=0)] | None = 1.0
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0
    """Seeds torch, numpy (whose seeds are 32-bit) and the data order."""
    log_every: PositiveInt = 10
    eval_every: NonNegativeInt = 100
    """Optimizer steps between evaluations; 0: only at the end."""
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """ddp: every rank holds the whole model; fsdp: parameters, gradients and optimizer state sharded
    over the ranks (torch FSDP2). Same mathematics; see docs/trainer.md."""
    fsdp: FsdpSpec = Field(default_factory=FsdpSpec)
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
    preflight: Annotated[PreflightSpec, BeforeValidator(_preflight_switch)] = Field(
        default_factory=PreflightSpec
    )
    """true / false, or {enabled, max_slowdown, timeout}: check the GPUs and the ranks' speed before step 0."""

    @model_serializer(mode="wrap")
    def _without_default_preflight(self, handler: SerializerFunctionWrapHandler) -> Any:
        """train.json leaves preflight out while it is the default, so that a job not using it reads the same
        to a trainer image from before the field existed (train.json's keys are checked: unknown is an error)."""
        data = handler(self)
        if isinstance(data, dict) and self.preflight == PreflightSpec():
            data.pop("preflight", None)
        return data

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
    def _check_consistency(self) -> "TrainSpec":
        found = []
        if self.max_steps is not None and self.epochs is not None:
            found.append(FieldError("epochs", "set max_steps or epochs, not both"))
        if self.schedule.name == "plateau" and not self.eval_every:
            # The rule watches the loss at each evaluation: with none before the end it would never act, and a
            # user who asked for plateau would train at a constant rate without a word (#33).
            found.append(
                FieldError(
                    "eval_every",
                    "schedule plateau lowers the rate when the loss stops improving at an evaluation, and 0 "
                    "evaluates only at the end: the rate would never change; set eval_every (e.g. 100), or another "
                    "schedule",
                )
            )
        if found:
            raise FieldError.joined(found)
        return self

    @property
    def task_module(self) -> str | None:
        """The module a plug-in task lives in (`mypkg.tasks` of "mypkg.tasks:make_task"); None for a built-in."""
        return None if self.task in BUILTIN_TASKS else self.task.partition(":")[0]

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
