"""pod_overrides are checked against the shape of the Kubernetes pod spec (issue #25, class 1).

The shape file is generated here from the official `kubernetes` client's models; with ORCH_UPDATE_GOLDENS=1
it is rewritten, otherwise a client whose models differ fails the test (regenerate and review the diff).
"""

from __future__ import annotations

import datetime
import json
import os
import typing

import pytest

from orchestrator.rendering import pod_shape

# The client's models type Kubernetes' Quantity (int-or-string in the OpenAPI schema, so `nvidia.com/gpu: 1`
# is valid) as a plain string; these are the Quantity fields under a pod spec.
QUANTITIES = {
    ("V1ResourceRequirements", "limits"),
    ("V1ResourceRequirements", "requests"),
    ("V1VolumeResourceRequirements", "limits"),
    ("V1VolumeResourceRequirements", "requests"),
    ("V1PodSpec", "overhead"),
    ("V1EmptyDirVolumeSource", "sizeLimit"),
    ("V1ResourceFieldSelector", "divisor"),
}


def generate() -> dict[str, typing.Any]:
    from kubernetes import client
    from pydantic import BaseModel

    models: dict[str, typing.Any] = {}

    def shape(annotation: typing.Any) -> typing.Any:
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin is typing.Annotated:
            return shape(args[0])
        if origin is typing.Union:
            members = [a for a in args if a is not type(None)]
            return shape(members[0]) if len(members) == 1 else "|".join(sorted(shape(m) for m in members))
        if origin is list:
            return ["list", shape(args[0])]
        if origin is dict:
            assert shape(args[0]) == "str", annotation
            return ["map", shape(args[1])]
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            walk(annotation)
            return annotation.__name__
        scalars = {str: "str", int: "int", bool: "bool", float: "float", datetime.datetime: "str"}
        return scalars.get(annotation, "any")

    def walk(model: type[BaseModel]) -> None:
        if model.__name__ in models:
            return
        models[model.__name__] = {}
        fields, required = {}, []
        for attribute, field in model.model_fields.items():
            name = field.serialization_alias or field.alias or attribute
            kind = shape(field.annotation)
            if (model.__name__, name) in QUANTITIES:
                kind = ["map", "quantity"] if isinstance(kind, list) else "quantity"
            fields[name] = kind
            if field.is_required():
                required.append(name)
        models[model.__name__] = {"fields": fields, "required": required}

    walk(client.V1PodSpec)
    return dict(sorted(models.items()))


def test_the_shape_file_is_the_kubernetes_clients_models():
    pytest.importorskip("kubernetes.client")
    text = json.dumps(generate(), indent=None, separators=(",", ":"), sort_keys=False) + "\n"
    if os.environ.get("ORCH_UPDATE_GOLDENS"):
        pod_shape.SHAPE_FILE.write_text(text)
    assert pod_shape.SHAPE_FILE.read_text() == text, "regenerate: ORCH_UPDATE_GOLDENS=1 pytest " + __file__


@pytest.mark.parametrize(
    ("overrides", "path", "words"),
    [
        ({"containers": [5]}, ("containers", 0), "must be an object (V1Container)"),
        ({"containers": [None]}, ("containers", 0), "cannot be null"),
        ({"containers": [[{}]]}, ("containers", 0), "must be an object"),
        ({"containers": [{"name": ["a"]}]}, ("containers", 0, "name"), "must be a string"),
        ({"containers": [{"name": {"a": 1}}]}, ("containers", 0, "name"), "must be a string"),
        ({"containers": {"name": "x"}}, ("containers",), "must be a list of V1Containers"),
        ({"volumes": "data"}, ("volumes",), "must be a list"),
        ({"containers": [{"image": "x"}]}, ("containers", 0), "needs a name"),
        ({"containers": [{"name": "pytorch", "env": [{"value": "1"}]}]}, ("containers", 0, "env", 0), "name"),
        ({"tolerations": [{"tolerationSeconds": "5"}]}, ("tolerations", 0, "tolerationSeconds"), "integer"),
        ({"hostNetwork": "yes"}, ("hostNetwork",), "true or false"),
        ({"hostNetwork": 1}, ("hostNetwork",), "true or false"),
        ({"nodeSelector": {"a": 1}}, ("nodeSelector", "a"), "must be a string"),
        ({"terminationGracePeriodSeconds": True}, ("terminationGracePeriodSeconds",), "integer"),
        ({"containres": []}, ("containres",), "did you mean 'containers'"),
        (
            {"containers": [{"name": "x", "resources": {"limit": {}}}]},
            ("containers", 0, "resources", "limit"),
            "limits",
        ),
        (
            {"containers": [{"name": "x", "resources": {"limits": {"cpu": True}}}]},
            ("containers", 0, "resources", "limits", "cpu"),
            "quantity",
        ),
        ({"affinity": {"nodeAffinity": []}}, ("affinity", "nodeAffinity"), "V1NodeAffinity"),
    ],
)
def test_overrides_of_the_wrong_shape_name_the_field(overrides, path, words):
    found, message = pod_shape.problem(overrides)
    assert found == path and words in message, (found, message)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "containers": [
                {"name": "pytorch", "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "8Gi"}}}
            ]
        },
        {"containers": [{"name": "sidecar", "image": "busybox", "ports": [{"containerPort": 80}]}]},
        {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet", "priorityClassName": None},
        {"volumes": [{"name": "x", "emptyDir": {"sizeLimit": 10}}]},
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["b"]}]}
                        ]
                    }
                }
            }
        },
        {"containers": [{"name": "pytorch", "livenessProbe": {"httpGet": {"port": "metrics"}}}]},
        {"securityContext": {"sysctls": [{"name": "net.core.somaxconn", "value": "1024"}]}},
    ],
)
def test_overrides_of_the_pod_spec_shape_pass(overrides):
    assert pod_shape.problem(overrides) is None
