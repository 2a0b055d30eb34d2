"""Every rendered object is one a cluster with the Kubeflow training operator v1.9 would accept.

Checked offline against the real CRD schemas (strict: unknown fields are errors), the operator's webhook rules
and kubernetes-validate's built-in schemas (see manifest_checks.py). The second half proves the checker rejects
the mistakes it is there to catch, so a green run means something.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from orchestrator import loading, render
from tests.spec.conftest import EXAMPLES
from tests.spec.manifest_checks import REPO, cluster_errors


def test_every_example_renders_objects_the_cluster_accepts(example):
    objects = render.render(loading.load_job(example))
    assert [o["kind"] for o in objects if o["kind"] == "PyTorchJob"] == ["PyTorchJob"]
    for obj in objects:
        assert cluster_errors(obj) == [], f"{example.name}: {obj['kind']}"


def test_examples_cover_the_renderer():
    """The examples exercise both topologies, both job kinds and metrics on and off."""
    specs = [loading.load_job(path) for path in EXAMPLES]
    assert any(s.elastic for s in specs) and any(not s.elastic and s.nodes > 1 for s in specs)
    assert any(s.command for s in specs) and any(s.train for s in specs)
    assert any(s.metrics.enabled for s in specs) and any(not s.metrics.enabled for s in specs)
    assert any(s.gpus_per_node for s in specs) and any(not s.gpus_per_node for s in specs)


@pytest.fixture(scope="module")
def rendered():
    spec = loading.load_job(EXAMPLES[0].parent / "gpt-multinode.yaml")
    return {o["kind"]: o for o in render.render(spec)}


def _pod(job, rtype="Worker"):
    return job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]


def _container(job, rtype="Worker"):
    return _pod(job, rtype)["containers"][0]


MUTATIONS = {
    "typo in a replica field": (
        lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"].update(replcas=2),
        "replcas",
    ),
    "replicas as a string": (
        lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas="2"),
        "'2'",
    ),
    "cpu as a float": (lambda j: _container(j)["resources"]["requests"].update(cpu=2.5), "2.5"),
    "memory not a quantity": (lambda j: _container(j)["resources"]["limits"].update(memory="4 GB"), "4 GB"),
    "env value not a string": (lambda j: _container(j)["env"][0].update(value=1), "1 is not of type"),
    "unknown pod field": (lambda j: _pod(j).update(hostNetwrok=True), "hostNetwrok"),
    "nprocPerNode as an integer": (lambda j: j["spec"].update(nprocPerNode=8), "8 is not of type"),
    "replica type typo": (
        lambda j: j["spec"]["pytorchReplicaSpecs"].update(
            Wroker=j["spec"]["pytorchReplicaSpecs"].pop("Worker")
        ),
        "Wroker",
    ),
    "no pytorch container": (lambda j: _container(j).update(name="trainer"), "name pytorch"),
    "container without image": (lambda j: _container(j).update(image=""), "image: must be required"),
    "invalid job name": (lambda j: j["metadata"].update(name="GPT_job"), "DNS-1035"),
    "elastic without Worker": (
        lambda j: j["spec"]["pytorchReplicaSpecs"].update(
            Master=j["spec"]["pytorchReplicaSpecs"].pop("Worker")
        ),
        "must be configured if elastic",
    ),
    "Master with 2 replicas": (
        lambda j: j["spec"]["pytorchReplicaSpecs"].update(
            Master={**j["spec"]["pytorchReplicaSpecs"]["Worker"], "replicas": 2}
        ),
        "Master].replicas: must be 1",
    ),
    "Master replicas left to defaulting": (
        lambda j: j["spec"]["pytorchReplicaSpecs"].update(
            Master={k: v for k, v in j["spec"]["pytorchReplicaSpecs"]["Worker"].items() if k != "replicas"}
        ),
        "Master].replicas: must be 1",
    ),
    "deprecated nProcPerNode with nprocPerNode": (
        lambda j: j["spec"]["elasticPolicy"].update(nProcPerNode=8),
        "must not be used with",
    ),
}


@pytest.mark.parametrize("mutation", MUTATIONS, ids=list(MUTATIONS))
def test_checker_rejects_a_broken_pytorchjob(rendered, mutation):
    mutate, expected = MUTATIONS[mutation]
    job = copy.deepcopy(rendered["PyTorchJob"])
    mutate(job)
    errors = cluster_errors(job)
    assert any(expected in error for error in errors), errors


def test_checker_rejects_a_broken_podmonitor(rendered):
    monitor = copy.deepcopy(rendered["PodMonitor"])
    monitor["spec"]["podMetricsEndpoints"][0]["prot"] = "metrics"
    assert any("prot" in e for e in cluster_errors(monitor))
    del monitor["spec"]["selector"]
    assert any("'selector' is a required property" in e for e in cluster_errors(monitor))


def test_checker_rejects_a_broken_configmap(rendered):
    config_map = copy.deepcopy(rendered["ConfigMap"])
    config_map["data"]["train.json"] = {"task": "gpt"}
    assert cluster_errors(config_map)


PLAIN_MANIFESTS = sorted((REPO / "manifests").rglob("*.yaml"))


@pytest.mark.parametrize("path", PLAIN_MANIFESTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_plain_manifest_validates(path):
    """The files users `kubectl apply` as they are (RBAC, dashboard ConfigMap, alert rules): CRD kinds
    against the real CRDs, built-in kinds against Kubernetes' own schemas, strictly."""
    documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    assert documents
    for document in documents:
        assert cluster_errors(document) == [], f"{path.name}: {document.get('kind')}"
