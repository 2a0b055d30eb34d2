"""Checks a Kubernetes control plane would make on orch's objects, offline.

- CRD schemas: the real CRDs, found through tests/schemas.py (`ORCH_CRD_SCHEMAS`, never copied into the
  repo), turned into strict JSON Schema: where the CRD lists `properties`, any other key is an error, as with
  `kubectl apply --validate=strict` (the apiserver would silently prune it instead).
- The Kubeflow training operator v1.9 validating webhook (pkg/webhooks/pytorch/pytorchjob_webhook.go), hand-ported.
- Built-in kinds (ConfigMap, and each pod template as a Pod) against kubernetes-validate's strict schemas.
What stays unchecked: list-map key uniqueness, CEL rules (update-only here), defaulting.
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
}
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


def cluster_errors(obj: dict[str, Any]) -> list[str]:
    """Schema errors, plus the operator's webhook rules for a PyTorchJob."""
    errors = schema_errors(obj)
    if obj.get("kind") == "PyTorchJob":
        errors += webhook_errors(obj)
    return errors
