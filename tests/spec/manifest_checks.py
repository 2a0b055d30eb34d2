"""Checks a Kubernetes control plane would make on orch's objects, offline.

- CRD schemas: the real CRDs, found through tests/schemas.py (`ORCH_CRD_SCHEMAS`, never copied into the
  repo), turned into strict JSON Schema: where the CRD lists `properties`, any other key is an error, as with
  `kubectl apply --validate=strict` (the apiserver would silently prune it instead).
- The Kubeflow training operator v1.9 validating webhook (pkg/webhooks/pytorch/pytorchjob_webhook.go), hand-ported.
- Kubeflow Trainer v2 (kubeflow/trainer master): the TrainJob and TrainingRuntime webhooks
  (pkg/webhooks/{trainjob,trainingruntime}_webhook.go) and the custom validations the TrainJob webhook runs
  (plugins torch.go Validate, jobset.go Validate, volcano.go Validate; runtime/core/trainingruntime.go
  ValidateObjects: the runtime must exist before the TrainJob), plus the create-time CEL rules of the CRDs;
  the JobSet template inside a runtime against the JobSet CRD, and each of its Jobs as a batch/v1 Job.
- Built-in kinds (ConfigMap, and each pod template as a Pod) against kubernetes-validate's strict schemas.
What stays unchecked: list-map key uniqueness, update-only CEL rules, defaulting, the JobSet webhook.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tests.schemas import crd_file

REPO = Path(__file__).resolve().parents[2]
CRD_FILES = {
    ("kubeflow.org/v1", "PyTorchJob"): "pytorchjobs.kubeflow.org.yaml",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitors.monitoring.coreos.com.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrules.monitoring.coreos.com.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainjobs.trainer.kubeflow.org.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): "trainingruntimes.trainer.kubeflow.org.yaml",
    (
        "trainer.kubeflow.org/v1alpha1",
        "ClusterTrainingRuntime",
    ): "clustertrainingruntimes.trainer.kubeflow.org.yaml",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobsets.jobset.x-k8s.io.yaml",
}
RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")
# Trainer v2 constants (pkg/constants/constants.go) and the webhooks' tables.
LABEL_ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_CONTAINERS = {  # trainingruntime_webhook.go expectedContainerNames
    "trainer": "node",
    "dataset-initializer": "dataset-initializer",
    "model-initializer": "model-initializer",
}
TORCHRUN_RESERVED_ENV = {
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
}
TRAINJOB_MANAGED_BY = (None, "trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue")
VOLCANO_QUEUE = "scheduling.volcano.sh/queue-name"
# Trainer v2's default ClusterTrainingRuntime torch-distributed (manifests/base/runtimes/torch_distributed.yaml):
# replicated job -> its containers. A TrainJob on a ClusterTrainingRuntime is checked against this shape.
TORCH_DISTRIBUTED_SHAPE = {"node": {"node"}}
DOMAIN_PREFIXED_PATH = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*(/[^/]+)+$"
)
KUBERNETES_VERSION = "1.32"  # kubernetes-validate schema set; the v1.9 operator supports 1.27+
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MANAGED_BY_VALUES = (None, "", "kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue")


def to_jsonschema(node: Any, strict: bool = True) -> Any:
    """A CRD structural schema node -> JSON Schema (draft 7)."""
    if isinstance(node, list):
        return [to_jsonschema(n, strict) for n in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: to_jsonschema(v, strict)
        for k, v in node.items()
        if not k.startswith("x-kubernetes-") and k not in ("description", "nullable")
    }
    if node.get("x-kubernetes-int-or-string"):
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
        out.pop("type", None)
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if node.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    if (
        strict
        and "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
        and not node.get("x-kubernetes-embedded-resource")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    path = crd_file(CRD_FILES[(api_version, kind)])
    crd = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = api_version.split("/")[-1]
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema = to_jsonschema(served["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is checked as part of a Pod below
    return jsonschema.Draft7Validator(schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """Every schema error of one rendered object, as `path: message`."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key in CRD_FILES:
        validator = crd_validator(*key)
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
        if key[1] in RUNTIME_KINDS:
            errors += _runtime_template_errors(obj)
        if key[1] == "TrainJob":
            for index, patch in enumerate(obj.get("spec", {}).get("runtimePatches") or []):
                for rjob in _patch_replicated_jobs(patch):
                    template = ((rjob.get("template") or {}).get("spec") or {}).get("template")
                    if template:
                        pod = {"apiVersion": "v1", "kind": "Pod", **template}
                        pod["metadata"] = {"name": "patch", **template.get("metadata", {})}
                        errors += [f"runtimePatches[{index}] pod: {e}" for e in builtin_errors(pod)]
        if key[1] == "PyTorchJob":
            for rtype, replica in (obj.get("spec", {}).get("pytorchReplicaSpecs") or {}).items():
                pod = {"apiVersion": "v1", "kind": "Pod", **replica.get("template", {})}
                pod["metadata"] = {
                    "name": f"{obj['metadata']['name']}-{rtype.lower()}-0",
                    **pod.get("metadata", {}),
                }
                errors += [f"{rtype} pod: {e}" for e in builtin_errors(pod)]
        return errors
    return builtin_errors(obj)


