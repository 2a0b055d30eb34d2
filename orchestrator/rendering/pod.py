"""The pod every job API runs, written once: `template(context, ...)` and the pieces of the context it reads.

Both APIs run the same container (torchrun, the same env, volumes and security settings); what differs is
only which fields travel in the pod and which elsewhere (a TrainJob passes env and resources through
`spec.trainer`, a runtime patch carries only what the TrainJob CRD lets it set). Each API module
(orchestrator/apis/) says which; `template` builds the pod and merges `pod_overrides` into it (the one place
they are merged). Pure functions of the spec: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from orchestrator import launch, naming

if TYPE_CHECKING:
    from orchestrator.job.spec import JobSpec, Toleration, Volume

TRAINER_MODULE = "orchestrator.trainer"
LAUNCHER = ["python", "-m", "orchestrator.launch"]  # torchrun whose exit code keeps the failure's class
TORCHRUN_SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
STOP_MARGIN_SECONDS = 30  # past train.checkpoint.on_stop: torchrun's own exit, the tracking deadline
SHM_PER_GPU_GI = 2  # /dev/shm default: 2Gi per GPU (NCCL ~33M per communicator + pinned DataLoader batches)
SHM_CPU_DEFAULT = "1Gi"  # /dev/shm default of a CPU pod (gloo and DataLoader workers)
VOLUME_SHM, VOLUME_CONFIG, VOLUME_OUTPUT = "orch-shm", "orch-config", "orch-output"
POD_SECURITY_CONTEXT = {"seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY_CONTEXT = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
# Fields of the container that an API may leave out of the pod (they travel elsewhere, or are the runtime's).
CONTAINER_PAYLOAD = ("image", "command", "env", "ports", "resources")


def template(
    context: dict[str, Any],
    *,
    container: str,
    carries: Collection[str] = CONTAINER_PAYLOAD,
    ports: list[dict[str, Any]] = [],  # noqa: B006  (read, never changed)
    restart_policy: str | None = None,
    grace: bool = True,
) -> dict[str, Any]:
    """The pod template ({metadata, spec}) of every replica: `container` names the main container, `carries`
    says which of CONTAINER_PAYLOAD it holds here, `ports` its ports (the API's own and `metrics_ports`).
    `grace`: whether the pod carries terminationGracePeriodSeconds (a Trainer runtime patch accepts it only
    from v2.3). `pod_overrides` are merged last; a container named like any API's main one is the main one."""
    main: dict[str, Any] = {"name": container}
    payload = {
        "image": context["image"],
        "command": context["command"],
        "env": context["env"],
        "ports": ports,
        "resources": context["resources"],
    }
    main.update({key: value for key, value in payload.items() if key in carries and value})
    main["securityContext"] = CONTAINER_SECURITY_CONTEXT
    main["volumeMounts"] = context["volume_mounts"]
    spec: dict[str, Any] = {}
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    spec["securityContext"] = POD_SECURITY_CONTEXT
    if grace and context["termination_grace_seconds"] is not None:
        spec["terminationGracePeriodSeconds"] = context["termination_grace_seconds"]
    for key, value in (
        ("serviceAccountName", context["service_account"]),
        ("priorityClassName", context["priority_class"]),
        ("schedulerName", context["scheduler_name"]),
        ("nodeSelector", context["node_selector"]),
        ("tolerations", context["tolerations"]),
        ("affinity", context["affinity"]),
        ("imagePullSecrets", context["image_pull_secrets"]),
    ):
        if value:
            spec[key] = value
    spec["containers"] = [main]
    spec["volumes"] = context["volumes"]
    if context["pod_overrides"]:
        overrides = portable_overrides(context["pod_overrides"], container, context["main_containers"])
        spec = merge_overrides(spec, overrides)
    metadata: dict[str, Any] = {"labels": context["pod_labels"]}
    if context["pod_annotations"]:
        metadata["annotations"] = context["pod_annotations"]
    return {"metadata": metadata, "spec": spec}


def main_container(pod_template: dict[str, Any], name: str) -> dict[str, Any]:
    """The container called `name` in a pod template `template` built ({} if pod_overrides removed it)."""
    containers = pod_template["spec"].get("containers")
    found = [c for c in containers or [] if isinstance(c, dict) and c.get("name") == name]
    return found[0] if found else {}


def context(
    spec: JobSpec, name: str, *, kind: str, main_containers: Collection[str], retry_limit: int | None = None
) -> dict[str, Any]:
    """What `template` reads: the pod's values, computed from the spec (`kind`: the API's object kind, which
    the trainer is told; `main_containers`: every API's main container name, for `pod_overrides`;
    `retry_limit`: the launcher's bound on exit-code retries the controller does not bound itself)."""
    return {
        "pod_labels": {**spec.labels, **naming.standard_labels(name, naming.COMPONENT_TRAINING)},
        "service_account": spec.service_account,
        "priority_class": spec.scheduling.priority_class,
        "scheduler_name": spec.scheduling.scheduler,
        "node_selector": dict(spec.node_selector),
        "tolerations": [_toleration(t) for t in spec.tolerations],
        "affinity": spec.affinity,
        "image_pull_secrets": [{"name": secret} for secret in spec.image_pull_secrets],
        "image": spec.image,
        "command": torchrun_command(spec),
        "env": _env(spec, name, kind, retry_limit),
        "termination_grace_seconds": termination_grace_seconds(spec),
        "resources": resources(spec),
        "volume_mounts": _volume_mounts(spec),
        "volumes": _volumes(spec, name),
        "pod_overrides": spec.pod_overrides,
        "main_containers": tuple(main_containers),
    }


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


def _toleration(toleration: Toleration) -> dict[str, Any]:
    rendered = {
        "key": toleration.key,
        "operator": toleration.operator,
        "value": toleration.value,
        "effect": toleration.effect,
        "tolerationSeconds": toleration.toleration_seconds,
    }
    return {k: v for k, v in rendered.items() if v is not None}


def _env(spec: JobSpec, name: str, kind: str, retry_limit: int | None = None) -> list[dict[str, Any]]:
    """orch's runtime facts first, then the user's env (which wins on a clash), then secretKeyRefs."""
    from orchestrator import (
        runtime_env,
    )  # here: it imports the spec (pydantic); `orch status` reads pods only

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
    env: list[dict[str, Any]] = [
        {"name": k, "value": v} for k, v in values.items() if k not in spec.secret_env
    ]
    if retry_limit is not None:  # the start count is kept per submission (orch submit annotates the pods)
        env.append(
            {
                "name": launch.ENV_SUBMISSION,
                "valueFrom": {
                    "fieldRef": {"fieldPath": f"metadata.annotations['{naming.ANNOTATION_SUBMISSION}']"}
                },
            }
        )
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}}
        for k, ref in {**_tracking_secrets(spec), **spec.secret_env}.items()
    ]
    if spec.tracking.mlflow is not None and runtime_env.ENV_NAMESPACE not in {*spec.env, *spec.secret_env}:
        env.append(
            {
                "name": runtime_env.ENV_NAMESPACE,
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            }
        )
    return env


