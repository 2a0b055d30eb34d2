"""`orch init`, `orch validate`, `orch render`: write, check and render a job file. No cluster I/O."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.commands.common import api_option, job_options, load_job, output_option, warn_missing_code

if TYPE_CHECKING:
    from orchestrator.job.spec import JobSpec

STARTER = """\
# An orch job: one file for `orch run` (this machine) and `orch render` / `orch submit` (Kubernetes).
# Every field is documented in docs/jobspec.md. Check it with `orch validate {file}`.
name: {name}                  # DNS-1035 label: lowercase letters, digits, '-'; at most 50 characters
# namespace: ml              # default: your kubeconfig context's namespace
image: {image}   # the training image the pods run (render/submit need it; `orch run` ignores it)

nodes: 1                      # pods, one per node
gpus_per_node: 0              # nvidia.com/gpu per pod; 0 trains on CPU (gloo)
# procs_per_node: 1           # default: gpus_per_node, or 1 on CPU
resources: {{cpu: "2", memory: 4Gi}}   # one pod's requests (none: BestEffort, evicted first); shm: sizes /dev/shm

train:                        # the built-in trainer; or `command: [python, -m, mypkg.train]` instead
  task: digits                # digits | gpt | synthetic | "mypkg.module:make_task"
  batch_size: 64              # GLOBAL samples per optimizer step
  # micro_batch_size: 32      # per process per forward; accumulation = batch / (micro x world size)
  precision: fp32             # fp32 | bf16 | fp16
  optimizer: {{name: adamw, lr: 1.0e-3}}
  schedule: {{name: cosine, warmup_steps: 20}}
  max_steps: 300              # or epochs: N
  log_every: 10
  eval_every: 100