def builtin_errors(obj: dict[str, Any]) -> list[str]:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{'.'.join(map(str, error.path))}: {error.message}"]
    except kubernetes_validate.SchemaNotFoundError as error:
        return [f"no schema for {obj.get('kind')}: {error}"]
    return []


def webhook_errors(job: dict[str, Any]) -> list[str]:
    """The training operator v1.9 PyTorchJob validating webhook (create), ported from Go."""
    errors = []
    name = job.get("metadata", {}).get("name", "")
    if len(name) > 63 or not DNS1035_LABEL.match(name):
        errors.append(f"metadata.name: {name!r} is not a DNS-1035 label")
    spec = job.get("spec", {})
    if spec.get("runPolicy", {}).get("managedBy") not in MANAGED_BY_VALUES:
        errors.append("spec.runPolicy.managedBy: not supported")
    replica_specs = spec.get("pytorchReplicaSpecs")
    if spec.get("elasticPolicy") is not None:
        if "Worker" not in (replica_specs or {}):
            errors.append("spec.pytorchReplicaSpecs[Worker]: must be configured if elastic policy is used")
        if spec["elasticPolicy"].get("nProcPerNode") is not None and spec.get("nprocPerNode") is not None:
            errors.append("spec.elasticPolicy.nProcPerNode: must not be used with spec.nprocPerNode")
    if replica_specs is None:
        errors.append("spec.pytorchReplicaSpecs: must be required")
    for rtype, replica in (replica_specs or {}).items():
        path = f"spec.pytorchReplicaSpecs[{rtype}]"
        if rtype not in ("Master", "Worker"):
            errors.append(f"{path}: replica type not supported (Master, Worker)")
        containers = ((replica or {}).get("template", {}).get("spec", {}) or {}).get("containers") or []
        if not containers:
            errors.append(f"{path}.template.spec.containers: must be specified")
        for index, container in enumerate(containers):
            if not container.get("image"):
                errors.append(f"{path}.template.spec.containers[{index}].image: must be required")
        if not any(c.get("name") == "pytorch" for c in containers):
            errors.append(
                f"{path}.template.spec.containers: must have at least one container with name pytorch"
            )
        replicas = (replica or {}).get("replicas")
        if rtype == "Master" and replicas != 1:
            errors.append(f"{path}.replicas: must be 1")
        elif rtype != "Master" and isinstance(replicas, int) and replicas < 1:
            errors.append(f"{path}.replicas: must be at least 1")
    return errors


def _runtime_template_errors(runtime: dict[str, Any]) -> list[str]:
    """A runtime's template is a JobSet spec: check it as a JobSet, and each replicated job as a batch Job."""
    template = runtime.get("spec", {}).get("template") or {}
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": runtime.get("metadata", {}).get("name", "")},
        "spec": template.get("spec") or {},
    }
    validator = crd_validator("jobset.x-k8s.io/v1alpha2", "JobSet")
    errors = [
        f"template as JobSet: {'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(jobset)
    ]
    for rjob in jobset["spec"].get("replicatedJobs") or []:
        job = {"apiVersion": "batch/v1", "kind": "Job", **(rjob.get("template") or {})}
        job["metadata"] = {
            "name": f"{jobset['metadata']['name']}-{rjob.get('name')}-0",
            **job.get("metadata", {}),
        }
        errors += [f"replicatedJobs[{rjob.get('name')}] as Job: {e}" for e in builtin_errors(job)]
        errors += [f"replicatedJobs[{rjob.get('name')}] as Job: {e}" for e in job_rule_errors(job)]
    return errors


