"""The pod every job API runs, built once (`build`: the typed parts.Pod) and written once (`template`).

Both APIs run the same container (torchrun, the same env, volumes and security settings); what differs is
only which fields travel in the pod and which elsewhere (a TrainJob passes env and resources through
`spec.trainer`, a runtime patch carries only what the TrainJob CRD lets it set). Each API module
(orchestrator/apis/) says which in a parts.PodLayout; `template` writes the pod through
manifests/pod.yaml.j2 and merges `pod_overrides` into it (the one place they are merged). Pure functions of
the spec: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from orchestrator import launch, naming
from orchestrator.rendering import scheduling, templates
from orchestrator.rendering.parts import (
    Container,
    EnvVar,
    Pod,
    PodLayout,
    Port,
    Resources,
    Volume,
    VolumeMount,
)

if TYPE_CHECKING:
    from orchestrator.job import spec as job_spec
    from orchestrator.job.spec import JobSpec

TEMPLATE = "pod.yaml.j2"
TRAINER_MODULE = "orchestrator.trainer"
LAUNCHER = ["python", "-m", "orchestrator.launch"]  # torchrun whose exit code keeps the failure's class
TORCHRUN_SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
STOP_MARGIN_SECONDS = 30  # past train.checkpoint.on_stop: torchrun's own exit, the tracking deadline
SHM_PER_GPU_GI = 2  # /dev/shm default: 2Gi per GPU (NCCL ~33M per communicator + pinned DataLoader batches)
SHM_CPU_DEFAULT = "1Gi"  # /dev/shm default of a CPU pod (gloo and DataLoader workers)
VOLUME_SHM, VOLUME_CONFIG, VOLUME_OUTPUT = "orch-shm", "orch-config", "orch-output"


def template(pod: Pod, layout: PodLayout) -> dict[str, Any]:
    """The pod template ({metadata, spec}) of every replica, as `layout` holds it (manifests/pod.yaml.j2).
    `pod.overrides` are merged last; a container named like any API's main one is the main one."""
    written = templates.render_template(TEMPLATE, pod=pod, layout=layout)
    if pod.overrides:
        overrides = portable_overrides(pod.overrides, layout.container, pod.main_containers)
        written["spec"] = merge_overrides(written["spec"], overrides)
        if "affinity" in overrides and pod.excluded_nodes:  # an affinity of pod_overrides keeps off them too
            spec = written["spec"]
            spec["affinity"] = scheduling.excluding_nodes(spec.get("affinity"), pod.excluded_nodes)
    return written


def main_container(pod_template: dict[str, Any], name: str) -> dict[str, Any]:
    """The container called `name` in a pod template `template` wrote ({} if pod_overrides removed it)."""
    containers = pod_template["spec"].get("containers")
    found = [c for c in containers or [] if isinstance(c, dict) and c.get("name") == name]
    return found[0] if found else {}


def build(
    spec: JobSpec,
    name: str,
    *,
    kind: str,
    main_containers: Collection[str],
    retry_limit: int | None = None,
    group_pod_sets: bool = False,
) -> Pod:
    """The pod's parts, from the spec (`kind`: the API's object kind, which the trainer is told;
    `main_containers`: every API's main container name, for `pod_overrides`; `retry_limit`: the launcher's
    bound on exit-code retries the controller does not bound itself; `group_pod_sets`: whether the job's
    PodSets share one Kueue topology group)."""
    topology = scheduling.topology_annotations(spec, name, group_pod_sets=group_pod_sets)
    container = Container(
        image=spec.image or "",  # render.check refuses a spec without one
        command=torchrun_command(spec),
        env=env(spec, name, kind, retry_limit),
        resources=resources(spec),
        ports=metrics_ports(spec),
        volume_mounts=_volume_mounts(spec),
    )
    return Pod(
        labels={**spec.labels, **naming.standard_labels(name, naming.COMPONENT_TRAINING)},
        annotations={**spec.annotations, **topology, **scheduling.volcano_queue_annotation(spec)},
        service_account=spec.service_account,
        priority_class=spec.scheduling.priority_class,
        scheduler_name=spec.scheduling.scheduler,
        node_selector=dict(spec.node_selector),
        tolerations=tuple(_toleration(t) for t in spec.tolerations),
        affinity=scheduling.excluding_nodes(spec.affinity, spec.scheduling.exclude_nodes),
        excluded_nodes=tuple(spec.scheduling.exclude_nodes),
        image_pull_secrets=tuple(spec.image_pull_secrets),
        termination_grace_seconds=termination_grace_seconds(spec),
        container=container,
        volumes=_volumes(spec, name),
        overrides=spec.pod_overrides,
        main_containers=tuple(main_containers),
    )


