"""JobSpec -> the Kubernetes objects that run it: a pure function through the Jinja2 templates in manifests/.

`render(spec)` returns plain dicts (ConfigMap, PyTorchJob, PodMonitor); it reads the packaged templates and
nothing else. Every decision (names, labels, the torchrun command, env, volumes, defaults) is made here in
Python; the templates only place the values. `to_yaml` / `to_json` serialise the objects for the CLI.

Facts about the Kubeflow training operator v1.9 this relies on (see docs/jobspec.md):
- it sets PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR/PORT (or PET_RDZV_* when elastic) and
  PET_NPROC_PER_NODE (from spec.nprocPerNode) in every container, and torchrun reads each `--flag` from
  `PET_<FLAG>`; so the command only names what to run, and topology follows the operator (also when the
  Worker replicas are scaled);
- the Master replica must say `replicas: 1`; a job without a Master (elastic) rendezvouses at worker-0;
- the main container must be called `pytorch` and expose the port `pytorchjob-port`.
"""

from __future__ import annotations

import functools
import json
import re
from typing import TYPE_CHECKING, Any

from orchestrator import naming
from orchestrator.errors import SpecError

if TYPE_CHECKING:
    import jinja2

    from orchestrator.spec import JobSpec

TEMPLATES = {
    "configmap": "configmap.yaml.j2",
    "pytorchjob": "pytorchjob.yaml.j2",
    "podmonitor": "podmonitor.yaml.j2",
}
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


def render(spec: JobSpec, *, name: str | None = None) -> list[dict[str, Any]]:
    """The objects that run `spec` on Kubernetes, in apply order: ConfigMap (train jobs only), PyTorchJob,
    PodMonitor (when metrics are enabled). `name` overrides spec.name (e.g. a unique submit name)."""
    if not spec.image:
        raise SpecError("required to render or submit (the training image the pods run)", field="image")
    context = _context(spec, name or spec.name)
    objects = []
    if spec.train is not None:
        objects.append(_render_template(TEMPLATES["configmap"], context))
    job = _render_template(TEMPLATES["pytorchjob"], context)
    if spec.pod_overrides:
        for replica in job["spec"]["pytorchReplicaSpecs"].values():
            pod = replica["template"]
            pod["spec"] = merge_overrides(pod["spec"], spec.pod_overrides)
    objects.append(job)
    if spec.metrics.enabled:
        objects.append(_render_template(TEMPLATES["podmonitor"], context))
    return objects


def _context(spec: JobSpec, name: str) -> dict[str, Any]:
    """Every value the templates place, computed from the spec."""
    training_labels = {**spec.labels, **naming.standard_labels(name, naming.COMPONENT_TRAINING)}
    job_labels = dict(training_labels)
    if spec.scheduling.queue:
        job_labels[naming.LABEL_KUEUE_QUEUE] = spec.scheduling.queue
    monitor_labels = {**spec.labels, **naming.standard_labels(name, naming.COMPONENT_MONITORING)}
    if spec.metrics.release:
        monitor_labels[naming.LABEL_PROMETHEUS_RELEASE] = spec.metrics.release
    return {
        "name": name,
        "namespace": spec.namespace,
        "job_labels": job_labels,
        "pod_labels": training_labels,
        "annotations": dict(spec.annotations),
        "nproc_per_node": str(spec.procs_per_node),
        "run_policy": _run_policy(spec),
        "elastic_policy": _elastic_policy(spec),
        "replicas": _replicas(spec),
        "restart_policy": RESTART_POLICIES[spec.restart.policy],
        "pod_security_context": {"seccompProfile": {"type": "RuntimeDefault"}},
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
        "env": _env(spec, name),
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
        "metrics_interval": f"{spec.metrics.interval}s",
    }


def train_json(spec: JobSpec) -> str | None:
    """The ConfigMap's train.json: what `python -m orchestrator.trainer --config` reads."""
    if spec.train is None:
        return None
    return json.dumps(spec.train.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"


def torchrun_command(spec: JobSpec) -> list[str]:
    """torchrun with the per-pod process count; nnodes, node rank and the rendezvous come from the
    operator's PET_* env. A `command:` job runs as given (`--no-python`: torchrun execs it directly)."""
    launcher = ["torchrun", f"--nproc-per-node={spec.procs_per_node}"]
    if spec.command is not None:
        return [*launcher, "--no-python", *spec.command]
    return [*launcher, "-m", TRAINER_MODULE, "--config", naming.TRAIN_CONFIG_PATH]


def _elastic_agent(spec: JobSpec) -> bool:
    """Whether torchrun runs as an elastic agent: `elastic:` jobs, and restart.policy job on a PyTorchJob
    (min = max = nodes: any failed process makes every agent restart its workers and re-form the group)."""
    return spec.elastic is not None or spec.restart.policy == "job"


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


def _env(spec: JobSpec, name: str) -> list[dict[str, Any]]:
    """orch's runtime facts first, then the user's env (which wins on a clash), then secretKeyRefs."""
    values = {
        "ORCH_JOB_NAME": name,
        "ORCH_OUTPUT_DIR": naming.OUTPUT_DIR,
        "ORCH_METRICS_PORT": str(spec.metrics.port) if spec.metrics.enabled else "0",
        "ORCH_GPU_SAMPLE_SECONDS": str(spec.metrics.gpu_sample_seconds),
    }
    if spec.metrics.peak_tflops is not None:
        values["ORCH_PEAK_TFLOPS"] = str(spec.metrics.peak_tflops)
    if spec.train is not None and spec.train.cuda_alloc_conf:
        values["PYTORCH_CUDA_ALLOC_CONF"] = spec.train.cuda_alloc_conf
    values.update(spec.env)
    env: list[dict[str, Any]] = [
        {"name": k, "value": v} for k, v in values.items() if k not in spec.secret_env
    ]
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}}
        for k, ref in spec.secret_env.items()
    ]
    return env


def _ports(spec: JobSpec) -> list[dict[str, Any]]:
    ports = [{"name": naming.RDZV_PORT_NAME, "containerPort": naming.RDZV_PORT, "protocol": "TCP"}]
    if spec.metrics.enabled:
        ports.append(
            {"name": naming.METRICS_PORT_NAME, "containerPort": spec.metrics.port, "protocol": "TCP"}
        )
    return ports


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
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(spec.gpus_per_node)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def shm_size(spec: JobSpec) -> str:
    """/dev/shm sizeLimit: resources.shm, else 2Gi per GPU (1Gi on a CPU pod). Pods get 64M without it."""
    if spec.resources.shm:
        return spec.resources.shm
    return f"{SHM_PER_GPU_GI * spec.gpus_per_node}Gi" if spec.gpus_per_node else SHM_CPU_DEFAULT


def _volume_mounts(spec: JobSpec) -> list[dict[str, Any]]:
    mounts = [{"name": VOLUME_SHM, "mountPath": "/dev/shm"}]
    if spec.train is not None:
        mounts.append({"name": VOLUME_CONFIG, "mountPath": naming.CONFIG_DIR, "readOnly": True})
    mounts.append({"name": VOLUME_OUTPUT, "mountPath": naming.OUTPUT_DIR})
    for volume in spec.volumes:
        mount = {"name": volume.name, "mountPath": volume.mount}
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