def job_rule_errors(job: dict[str, Any]) -> list[str]:
    """batch/v1 Job rules the apiserver checks in code, not in the schema (pkg/apis/batch/validation)."""
    spec = job.get("spec") or {}
    restart = ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy")
    errors = []
    if restart not in ("OnFailure", "Never"):
        errors.append(f"spec.template.spec.restartPolicy: Unsupported value {restart!r}: OnFailure, Never")
    if spec.get("podFailurePolicy") is not None and restart != "Never":
        errors.append(
            "spec.template.spec.restartPolicy: only Never is supported when podFailurePolicy is set"
        )
    return errors


def _patch_replicated_jobs(patch: dict[str, Any]) -> list[dict[str, Any]]:
    spec = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}
    return spec.get("replicatedJobs") or []


def runtime_webhook_errors(runtime: dict[str, Any]) -> list[str]:
    """trainingruntime_webhook.go validateReplicatedJobs (the same for ClusterTrainingRuntime), plus the
    CRD's create-time CEL rule on mlPolicy."""
    errors = []
    spec = runtime.get("spec", {})
    policies = [p for p in ("torch", "mpi", "jax", "xgboost", "flux") if p in (spec.get("mlPolicy") or {})]
    if len(policies) > 1:
        errors.append("spec.mlPolicy: Only one of the policy can be configured")
    template = spec.get("template") or {}
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    if VOLCANO_QUEUE in annotations and not annotations[VOLCANO_QUEUE]:
        errors.append(f"spec.annotations[{VOLCANO_QUEUE}]: must not be empty")  # volcano.go Validate
    for index, rjob in enumerate((template.get("spec") or {}).get("replicatedJobs") or []):
        labels = ((rjob.get("template") or {}).get("metadata") or {}).get("labels") or {}
        ancestor = labels.get(LABEL_ANCESTOR)
        if ancestor not in ANCESTOR_CONTAINERS:
            continue
        path = f"spec.template.spec.replicatedJobs[{index}]"
        if rjob.get("replicas", 1) != 1:  # JobSet defaults replicas to 1
            errors.append(f"{path}.replicas: always must be 1")
        pod = (((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
        if not any(c.get("name") == ANCESTOR_CONTAINERS[ancestor] for c in pod.get("containers") or []):
            errors.append(
                f"{path}.template.spec.template.spec.containers: must contain the required container for "
                f"the ancestor: {ancestor}"
            )
    return errors


def trainjob_webhook_errors(job: dict[str, Any], runtime_shape: dict[str, set[str]] | None) -> list[str]:
    """The TrainJob validating webhook on create: the CRD's CEL rules on metadata.name, managedBy and
    numProcPerNode; torch.go Validate (no reserved PET_* env); jobset.go Validate (runtimePatches: a
    domain-prefixed manager, replicated jobs and containers that exist in the runtime, no env for `node`).
    `runtime_shape` (replicated job -> container names) is None when the referenced runtime does not exist."""
    errors = []
    name = job.get("metadata", {}).get("name", "")
    if len(name) > 63 or not DNS1035_LABEL.match(name):
        errors.append(f"metadata.name: {name!r} must match RFC 1035 DNS label format (<= 63)")
    spec = job.get("spec", {})
    if spec.get("managedBy") not in TRAINJOB_MANAGED_BY:
        errors.append("spec.managedBy: not supported")
    trainer = spec.get("trainer") or {}
    if "numProcPerNode" in trainer and not (
        isinstance(trainer["numProcPerNode"], int) and trainer["numProcPerNode"] >= 1
    ):
        errors.append("spec.trainer.numProcPerNode: must be greater than or equal to 1")
    reserved = sorted({e.get("name") for e in trainer.get("env") or []} & TORCHRUN_RESERVED_ENV)
    if reserved:
        errors.append(f"spec.trainer.env: must not have reserved envs, invalid envs configured: {reserved}")
    if runtime_shape is None:
        ref = spec.get("runtimeRef") or {}
        errors.append(
            f"spec.runtimeRef: {ref.get('kind', 'ClusterTrainingRuntime')} {ref.get('name')!r} not found: "
            "specified trainingRuntime must be created before the TrainJob is created"
        )
        return errors
    for patch in spec.get("runtimePatches") or []:
        if not DOMAIN_PREFIXED_PATH.match(patch.get("manager", "")):
            errors.append(
                f"spec.runtimePatches.manager: {patch.get('manager')!r} is not a domain-prefixed path"
            )
        for rjob in _patch_replicated_jobs(patch):
            containers = runtime_shape.get(rjob.get("name"))
            if containers is None:
                errors.append(
                    "spec.runtimePatches: must not have replicated job that doesn't exist in the runtime job template"
                )
                continue
            pod = (((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            for kind in ("initContainers", "containers"):
                for container in pod.get(kind) or []:
                    if container.get("name") not in containers:
                        errors.append(
                            f"spec.runtimePatches: must not have {kind[:-1]} that doesn't exist in the runtime job {rjob.get('name')}"
                        )
                    elif (
                        kind == "containers"
                        and container.get("env")
                        and container["name"] in ("node", "dataset-initializer", "model-initializer")
                    ):
                        errors.append(
                            "spec.runtimePatches: must not have envs for the dataset-initializer, model-initializer, node containers"
                        )
    return errors


def _runtime_shape(runtime: dict[str, Any]) -> dict[str, set[str]]:
    rjobs = ((runtime.get("spec", {}).get("template") or {}).get("spec") or {}).get("replicatedJobs") or []
    return {
        r.get("name"): {
            c.get("name")
            for c in (
                (((r.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            ).get("containers")
            or []
        }
        for r in rjobs
    }


def objects_errors(objects: list[dict[str, Any]]) -> list[str]:
    """Every object's cluster_errors, applied in order: a TrainJob is checked against the runtime it
    references, which must come earlier in the list (TrainingRuntime) or be the cluster's torch-distributed
    shaped ClusterTrainingRuntime (assumed installed)."""
    errors, runtimes = [], {}
    for obj in objects:
        kind = obj.get("kind")
        errors += [f"{kind}: {e}" for e in cluster_errors(obj)]
        if kind == "TrainingRuntime":
            runtimes[obj["metadata"]["name"]] = _runtime_shape(obj)
        if kind == "TrainJob":
            ref = obj.get("spec", {}).get("runtimeRef") or {}
            if ref.get("kind", "ClusterTrainingRuntime") == "ClusterTrainingRuntime":
                shape = TORCH_DISTRIBUTED_SHAPE
            else:
                shape = runtimes.get(ref.get("name"))
            errors += [f"TrainJob: {e}" for e in trainjob_webhook_errors(obj, shape)]
            errors += [f"TrainJob's JobSet: {e}" for e in jobset_name_errors(obj, shape)]
    return errors


def jobset_name_errors(job: dict[str, Any], runtime_shape: dict[str, set[str]] | None) -> list[str]:
    """The JobSet webhook's name rules (kubernetes-sigs/jobset pkg/webhooks/jobset_webhook.go ValidateCreate) on
    the JobSet the Trainer creates for this TrainJob: named like it, each replicated job once (replicas 1),
    the trainer's Indexed Job with numNodes completions. Job names <jobset>-<rjob>-<index> and the longest pod
    name <jobset>-<rjob>-<index>-<pod index>-<5 random> must be DNS-1035 labels."""
    name = job.get("metadata", {}).get("name", "")
    nodes = ((job.get("spec") or {}).get("trainer") or {}).get("numNodes", 1)
    errors = []
    for rjob in runtime_shape or {}:
        for generated in (f"{name}-{rjob}-0", f"{name}-{rjob}-0-{max(nodes - 1, 0)}-abcde"):
            if len(generated) > 63 or not DNS1035_LABEL.match(generated):
                errors.append(f"generated name {generated!r} is not a DNS-1035 label (<= 63 characters)")
    return errors


def cluster_errors(obj: dict[str, Any]) -> list[str]:
    """Schema errors, plus the webhook rules that look at this object alone (PyTorchJob, runtimes)."""
    errors = schema_errors(obj)
    if obj.get("kind") == "PyTorchJob":
        errors += webhook_errors(obj)
    if obj.get("kind") in RUNTIME_KINDS:
        errors += runtime_webhook_errors(obj)
    return errors