def termination_grace_seconds(spec: JobSpec) -> int | None:
    """The pods' terminationGracePeriodSeconds: long enough for the trainer's stop checkpoint after a
    SIGTERM (train.checkpoint.on_stop) and torchrun's exit; None (Kubernetes' 30 s) for command jobs and
    on_stop: false. Not rendered into a ClusterTrainingRuntime's runtimePatches (`runtime: NAME`): a patch
    accepts the field only from Trainer v2.3, so that runtime's own pod template decides."""
    if spec.train is None or not spec.train.checkpoint.on_stop:
        return None
    return spec.train.checkpoint.on_stop + STOP_MARGIN_SECONDS


def torchrun_command(spec: JobSpec) -> list[str]:
    """torchrun with the per-pod process count; nnodes, node rank and the rendezvous come from the
    controller's PET_* env. A `command:` job runs as given (`--no-python`: torchrun execs it directly).

    Train jobs (orch's image) start torchrun through orchestrator.launch, whose exit code tells a signal or
    a SIGTERM of the pod (>= 128, retryable) from a program error (1-127): plain torchrun exits 1 for both.
    A `command:` job may bring an image without orch, so it gets the launcher only where the exit code
    decides something (restart.policy exit-code; docs/jobspec.md says its image needs orch then)."""
    needs_launcher = spec.train is not None or spec.restart.policy == "exit-code"
    launcher = [*(LAUNCHER if needs_launcher else ["torchrun"]), f"--nproc-per-node={spec.procs_per_node}"]
    if spec.command is not None:
        return [*launcher, "--no-python", *spec.command]
    return [*launcher, "-m", TRAINER_MODULE, "--config", naming.TRAIN_CONFIG_PATH]


def _toleration(toleration: job_spec.Toleration) -> dict[str, Any]:
    rendered = {
        "key": toleration.key,
        "operator": toleration.operator,
        "value": toleration.value,
        "effect": toleration.effect,
        "tolerationSeconds": toleration.toleration_seconds,
    }
    return {k: v for k, v in rendered.items() if v is not None}


def env(spec: JobSpec, name: str, kind: str, retry_limit: int | None = None) -> tuple[EnvVar, ...]:
    """orch's runtime facts first, then the user's env (which wins on a clash), then secretKeyRefs."""
    # here: it imports the spec (pydantic), and `orch status` imports the API modules, which import this one
    from orchestrator import runtime_env

    output_url = spec.output.url if spec.output is not None else None  # the object store keeps the outputs
    runtime = runtime_env.RuntimeEnv.for_job(
        spec, name=name, output_dir=naming.OUTPUT_DIR, output_url=output_url, api_kind=kind
    )
    values = runtime.to_env()
    if spec.train is not None and spec.train.cuda_alloc_conf:
        values["PYTORCH_CUDA_ALLOC_CONF"] = spec.train.cuda_alloc_conf
    if retry_limit is not None:
        values[launch.ENV_RETRY_LIMIT] = str(retry_limit)
    if spec.train is not None and spec.train.checkpoint.on_stop:
        # torchrun's wait for its ranks' stop checkpoint before it SIGKILLs them (read from torch 2.12)
        values[TORCHRUN_SHUTDOWN_TIMEOUT_ENV] = str(spec.train.checkpoint.on_stop)
    values.update(spec.env)
    found = [EnvVar(k, value=v) for k, v in values.items() if k not in spec.secret_env]
    if retry_limit is not None:  # the start count is kept per submission (orch submit annotates the pods)
        submission = f"metadata.annotations['{naming.ANNOTATION_SUBMISSION}']"
        found.append(EnvVar(launch.ENV_SUBMISSION, value_from={"fieldRef": {"fieldPath": submission}}))
    found += [
        EnvVar(k, value_from={"secretKeyRef": {"name": ref.secret, "key": ref.key}})
        for k, ref in {**_tracking_secrets(spec), **spec.secret_env}.items()
    ]
    if spec.tracking.mlflow is not None and runtime_env.ENV_NAMESPACE not in {*spec.env, *spec.secret_env}:
        namespace = {"fieldRef": {"fieldPath": "metadata.namespace"}}
        found.append(EnvVar(runtime_env.ENV_NAMESPACE, value_from=namespace))
    return tuple(found)


