"""What `orch run` decides before it starts a process: the local plan (world size, steps, output directory,
environment, restart budget), and the checks that refuse what cannot run here (no side effects but reading
the machine: its GPUs, the object store's answer)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import redaction, runtime_env, storage
from orchestrator.errors import UsageError

if TYPE_CHECKING:
    from orchestrator.job.spec import JobSpec
    from orchestrator.trainer.config import TrainSpec


@dataclass(frozen=True)
class LocalPlan:
    """Everything `orch run` decided before starting a process (pure data, printed to the user)."""

    world_size: int
    output_dir: Path
    train: TrainSpec | None
    command: list[str] | None
    env: dict[str, str]
    max_restarts: int
    restart_policy: str = "none"
    """`job`: restart.policy job (all local ranks restart together); `elastic`: the elastic section's."""
    gpus_per_node: int = 0
    unique_output_dir: bool = False
    """The default runs/NAME-TIMESTAMP: `claim` adds -2, -3, ... when another run took it."""
    output_url: str | None = None
    """An object store that keeps the checkpoints, model.pt and summary.json (the trainer's ORCH_OUTPUT_URL)."""

    @property
    def accumulation(self) -> int | None:
        return self.train.accumulation(self.world_size) if self.train else None


def plan(
    spec: JobSpec,
    *,
    procs: int | None = None,
    steps: int | None = None,
    output_dir: str | None = None,
    now: datetime | None = None,
) -> LocalPlan:
    """Resolve world size, steps and output directory; refuse what cannot run. No side effects."""
    world_size = procs or spec.world_size
    if world_size < 1:
        raise UsageError(f"--procs must be at least 1, not {world_size}")
    train = spec.train
    if train is not None:
        if steps is not None:
            if steps < 1:
                raise UsageError(f"--steps must be at least 1, not {steps}")
            train = train.model_copy(update={"max_steps": steps, "epochs": None})
        if problem := train.batch_problem(world_size):
            source = f"--procs {procs}" if procs else f"{spec.nodes} nodes x {spec.procs_per_node} procs"
            raise UsageError(f"{source}: {problem}")
    elif steps is not None:
        raise UsageError("--steps applies to train jobs only; this job runs its own command")
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    # An object store (--out s3://..., or output.url) keeps the checkpoints, model and summary; the logs,
    # the progress and the lock stay in a local directory (a new one per run, as without --out).
    output_url = spec.output.url if spec.output is not None else None
    if output_dir and storage.is_url(output_dir):
        if problem := storage.url_problem(output_dir):
            raise UsageError(f"--out {redaction.redact(output_dir.partition('?')[0])}: {problem}")
        output_url, output_dir = output_dir.rstrip("/"), None
    out = Path(output_dir) if output_dir else Path("runs") / f"{spec.name}-{stamp}"
    from orchestrator.imaging.builder import git_revision

    runtime = runtime_env.RuntimeEnv.for_job(
        spec,
        name=spec.name,
        output_dir=str(out.resolve()),
        output_url=output_url,
        git_commit=git_revision("."),
    )
    env = {**runtime.to_env(), **spec.env, "PYTHONUNBUFFERED": "1"}
    policy, max_restarts = restart_budget(spec)
    return LocalPlan(
        world_size=world_size,
        output_dir=out,
        train=train,
        command=list(spec.command) if spec.command else None,
        env=env,
        max_restarts=max_restarts,
        restart_policy=policy,
        gpus_per_node=spec.gpus_per_node,
        unique_output_dir=not output_dir,
        output_url=output_url,
    )


def check_store(local: LocalPlan) -> None:
    """Before any process starts: the object stores of output.url (or --out) and of a train.checkpoint.dir
    URL can be written to with the job's environment, or one line and exit 2 (a missing bucket, bad
    credentials, an endpoint that does not answer)."""
    checkpoint_dir = local.train.checkpoint.dir if local.train is not None else None
    stores = [url for url in (local.output_url, checkpoint_dir) if url and storage.is_url(url)]
    with environment(local.env):
        for url in stores:
            try:
                storage.check_writable(url)
            except storage.StorageError as error:
                raise UsageError(str(error)) from None


def restart_budget(spec: JobSpec) -> tuple[str, int]:
    """How many times the launcher restarts every local rank after a failure, and why.

    torch's elastic agent always restarts the whole local worker group together, which is what
    `restart.policy: job` asks of a cluster (every pod restarts, the trainer resumes from its last checkpoint).
    The pod policies (on-failure, exit-code, never) restart single pods, and one pod holds every local rank:
    locally they restart nothing, as before. An elastic section keeps its own max_restarts.
    """
    if spec.restart.policy == "job":
        return "job", spec.restart.max_restarts
    if spec.elastic is not None:
        return "elastic", spec.elastic.max_restarts
    return "none", 0


def check_devices(local: LocalPlan) -> list[str]:
    """Refuse more processes than local GPUs; return warnings to show once (a GPU job on a CPU machine)."""
    import torch

    # One process per GPU when there are GPUs (the trainer uses cuda:LOCAL_RANK); on CPU any number.
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus and local.world_size > gpus:
        raise UsageError(
            f"{local.world_size} processes need {local.world_size} GPUs; this machine has {gpus} "
            f"(use --procs {gpus}, or hide the GPUs with CUDA_VISIBLE_DEVICES= to run on CPU)"
        )
    if local.gpus_per_node and not gpus:
        return [
            f"the job asks for {local.gpus_per_node} GPU{'s' * (local.gpus_per_node != 1)} per node but this "
            f"machine has none (torch sees no CUDA device): running {local.world_size} "
            f"process{'es' * (local.world_size != 1)} on the CPU with gloo"
        ]
    return []


@contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """Workers inherit the launcher's environment: set ours for the run, restore it afterwards."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
