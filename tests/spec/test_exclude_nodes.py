"""`scheduling.exclude_nodes`: a required node affinity (kubernetes.io/hostname NotIn) merged with the job's own,
on both APIs, checked against the real CRDs (manifest_checks.objects_errors); the golden combination
`exclude-nodes` (test_golden.py) pins the whole objects. Node selector terms are ORed and the expressions of a
term ANDed (k8s.io/api core/v1 types.go, NodeSelector / NodeSelectorTerm), which is what the merge keeps."""

from __future__ import annotations

import pytest

from orchestrator import naming
from orchestrator.rendering import render
from orchestrator.rendering.scheduling import excluding_nodes
from tests.spec.conftest import load
from tests.spec.manifest_checks import objects_errors
from tests.spec.test_spec_cmds import orch

BASE = "name: demo\nimage: example.com/trainer:1\nnodes: 2\ngpus_per_node: 8\ntrain: {task: gpt, batch_size: 64}\n"
NOT_IN = {"key": naming.LABEL_HOSTNAME, "operator": "NotIn", "values": ["gpu-node-7", "gpu-node-9"]}
GPU_IN = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H200"]}


def pod_specs(objects: list[dict]) -> list[dict]:
    """Every pod spec the objects carry: the PyTorchJob's replicas, the TrainingRuntime's JobSet template, or
    a TrainJob's runtime patch (`runtime: NAME`)."""
    specs = []
    for obj in objects:
        spec = obj.get("spec", {})
        for replica in spec.get("pytorchReplicaSpecs", {}).values():
            specs.append(replica["template"]["spec"])
        for rjob in spec.get("template", {}).get("spec", {}).get("replicatedJobs", []):
            specs.append(rjob["template"]["spec"]["template"]["spec"])
        for patch in spec.get("runtimePatches", []):
            for rjob in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
                specs.append(rjob["template"]["spec"]["template"]["spec"])
    return specs


def required_terms(pod_spec: dict) -> list[dict]:
    return pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]


@pytest.mark.parametrize(
    ("extra", "api"),
    [
        ("", "pytorchjob"),
        ("", "trainjob"),
        ("runtime: torch-distributed\n", "trainjob"),  # the pod travels in runtimePatches (affinity allowed)
    ],
)
def test_excluded_nodes_render_a_required_node_affinity_on_both_apis(tmp_path, extra, api):
    text = BASE + extra + "scheduling: {exclude_nodes: [gpu-node-7, gpu-node-9, gpu-node-7]}\n"
    objects = render.render(load(text, tmp_path), api=api)
    assert objects_errors(objects) == []
    specs = pod_specs(objects)
    assert specs
    for pod_spec in specs:
        assert required_terms(pod_spec) == [{"matchExpressions": [NOT_IN]}]  # a name given twice is one


def test_the_exclusion_joins_every_required_term_and_keeps_the_rest(tmp_path):
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [GPU_IN]}, {"matchFields": [{"key": "metadata.name",
                    "operator": "In", "values": ["big-1"]}]}, {}],
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [GPU_IN]}}
            ],
        },
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
    }  # fmt: skip
    merged = excluding_nodes(affinity, ["gpu-node-7", "gpu-node-9"])
    terms = merged["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0] == {"matchExpressions": [GPU_IN, NOT_IN]}
    assert terms[1]["matchExpressions"] == [NOT_IN] and terms[1]["matchFields"][0]["values"] == ["big-1"]
    assert terms[2] == {}  # an empty term matches no node: it must not start matching every other one
    assert (
        merged["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        == (affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"])
    )
    assert merged["podAntiAffinity"] == affinity["podAntiAffinity"]
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][
        0
    ] == ({"matchExpressions": [GPU_IN]})  # the caller's dict is not changed
    assert excluding_nodes(merged, ["gpu-node-7", "gpu-node-9"]) == merged  # idempotent
    assert excluding_nodes(affinity, []) is affinity


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_an_affinity_from_pod_overrides_is_kept_off_the_nodes_too(tmp_path, api):
    """pod_overrides replace a list they name (nodeSelectorTerms): the exclusion is merged after them."""
    text = BASE + (
        "scheduling: {exclude_nodes: [gpu-node-7, gpu-node-9]}\n"
        "affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: "
        "[{matchExpressions: [{key: zone, operator: In, values: [a]}]}]}}}\n"
        "pod_overrides: {affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: "
        "{nodeSelectorTerms: [{matchExpressions: [{key: nvidia.com/gpu.product, operator: In, "
        "values: [NVIDIA-H200]}]}]}}}}\n"
    )
    objects = render.render(load(text, tmp_path), api=api)
    assert objects_errors(objects) == []
    for pod_spec in pod_specs(objects):
        assert required_terms(pod_spec) == [{"matchExpressions": [GPU_IN, NOT_IN]}]


def test_no_exclusion_renders_the_affinity_as_written(tmp_path):
    text = BASE + "affinity: {nodeAffinity: {preferredDuringSchedulingIgnoredDuringExecution: []}}\n"
    for pod_spec in pod_specs(render.render(load(text, tmp_path), api="pytorchjob")):
        assert pod_spec["affinity"] == {
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}
        }


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ('["Bad Node"]', "is not a valid label value"),
        ('[""]', "at least 1 character"),
        ('["' + "n" * 64 + '"]', "is not a valid label value"),
        ("gpu-node-7", "valid list"),
    ],
)
def test_a_node_that_no_hostname_label_can_hold_is_refused_at_its_line(tmp_path, value, said):
    job = tmp_path / "job.yaml"
    job.write_text(BASE + f"scheduling:\n  exclude_nodes: {value}\n")
    result = orch("validate", str(job))
    assert result.returncode == 2
    assert "job.yaml:7:" in result.stderr and "scheduling.exclude_nodes" in result.stderr
    assert said in result.stderr
