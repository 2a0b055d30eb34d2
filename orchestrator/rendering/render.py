"""JobSpec -> the Kubernetes objects that run it: a pure function through the Jinja2 templates in manifests/.

`render(spec, api=...)` builds the job's typed parts once (rendering/parts.py: the job object's metadata,
the pod, the ConfigMap's and PodMonitor's) and returns plain dicts in apply order: the ConfigMap (train
jobs), the job API's objects (a PyTorchJob; or a TrainingRuntime + TrainJob: orchestrator/apis/<key>.py
writes them from the parts, with the one pod template of rendering/pod.py), then the PodMonitor. It reads
the packaged templates and nothing else; no cluster is asked. Every decision (names, labels, the torchrun
command, env, volumes, defaults) is made in Python; each kind's template writes its object from the parts.
`to_yaml` / `to_json` serialise the objects for the CLI.
"""

from __future__ import annotations

import functools
import json
import re
from typing import TYPE_CHECKING, Any

from orchestrator import apis, naming, runtime_env
from orchestrator.errors import SpecError
from orchestrator.rendering import parts, pod, scheduling, tracking_record
from orchestrator.rendering.templates import render_template

if TYPE_CHECKING:
    from orchestrator.job.spec import JobSpec

CONFIGMAP_TEMPLATE, PODMONITOR_TEMPLATE = "configmap.yaml.j2", "podmonitor.yaml.j2"


def resolve_api(spec: JobSpec, api: str | None = None) -> str:
    """The API `render` renders: `api`, else spec.api; auto is the first registered API (no cluster is asked
    here; `orch submit` resolves auto by discovery before calling render)."""
    return apis.resolve(api or spec.api)


def render(spec: JobSpec, *, name: str | None = None, api: str | None = None) -> list[dict[str, Any]]:
    """The objects that run `spec` on Kubernetes, in apply order: ConfigMap (train jobs only), the job API's
    objects, PodMonitor (when metrics are enabled). `name` overrides spec.name (e.g. a unique submit name);
    `api` overrides spec.api (a registered key, or auto)."""
    job_api = apis.by_key(check(spec, name=name, api=api))
    job = job_parts(spec, name or spec.name, job_api)
    objects = []
    if job.config_map is not None:
        objects.append(render_template(CONFIGMAP_TEMPLATE, config_map=job.config_map))
    objects += job_api.render(spec, job)
    if job.pod_monitor is not None:
        objects.append(render_template(PODMONITOR_TEMPLATE, monitor=job.pod_monitor))
    return objects


def check(spec: JobSpec, *, name: str | None = None, api: str | None = None) -> str:
    """Everything `render` refuses, without rendering: no image, an unknown API, what the API cannot carry
    (for `name`, default spec.name), tracking the pods cannot do. Returns the API key it checked for;
    raises SpecError. `orch submit` calls it before it asks the cluster or builds anything."""
    if not spec.image:
        raise SpecError("required to render or submit (the training image the pods run)", field="image")
    chosen = resolve_api(spec, api)
    if chosen not in apis.KEYS:
        raise SpecError(f"{chosen!r} is not one of {', '.join(apis.CHOICES)}", field="api")
    if problem := apis.by_key(chosen).spec_problem(spec, name or spec.name):
        raise SpecError(problem[1], field=problem[0])
    if found := spec.tracking_problem(dict.fromkeys({*spec.env, *spec.secret_env}, "set"), in_pod=True):
        raise SpecError(found[1], field=found[0])
    return chosen