# env: {{NCCL_DEBUG: WARN}}
# secret_env: {{HF_TOKEN: {{secret: hf-token, key: token}}}}
# volumes:
#   - {{name: data, mount: /data, pvc: datasets, read_only: true}}
# api: auto   # auto | pytorchjob (training operator v1) | trainjob (Kubeflow Trainer v2)
# restart: {{policy: job, max_restarts: 3}}   # job (default for nodes > 1) | on-failure | exit-code | never
# deadline: 24h
# metrics: {{enabled: true, port: 9400}}
"""
DEFAULT_IMAGE = "ghcr.io/acme/orch-trainer:0.1.0"  # a version: `:latest` may differ from pod to pod


@click.command()
@click.argument("job_file", metavar="JOB", default="job.yaml", type=click.Path(dir_okay=False))
@click.option("--name", default="my-job", show_default=True, help="Job name written into the file.")
@click.option(
    "--image", default=DEFAULT_IMAGE, show_default=True, help="Training image written into the file."
)
@click.option("--force", is_flag=True, help="Overwrite JOB if it exists.")
def init(job_file: str, name: str, image: str, force: bool) -> None:
    """Write a commented starter job file (default: job.yaml).

    The file trains the built-in `digits` task on one CPU pod; edit it, then `orch validate` it.

    \b
    Example:
      orch init job.yaml --name digits-ddp
      orch run job.yaml
    """
    from orchestrator.errors import UsageError
    from orchestrator.job import loading

    path = Path(job_file)
    if path.exists() and not force:
        raise UsageError(f"{job_file} already exists; pass --force to overwrite it")
    if not path.parent.is_dir():
        raise UsageError(f"{job_file}: the directory {path.parent} does not exist; create it first")
    # The values go in as YAML scalars (data), never as text: a newline in --name cannot add a key.
    text = STARTER.format(name=yaml_scalar(name), image=yaml_scalar(image), file=job_file)
    # Validate before writing: a bad --name or --image is reported (against the flag) and nothing is written.
    data, positions = loading.parse_yaml(text, job_file)
    origins: dict[loading.FieldPath, str] = {("name",): f"--name {name}", ("image",): f"--image {image}"}
    loading.validate(data, file=job_file, positions=positions, origins=origins)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write {job_file}: {error.strerror or error}") from None
    click.echo(f"wrote {job_file}; next: orch validate {job_file}", err=True)


def yaml_scalar(value: str) -> str:
    """`value` as one YAML scalar on one line: plain where that reads back as the same string, else a
    double-quoted (JSON) string with escapes."""
    import json
    import re

    import yaml

    if re.fullmatch(r"[A-Za-z0-9][-\w./:@]*", value) and yaml.safe_load(value) == value:
        return value
    return json.dumps(value)


@click.command()
@job_options
@output_option("text", "json")
def validate(job_file: str, overrides: tuple[str, ...], output: str) -> int:
    """Check a job file and summarise what it will run: the checks every command runs before it does
    anything (the spec's rules, its `api:`'s, what tracking needs where it may run).

    Exit code 2 and one line `FILE:LINE:COL: field: problem` for each thing wrong, in file order (every
    problem one pass finds: the fields, then the rules over several fields once those are valid). `-o json`
    prints one object either way: {"ok": true, "name", "summary", "job"} or {"ok": false, "error", "file",
    "line", "column", "field", "message", "errors"} (exit code 2; the fields are the first problem's,
    "errors" lists each problem with those fields), for editors and pipelines.

    \b
    Example:
      orch validate examples/gpt-multinode.yaml
      orch validate job.yaml --set nodes=4 --set train.micro_batch_size=16
      orch validate job.yaml -o json | jq .summary
    """
    import json

    from orchestrator.errors import SpecError

    try:
        spec = load_job(job_file, overrides)
    except SpecError as error:
        if output != "json":
            raise
        problems = [{"error": str(e), "file": e.file, "line": e.line, "column": e.column, "field": e.field,
                     "message": e.reason} for e in error.errors]  # fmt: skip
        click.echo(json.dumps({"ok": False, **problems[0], "errors": problems}, indent=2, ensure_ascii=False))
        return error.exit_code
    from orchestrator.rendering import render as rendering

    warn_missing_code(spec, job_file, check_image=False)  # the image's workspace is render's and submit's
    for message in rendering.warnings(spec):  # what render and submit say of the job
        click.echo(f"warning: {message}", err=True)
    if output == "json":
        valid = {"ok": True, "file": job_file, "name": spec.name, "summary": summary(spec),
                 "job": spec.model_dump(mode="json", by_alias=True)}  # fmt: skip
        click.echo(json.dumps(valid, indent=2, ensure_ascii=False))
        return 0
    click.echo(f"OK {job_file}: {spec.name}")
    for line in summary(spec):
        click.echo(f"  {line}")
    from orchestrator.imaging import workspace

    if (folder := workspace.resolve(spec, job_file)) is not None:
        selection = workspace.select(folder) if folder.is_dir() else None
        shipped = len(selection.files) if selection else 0
        click.echo(f"  workspace: {folder} ({shipped} files; orch submit --build ships them over the image)")
        for line in selection.notes() if selection else []:
            click.echo(f"  {line}")
    return 0


def summary(spec: JobSpec) -> list[str]:
    """Human lines describing a valid job: topology, batch arithmetic, where it runs."""
    device = f"{spec.gpus_per_node} GPUs" if spec.gpus_per_node else "CPU"
    lines = [
        f"nodes {spec.nodes} x {spec.procs_per_node} processes = world size {spec.world_size} ({device} per node)"
    ]
    if spec.train is not None:
        train = spec.train
        micro, accumulation = train.micro_batch(spec.world_size), train.accumulation(spec.world_size)
        length = f"max_steps {train.max_steps}" if train.max_steps else f"epochs {train.epochs or 1}"
        lines.append(
            f"train: task {train.task}, batch {train.batch_size} = micro {micro} x world {spec.world_size} "
            f"x accumulation {accumulation}, {train.precision}, {train.parallel}, {length}"
        )
    else:
        lines.append(f"command: {shlex.join(spec.command or [])}")  # the spec requires train or command
    if spec.elastic is not None:
        lines.append(f"elastic: {spec.elastic.min_nodes}..{spec.elastic.max_nodes} nodes")
    elif spec.restart.policy == "job":
        lines.append(
            f"restart: the whole job together on any failure, at most {spec.restart.max_restarts} times"
        )
    lines.append(f"image: {spec.image or '(none: set image to render or submit)'}")
    return lines


@click.command()
@job_options
@api_option
@output_option("yaml", "json")
def render(job_file: str, overrides: tuple[str, ...], api: str | None, output: str) -> None:
    """Print the Kubernetes objects for a job: ConfigMap, PyTorchJob (or TrainingRuntime + TrainJob with
    --api trainjob), PodMonitor. No cluster is asked: --api auto renders a PyTorchJob.

    YAML (several documents) by default, or one JSON List with -o json; both pipe into kubectl. What
    `orch submit` would warn about (partial scheduling, restarts that lose checkpoints, what the API's
    fields mean) is said on stderr, one `warning:` line each.

    \b
    Example:
      orch render examples/gpt-multinode.yaml | kubectl apply -f -
      orch render job.yaml --set nodes=4 -o json
      orch render job.yaml --api trainjob | kubectl apply -f -
    """
    from orchestrator import api as orch
    from orchestrator.rendering import render as rendering

    # --api as an override: what the chosen API cannot carry is reported at its line in the file.
    spec = load_job(job_file, (*overrides, f"api={api}") if api else overrides, where="cluster")
    objects = orch.render(spec)
    warn_missing_code(spec, job_file)
    for message in rendering.warnings(spec):  # what `orch submit` would say; stdout stays YAML for kubectl
        click.echo(f"warning: {message}", err=True)
    click.echo(rendering.to_yaml(objects) if output == "yaml" else rendering.to_json(objects), nl=False)