def _tracking_secrets(spec: JobSpec) -> dict[str, job_spec.SecretRef]:
    """tracking.mlflow.credentials -> MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN from their Secrets."""
    from orchestrator.job.spec import MLFLOW_CREDENTIAL_ENV

    if spec.tracking.mlflow is None:
        return {}
    credentials = spec.tracking.mlflow.credentials
    return {
        env_name: getattr(credentials, key)
        for key, env_name in MLFLOW_CREDENTIAL_ENV.items()
        if getattr(credentials, key) is not None
    }


def metrics_ports(spec: JobSpec) -> tuple[Port, ...]:
    """The exporter's named port (the PodMonitor scrapes it), when metrics are on."""
    return (Port(naming.METRICS_PORT_NAME, spec.metrics.port),) if spec.metrics.enabled else ()


def resources(spec: JobSpec) -> Resources:
    """CPU is requested, not limited (a CPU limit throttles DataLoader and NCCL threads); memory and GPUs are
    both requested and limited. The /dev/shm emptyDir counts against the memory limit."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if spec.resources.cpu:
        requests["cpu"] = spec.resources.cpu
    if spec.resources.memory:
        requests["memory"] = limits["memory"] = spec.resources.memory
    if spec.gpus_per_node:
        requests[naming.GPU_RESOURCE] = limits[naming.GPU_RESOURCE] = str(spec.gpus_per_node)
    return Resources(requests=requests, limits=limits)


def shm_size(spec: JobSpec) -> str:
    """/dev/shm sizeLimit: resources.shm, else 2Gi per GPU (1Gi on a CPU pod). Pods get 64M without it."""
    if spec.resources.shm:
        return spec.resources.shm
    return f"{SHM_PER_GPU_GI * spec.gpus_per_node}Gi" if spec.gpus_per_node else SHM_CPU_DEFAULT


def _volume_mounts(spec: JobSpec) -> tuple[VolumeMount, ...]:
    mounts = [VolumeMount(VOLUME_SHM, "/dev/shm")]
    if spec.train is not None:
        mounts.append(VolumeMount(VOLUME_CONFIG, naming.CONFIG_DIR, read_only=True))
    output = spec.output
    sub_path = (output.sub_path or spec.name) if output is not None and output.pvc is not None else None
    mounts.append(VolumeMount(VOLUME_OUTPUT, naming.OUTPUT_DIR, sub_path=sub_path))
    mounts += [VolumeMount(v.name, v.mount, read_only=v.read_only) for v in spec.volumes]
    return tuple(mounts)


def _volumes(spec: JobSpec, name: str) -> tuple[Volume, ...]:
    volumes = [Volume(VOLUME_SHM, "emptyDir", {"medium": "Memory", "sizeLimit": shm_size(spec)})]
    if spec.train is not None:
        volumes.append(Volume(VOLUME_CONFIG, "configMap", {"name": naming.config_map_name(name)}))
    if spec.output is not None and spec.output.pvc is not None:
        volumes.append(Volume(VOLUME_OUTPUT, "persistentVolumeClaim", {"claimName": spec.output.pvc}))
    else:  # no output, or an object store (output.url): the local side (logs, TensorBoard's files) only
        volumes.append(Volume(VOLUME_OUTPUT, "emptyDir", {}))
    volumes += [_volume(v) for v in spec.volumes]
    return tuple(volumes)


def _volume(volume: job_spec.Volume) -> Volume:
    if volume.pvc is not None:
        claim: dict[str, Any] = {"claimName": volume.pvc}
        if volume.read_only:
            claim["readOnly"] = True
        return Volume(volume.name, "persistentVolumeClaim", claim)
    if volume.config_map is not None:
        return Volume(volume.name, "configMap", {"name": volume.config_map})
    if volume.secret is not None:
        return Volume(volume.name, "secret", {"secretName": volume.secret})
    size = volume.empty_dir
    return Volume(volume.name, "emptyDir", {"sizeLimit": size} if isinstance(size, str) else {})


def portable_overrides(overrides: dict[str, Any], main: str, main_names: Collection[str]) -> dict[str, Any]:
    """pod_overrides for one API: a container named like any API's main container (`main_names`: `pytorch`,
    `node`) is orch's main container on every API, so one job file's overrides patch the trainer under all."""
    containers = overrides.get("containers")
    if not isinstance(containers, list):
        return overrides
    renamed = [
        {**c, "name": main} if isinstance(c, dict) and c.get("name") in main_names else c for c in containers
    ]
    return {**overrides, "containers": renamed}


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