def _tracking_secrets(spec: JobSpec) -> dict[str, Any]:
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


def metrics_ports(spec: JobSpec) -> list[dict[str, Any]]:
    """The exporter's named port (the PodMonitor scrapes it), when metrics are on."""
    if not spec.metrics.enabled:
        return []
    return [{"name": naming.METRICS_PORT_NAME, "containerPort": spec.metrics.port, "protocol": "TCP"}]


def resources(spec: JobSpec) -> dict[str, Any]:
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
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def shm_size(spec: JobSpec) -> str:
    """/dev/shm sizeLimit: resources.shm, else 2Gi per GPU (1Gi on a CPU pod). Pods get 64M without it."""
    if spec.resources.shm:
        return spec.resources.shm
    return f"{SHM_PER_GPU_GI * spec.gpus_per_node}Gi" if spec.gpus_per_node else SHM_CPU_DEFAULT


def _volume_mounts(spec: JobSpec) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [{"name": VOLUME_SHM, "mountPath": "/dev/shm"}]
    if spec.train is not None:
        mounts.append({"name": VOLUME_CONFIG, "mountPath": naming.CONFIG_DIR, "readOnly": True})
    output = {"name": VOLUME_OUTPUT, "mountPath": naming.OUTPUT_DIR}
    if spec.output is not None and spec.output.pvc is not None:
        output["subPath"] = spec.output.sub_path or spec.name
    mounts.append(output)
    for volume in spec.volumes:
        mount: dict[str, Any] = {"name": volume.name, "mountPath": volume.mount}
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
    if spec.output is not None and spec.output.pvc is not None:
        volumes.append({"name": VOLUME_OUTPUT, "persistentVolumeClaim": {"claimName": spec.output.pvc}})
    else:  # no output, or an object store (output.url): the local side (logs, TensorBoard's files) only
        volumes.append({"name": VOLUME_OUTPUT, "emptyDir": {}})
    for volume in spec.volumes:
        volumes.append({"name": volume.name, **_volume_source(volume)})
    return volumes


def _volume_source(volume: Volume) -> dict[str, Any]:
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