def job_parts(spec: JobSpec, name: str, job_api: apis.JobAPI) -> parts.JobParts:
    """The parts every object of the job is written from, computed once from the spec: the job object's
    metadata, the pod (rendering/pod.py), the ConfigMap's (train jobs) and the PodMonitor's (metrics on)."""
    kind = job_api.resource.kind
    metadata = parts.Metadata(
        name=name,
        namespace=spec.namespace,
        labels={
            **spec.labels,
            **naming.standard_labels(name, naming.COMPONENT_TRAINING),
            **scheduling.kueue_labels(spec),
        },
        annotations={
            **spec.annotations,
            **tracking_record.annotation(spec, name, kind),
            **_output_annotation(spec),
        },
    )
    job_pod = pod.build(
        spec,
        name,
        kind=kind,
        main_containers=[a.container for a in apis.all_apis()],
        retry_limit=job_api.retry_limit(spec),
        group_pod_sets=job_api.groups_pod_sets(spec),
    )
    return parts.JobParts(
        metadata=metadata,
        pod=job_pod,
        config_map=_config_map(spec, name),
        pod_monitor=_pod_monitor(spec, name, container=job_api.container) if spec.metrics.enabled else None,
    )


def _config_map(spec: JobSpec, name: str) -> parts.ConfigMap | None:
    if spec.train is None:
        return None
    labels = {**spec.labels, **naming.standard_labels(name, naming.COMPONENT_CONFIG)}
    return parts.ConfigMap(
        metadata=parts.Metadata(naming.config_map_name(name), spec.namespace, labels),
        key=naming.TRAIN_CONFIG_KEY,
        train_json=runtime_env.train_json(spec.train),
    )


def _pod_monitor(spec: JobSpec, name: str, *, container: str) -> parts.PodMonitor:
    labels = {**spec.labels, **naming.standard_labels(name, naming.COMPONENT_MONITORING)}
    if spec.metrics.release:
        labels[naming.LABEL_PROMETHEUS_RELEASE] = spec.metrics.release
    return parts.PodMonitor(
        metadata=parts.Metadata(name, spec.namespace, labels),
        selector={naming.LABEL_JOB: name},
        pod_target_labels=(naming.LABEL_JOB,),
        port_name=naming.METRICS_PORT_NAME,
        # A named runtime's pods do not declare orch's port (runtimePatches have no ports): the PodMonitor
        # scrapes the pod IP at the port number instead (see podmonitor.yaml.j2).
        port_number=spec.metrics.port if spec.runtime is not None else None,
        container=container,
        interval=f"{spec.metrics.interval}s",
    )


def _output_annotation(spec: JobSpec) -> dict[str, str]:
    """output.url on the job object, for `orch status` (the pods get it as ORCH_OUTPUT_URL)."""
    if spec.output is None or spec.output.url is None:
        return {}
    return {naming.ANNOTATION_OUTPUT_URL: spec.output.url}


def warnings(spec: JobSpec, api: str | None = None) -> list[str]:
    """What a valid job risks on a cluster, one line each (pure; empty when all is well): `orch validate`,
    `orch render` and `orch submit` say them alike. An image of no fixed version, pods without requests
    (BestEffort), pods that may be scheduled partially, checkpoints that a restart would lose, and what
    the API adds."""
    chosen = resolve_api(spec, api)
    checks = (_image_warning(spec), _best_effort_warning(spec), _plain_secret_warning(spec))
    found = [message for message in checks if message]
    unguarded = scheduling.kueue_queue(spec) is None and scheduling.gang_scheduler(spec) is None
    if spec.nodes > 1 and spec.scheduling.gang is not False and spec.runtime is None and unguarded:
        found.append(
            f"nothing prevents partial scheduling: {spec.nodes} pods may start while others wait for "
            "room, holding their GPUs in the rendezvous; set scheduling.queue (Kueue) or "
            f"scheduling.scheduler: {naming.SCHEDULER_VOLCANO} | {naming.SCHEDULER_COSCHEDULING} "
            "(docs/cluster.md, Queues, gangs and recovery)"
        )
    if apis.by_key(chosen).restarts_replace_pods(spec) and not _output_on_volume(spec):
        found.append(
            f"restart.policy {spec.restart.policy} replaces pods, and the output dir {naming.OUTPUT_DIR} "
            "(checkpoints) is an emptyDir that goes with them: a restarted job starts from step 0; set "
            "output: {pvc: CLAIM}, output: {url: s3://BUCKET/PREFIX} or a train.checkpoint.dir on a pvc volume"
        )
    return [*found, *apis.by_key(chosen).warnings(spec)]


