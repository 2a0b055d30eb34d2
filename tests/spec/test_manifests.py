"""Every rendered object is one a cluster with the Kubeflow training operator v1.9 would accept.

Checked offline against the real CRD schemas (strict: unknown fields are errors), the operator's webhook rules
and kubernetes-validate's built-in schemas (see manifest_checks.py). The second half proves the checker rejects
the mistakes it is there to catch, so a green run means something.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from orchestrator.job import loading
from orchestrator.rendering import render
from tests.spec.conftest import EXAMPLES
from tests.spec.manifest_checks import REPO, cluster_errors, objects_errors


def test_every_example_renders_objects_the_cluster_accepts(example):
    objects = render.render(loading.load_job(example))
    assert [o["kind"] for o in objects if o["kind"] == "PyTorchJob"] == ["PyTorchJob"]
    for obj in objects:
        assert cluster_errors(obj) == [], f"{example.name}: {obj['kind']}"


def test_every_example_renders_a_trainjob_the_cluster_accepts(example):
    """--api trainjob: TrainingRuntime (as itself, its template as a JobSet, its Jobs as batch Jobs) and
    TrainJob against the real CRDs and the Trainer v2 webhook rules, in apply order."""
    objects = render.render(loading.load_job(example), api="trainjob")
    kinds = [o["kind"] for o in objects]
    assert kinds.index("TrainingRuntime") < kinds.index("TrainJob")
    assert objects_errors(objects) == []
    # The ClusterTrainingRuntime CRD (cluster-scoped, no namespace) accepts the same spec: the two kinds share
    # it, so the checks hold for either.
    runtime = copy.deepcopy(next(o for o in objects if o["kind"] == "TrainingRuntime"))
    runtime["kind"] = "ClusterTrainingRuntime"
    runtime["metadata"].pop("namespace", None)
    assert cluster_errors(runtime) == []


def test_examples_cover_the_renderer():
    """The examples exercise both topologies, both job kinds and metrics on and off. (No example is elastic:
    every example must also render as a TrainJob, which has no elastic training; test_render covers it.)"""
    specs = [loading.load_job(path) for path in EXAMPLES]
    assert any(s.restart.policy == "job" and s.nodes > 1 for s in specs)
    assert any(s.restart.policy != "job" and s.nodes > 1 for s in specs)
    assert any(s.command for s in specs) and any(s.train for s in specs)
    assert any(s.metrics.enabled for s in specs) and any(not s.metrics.enabled for s in specs)
    assert any(s.gpus_per_node for s in specs) and any(not s.gpus_per_node for s in specs)


@pytest.fixture(scope="module")
def rendered():
    """gpt-multinode with Master + Workers (restart.policy on-failure), every kind it renders."""
    spec = loading.load_job(EXAMPLES[0].parent / "gpt-multinode.yaml", ["restart.policy=on-failure"])
    return {o["kind"]: o for o in render.render(spec)}


@pytest.fixture(scope="module")
def trainjob_objects():
    return render.render(loading.load_job(EXAMPLES[0].parent / "gpt-multinode.yaml"), api="trainjob")


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
        lambda j: (
            j.update(spec={**j["spec"], "elasticPolicy": {"minReplicas": 1}})
            or j["spec"]["pytorchReplicaSpecs"].pop("Worker")
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
        lambda j: j["spec"].update(elasticPolicy={"nProcPerNode": 8}),
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


def _by_kind(objects, kind):
    return next(o for o in objects if o["kind"] == kind)


def _runtime_pod(objects):
    runtime = _by_kind(objects, "TrainingRuntime")
    return runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


TRAINJOB_MUTATIONS = {
    "typo in the TrainJob trainer": (
        lambda o: _by_kind(o, "TrainJob")["spec"]["trainer"].update(numNode=4),
        "numNode",
    ),
    "numProcPerNode as a string": (
        lambda o: _by_kind(o, "TrainJob")["spec"]["trainer"].update(numProcPerNode="8"),
        "'8' is not of type",
    ),
    "reserved PET env in the TrainJob": (
        lambda o: _by_kind(o, "TrainJob")["spec"]["trainer"]["env"].append(
            {"name": "PET_NNODES", "value": "2"}
        ),
        "reserved envs",
    ),
    "TrainJob name not DNS-1035": (
        lambda o: _by_kind(o, "TrainJob")["metadata"].update(name="9lives"),
        "RFC 1035",
    ),
    "TrainJob name too long for its JobSet's pod names": (
        lambda o: _by_kind(o, "TrainJob")["metadata"].update(name="x" * 50),
        "is not a DNS-1035 label (<= 63",
    ),
    "runtime applied after the TrainJob": (lambda o: o.reverse(), "must be created before the TrainJob"),
    "runtimeRef to a runtime that is not rendered": (
        lambda o: _by_kind(o, "TrainJob")["spec"]["runtimeRef"].update(name="other"),
        "must be created before the TrainJob",
    ),
    "unknown field in the JobSet template": (
        lambda o: _by_kind(o, "TrainingRuntime")["spec"]["template"]["spec"].update(failurePolcy={}),
        "failurePolcy",
    ),
    "unknown pod field in the runtime": (lambda o: _runtime_pod(o).update(hostNetwrok=True), "hostNetwrok"),
    "Job restartPolicy Always": (
        lambda o: _runtime_pod(o).update(restartPolicy="Always"),
        "Unsupported value",
    ),
    "trainer replicated job with 2 replicas": (
        lambda o: _by_kind(o, "TrainingRuntime")["spec"]["template"]["spec"]["replicatedJobs"][0].update(
            replicas=2
        ),
        "always must be 1",
    ),
    "no node container in the runtime": (
        lambda o: _runtime_pod(o)["containers"][0].update(name="trainer"),
        "required container for the ancestor: trainer",
    ),
    "two ML policies": (
        lambda o: _by_kind(o, "TrainingRuntime")["spec"]["mlPolicy"].update(mpi={}),
        "Only one of the policy",
    ),
    "failurePolicy maxRestarts as a string": (
        lambda o: _by_kind(o, "TrainingRuntime")["spec"]["template"]["spec"]["failurePolicy"].update(
            maxRestarts="3"
        ),
        "'3' is not of type",
    ),
}


@pytest.mark.parametrize("mutation", TRAINJOB_MUTATIONS, ids=list(TRAINJOB_MUTATIONS))
def test_checker_rejects_broken_trainjob_objects(trainjob_objects, mutation):
    mutate, expected = TRAINJOB_MUTATIONS[mutation]
    objects = copy.deepcopy(trainjob_objects)
    mutate(objects)
    errors = objects_errors(objects)
    assert any(expected in error for error in errors), errors


RUNTIME_PATCH_MUTATIONS = {
    "patch of a replicated job the runtime lacks": (
        lambda p: p["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0].update(name="launcher"),
        "replicated job that doesn't exist",
    ),
    "patch of a container the runtime lacks": (
        lambda p: _patch_pod(p)["containers"][0].update(name="pytorch"),
        "container that doesn't exist",
    ),
    "env in the node container patch": (
        lambda p: _patch_pod(p)["containers"][0].update(env=[{"name": "A", "value": "1"}]),
        "must not have envs",
    ),
    "manager without a domain": (lambda p: p.update(manager="orch"), "domain-prefixed"),
    "resources in a container patch": (
        lambda p: _patch_pod(p)["containers"][0].update(resources={}),
        "resources",
    ),
    "priorityClassName in a pod patch": (
        lambda p: _patch_pod(p).update(priorityClassName="x"),
        "priorityClassName",
    ),
}


def _patch_pod(patch):
    rjob = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    return rjob["template"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("mutation", RUNTIME_PATCH_MUTATIONS, ids=list(RUNTIME_PATCH_MUTATIONS))
def test_checker_rejects_broken_runtime_patches(mutation):
    spec = loading.load_job(
        EXAMPLES[0].parent / "digits.yaml", ["runtime=torch-distributed", "metrics.enabled=false"]
    )
    objects = render.render(spec, api="trainjob")
    assert objects_errors(objects) == []
    mutate, expected = RUNTIME_PATCH_MUTATIONS[mutation]
    mutate(_by_kind(objects, "TrainJob")["spec"]["runtimePatches"][0])
    errors = objects_errors(objects)
    assert any(expected in error for error in errors), errors
