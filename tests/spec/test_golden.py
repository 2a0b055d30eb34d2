"""Whole rendered objects, compared with golden files, on both APIs:
- every file in examples/ as tests/spec/golden/<example>.yaml (PyTorchJob) and <example>.trainjob.yaml;
- each queue/gang/recovery combination (COMBINATIONS) as tests/spec/golden/combinations/<name>.<api>.yaml.

After an intended change to rendering (or a new example), regenerate and review the diff:
    ORCH_UPDATE_GOLDENS=1 .venv/bin/pytest tests/spec/test_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from orchestrator.job import loading
from orchestrator.rendering import render
from tests.spec.conftest import EXAMPLES, load
from tests.spec.manifest_checks import objects_errors

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("ORCH_UPDATE_GOLDENS") == "1"
APIS = ("pytorchjob", "trainjob")
SUFFIX = {"pytorchjob": "", "trainjob": ".trainjob"}

# One 4-node GPU job; each combination adds the settings it is about (docs/cluster.md, "Queues, gangs and
# recovery", describes what each renders).
COMBINATION_BASE = """\
name: combo
image: example.com/trainer:1
nodes: 4
gpus_per_node: 8
train: {task: gpt, batch_size: 64}
"""
COMBINATIONS = {
    "kueue-queue": "scheduling: {queue: team-a, priority: research, priority_class: high}\n",
    "volcano-gang": "scheduling: {scheduler: volcano, queue: research, priority_class: high}\n",
    "coscheduler": "scheduling: {scheduler: scheduler-plugins-scheduler}\n",
    "topology": "scheduling: {queue: team-a, topology: {required: cloud.provider.com/topology-block}}\n"
    "restart: {policy: on-failure}\n",
    "restart-job": "restart: {policy: job, max_restarts: 5}\noutput: {pvc: checkpoints}\n",
    "no-gang": "scheduling: {gang: false}\nrestart: {policy: exit-code, backoff_limit: 2}\n",
    # the nodes a replaced job suspected, merged into the job's own required node affinity (each term)
    "exclude-nodes": "scheduling: {exclude_nodes: [gpu-node-7, gpu-node-9]}\naffinity:\n"
    "  nodeAffinity:\n    requiredDuringSchedulingIgnoredDuringExecution:\n      nodeSelectorTerms:\n"
    "        - matchExpressions: [{key: nvidia.com/gpu.product, operator: In, values: [NVIDIA-H100-80GB-HBM3]}]\n"
    "        - matchExpressions: [{key: nvidia.com/gpu.product, operator: In, values: [NVIDIA-H200]}]\n",
}


def check_golden(objects: list[dict], golden: Path) -> None:
    if UPDATE:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(render.to_yaml(objects), encoding="utf-8")
    assert golden.exists(), f"no golden {golden.name}: run with ORCH_UPDATE_GOLDENS=1 and review it"
    assert list(yaml.safe_load_all(golden.read_text(encoding="utf-8"))) == objects


@pytest.mark.parametrize("api", APIS)
def test_rendered_objects_match_golden(example, api):
    objects = render.render(loading.load_job(example), api=api)
    check_golden(objects, GOLDEN / f"{example.stem}{SUFFIX[api]}.yaml")


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("combination", COMBINATIONS)
def test_combination_matches_golden_and_validates(tmp_path, combination, api):
    objects = render.render(load(COMBINATION_BASE + COMBINATIONS[combination], tmp_path), api=api)
    assert objects_errors(objects) == []
    check_golden(objects, GOLDEN / "combinations" / f"{combination}.{api}.yaml")


def test_no_golden_without_an_example():
    expected = {f"{p.stem}{suffix}" for p in EXAMPLES for suffix in SUFFIX.values()}
    stale = {p.stem for p in GOLDEN.glob("*.yaml")} - expected
    stale |= {p.stem for p in (GOLDEN / "combinations").glob("*.yaml")} - {
        f"{c}.{api}" for c in COMBINATIONS for api in APIS
    }
    assert not stale, f"golden files without an example or combination (delete them): {sorted(stale)}"