def _image_warning(spec: JobSpec) -> str | None:
    """An image named by `:latest` or by no tag (which is `:latest`) is not one build: Kubernetes pulls it
    again for every pod (imagePullPolicy Always for that tag), so pods started at different times (a restart,
    a second node, a resubmit) may run different code than the first. A digest or another tag is one build."""
    image = spec.image
    if not image or "@" in image:
        return None
    tag = image.rpartition("/")[2].partition(":")[2]
    if tag not in ("", "latest"):
        return None
    said = "the tag :latest" if tag else "no tag (that is :latest)"
    return (
        f"image {image} has {said}: each pod pulls whatever it names when it starts, so a restarted or later "
        "pod may run another build than the first; name a version (NAME:1.2) or a digest (NAME@sha256:...), "
        "e.g. the reference orch build prints"
    )


def _best_effort_warning(spec: JobSpec) -> str | None:
    """A pod without a cpu or memory request is BestEffort (Kubernetes' QoS classes count only those two; a
    GPU limit does not make it Burstable): the first evicted when its node runs short of memory, and one
    rank lost stops every rank of the job. Not with `runtime:` (the ClusterTrainingRuntime's pod may set
    them), nor when pod_overrides gives the trainer container resources."""
    if spec.resources.cpu or spec.resources.memory or spec.runtime is not None:
        return None
    containers = spec.pod_overrides.get("containers")
    overridden = isinstance(containers, list) and any(
        isinstance(c, dict) and isinstance(c.get("resources"), dict) and c["resources"] for c in containers
    )
    if overridden:
        return None
    return (
        "resources sets no cpu or memory, so the pods are BestEffort (no requests; a GPU limit does not "
        "count): the first evicted when a node runs short of memory, taking every rank with it; set "
        'resources: {cpu: "8", memory: 32Gi} (what one pod needs)'
    )


# A name whose last part says credential (HF_TOKEN, AWS_SECRET_ACCESS_KEY, WANDB_API_KEY, DB_PASSWORD): the last
# part only, so TOKENIZERS_PARALLELISM or MAX_TOKENS are not taken for one.
_CREDENTIAL_NAME = re.compile(
    r"(?:^|_)(?:TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?|(?:SECRET|API|ACCESS|ACCOUNT|PRIVATE|SESSION)_KEY)$"
)


def _plain_secret_warning(spec: JobSpec) -> str | None:
    """An `env:` value is written as is into the job's objects: anyone who can read the job (or its rendered
    YAML, or a CI log of `orch render`) reads it. A credential belongs in secret_env (a secretKeyRef). Warned,
    not refused: the name is only a hint, and `orch run` (no rendered object) is where env is fine. The
    value is never shown."""
    names = [name for name in spec.env if _CREDENTIAL_NAME.search(name.upper())]
    if not names:
        return None
    listed = ", ".join(f"env.{name}" for name in names)
    return (
        f"{listed} looks like a credential, and env values are written as they are into the job's objects "
        f"(anyone who can read the job reads it); give it to the pods from a Secret: secret_env: "
        f"{{{names[0]}: {{secret: NAME, key: KEY}}}}"
    )


def _output_on_volume(spec: JobSpec) -> bool:
    """Whether what a restart must find again lives on a PersistentVolumeClaim (or an object store)."""
    if spec.output is not None:
        return True
    claims = [v.mount.rstrip("/") + "/" for v in spec.volumes if v.pvc is not None and not v.read_only]
    if spec.train is None:
        return bool(claims)  # a command job may write anywhere; a writable claim is the best sign
    directory = spec.train.checkpoint.dir
    return bool(directory and directory.startswith("/") and any(directory.startswith(c) for c in claims))


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """Multi-document YAML, keys in render order (what `kubectl apply -f -` reads)."""
    text: str = _yaml().dump_all(
        objects, Dumper=_dumper(), sort_keys=False, allow_unicode=True, default_flow_style=False, width=100
    )
    return text


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
