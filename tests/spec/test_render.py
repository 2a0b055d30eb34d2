"""What render() decides, one behaviour per test (the goldens pin whole objects; these say why)."""

from __future__ import annotations

import json

import pytest
import yaml

from orchestrator import naming
from orchestrator.errors import SpecError
from orchestrator.rendering import render
from orchestrator.rendering.pod import LAUNCHER, merge_overrides
from orchestrator.trainer.config import TrainSpec
from tests.spec.conftest import load

BASE = "name: demo\nimage: example.com/trainer:1\ntrain: {task: digits, batch_size: 240}\n"


def objects(tmp_path, text=BASE, *overrides):
    return {o["kind"]: o for o in render.render(load(text, tmp_path, *overrides))}


def replicas(job):
    return {rtype: r["replicas"] for rtype, r in job["spec"]["pytorchReplicaSpecs"].items()}


def pod(job, rtype="Master"):
    return job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]


def container(job, rtype="Master"):
    (main,) = pod(job, rtype)["containers"]
    return main


def env(job):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(job)["env"]}


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [(1, {"Master": 1}), (2, {"Master": 1, "Worker": 1}), (5, {"Master": 1, "Worker": 4})],
)
def test_master_is_one_explicit_replica_and_workers_the_rest(tmp_path, nodes, expected):
    job = objects(tmp_path, BASE, f"nodes={nodes}", "restart.policy=on-failure")["PyTorchJob"]
    assert replicas(job) == expected
    assert "elasticPolicy" not in job["spec"]


@pytest.mark.parametrize("nodes", [1, 3])
def test_restart_policy_job_is_an_elastic_agent_with_a_fixed_size(tmp_path, nodes):
    """restart.policy job on a PyTorchJob: torchrun's elastic agent with min = max = nodes, so a failed
    process makes every agent restart its workers and the whole group re-forms (never a partial group)."""
    job = objects(tmp_path, BASE, f"nodes={nodes}", "restart.policy=job", "restart.max_restarts=5")[
        "PyTorchJob"
    ]
    assert replicas(job) == {"Worker": nodes}
    assert job["spec"]["elasticPolicy"] == {
        "rdzvBackend": "c10d",
        "minReplicas": nodes,
        "maxReplicas": nodes,
        "maxRestarts": 5,
    }
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] == "OnFailure"
    assert job["spec"]["runPolicy"]["backoffLimit"] == 5 * nodes


@pytest.mark.parametrize(
    ("extra", "policy"),
    [
        ("nodes: 1\n", "on-failure"),
        ("nodes: 2\n", "job"),
        ("nodes: 2\nelastic: {min_nodes: 1, max_nodes: 2}\n", "on-failure"),
    ],
)
def test_restart_policy_defaults_to_job_for_multi_node_jobs(tmp_path, extra, policy):
    assert load(BASE + extra, tmp_path).restart.policy == policy


def test_elastic_jobs_are_workers_only_with_a_c10d_policy(tmp_path):
    job = objects(tmp_path, BASE + "nodes: 3\nelastic: {min_nodes: 2, max_nodes: 6, max_restarts: 4}\n")[
        "PyTorchJob"
    ]
    assert replicas(job) == {"Worker": 3}
    assert job["spec"]["elasticPolicy"] == {
        "rdzvBackend": "c10d",
        "minReplicas": 2,
        "maxReplicas": 6,
        "maxRestarts": 4,
    }


def test_single_node_elastic_job_is_one_worker_the_operator_accepts(tmp_path):
    """Elastic on one node is how users get torchrun's restarts (max_restarts) without a second pod."""
    from tests.spec.manifest_checks import cluster_errors

    job = objects(tmp_path, BASE + "elastic: {min_nodes: 1, max_nodes: 1, max_restarts: 2}\n")["PyTorchJob"]
    assert replicas(job) == {"Worker": 1}
    assert cluster_errors(job) == []


def simulated_operator_env(job):
    """What the v1.9 operator's setPodEnv gives torchrun (pytorchjob.md section 2), per pod."""
    spec = job["spec"]
    total = sum(r["replicas"] for r in spec["pytorchReplicaSpecs"].values())
    env = {"PET_NPROC_PER_NODE": spec["nprocPerNode"]}
    if (elastic := spec.get("elasticPolicy")) is not None:
        env["PET_NNODES"] = f"{elastic['minReplicas']}:{elastic['maxReplicas']}"
        env["PET_RDZV_BACKEND"] = elastic["rdzvBackend"]
    else:
        env["PET_NNODES"] = str(total)
    return env


@pytest.mark.parametrize("extra", ["nodes: 4\n", "nodes: 2\nelastic: {min_nodes: 1, max_nodes: 2}\n"])
def test_torchrun_and_operator_env_agree_on_the_world_size(tmp_path, extra):
    text = BASE.replace("batch_size: 240", "batch_size: 64") + "gpus_per_node: 8\n" + extra
    spec = load(text, tmp_path)
    job = objects(tmp_path, text)["PyTorchJob"]
    operator_env = simulated_operator_env(job)
    command = container(job, next(iter(job["spec"]["pytorchReplicaSpecs"])))["command"]
    assert command[:4] == [*LAUNCHER, f"--nproc-per-node={operator_env['PET_NPROC_PER_NODE']}"]
    # No flag on the command line overrides the operator's topology (torchrun reads PET_<FLAG> otherwise).
    assert not any(a.startswith(("--nnodes", "--node-rank", "--master", "--rdzv")) for a in command)
    max_nodes = int(operator_env["PET_NNODES"].split(":")[-1])
    assert spec.nodes <= max_nodes and int(operator_env["PET_NPROC_PER_NODE"]) * spec.nodes == spec.world_size


def test_train_jobs_run_the_trainer_on_the_mounted_config(tmp_path):
    found = objects(tmp_path)
    job, config_map = found["PyTorchJob"], found["ConfigMap"]
    assert container(job)["command"] == [
        "python",
        "-m",
        "orchestrator.launch",  # torchrun, with an exit code that keeps the failure's class
        "--nproc-per-node=1",
        "-m",
        "orchestrator.trainer",
        "--config",
        "/etc/orch/train.json",
    ]
    mounts = {m["mountPath"]: m for m in container(job)["volumeMounts"]}
    assert mounts["/etc/orch"]["readOnly"] is True
    volume = next(v for v in pod(job)["volumes"] if v["name"] == mounts["/etc/orch"]["name"])
    assert volume["configMap"]["name"] == config_map["metadata"]["name"] == "demo-config"
    train = TrainSpec.model_validate(json.loads(config_map["data"]["train.json"]))
    assert train == load(BASE, tmp_path).train


def test_command_jobs_exec_the_command_and_get_no_configmap(tmp_path):
    found = objects(tmp_path, "name: demo\nimage: i:1\ncommand: [python, train.py, --lr, '0.1']\n")
    assert set(found) == {"PyTorchJob", "PodMonitor"}
    job = found["PyTorchJob"]
    assert container(job)["command"] == [
        "torchrun",
        "--nproc-per-node=1",
        "--no-python",
        "python",
        "train.py",
        "--lr",
        "0.1",
    ]
    assert "/etc/orch" not in {m["mountPath"] for m in container(job)["volumeMounts"]}
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env(job)


@pytest.mark.parametrize(
    ("resources", "gpus", "shm"), [("", 0, "1Gi"), ("", 4, "8Gi"), ("resources: {shm: 12Gi}\n", 4, "12Gi")]
)
def test_dev_shm_is_a_sized_memory_emptydir(tmp_path, resources, gpus, shm):
    text = BASE.replace("240", "64") + resources + f"gpus_per_node: {gpus}\n"
    job = objects(tmp_path, text)["PyTorchJob"]
    mount = next(m for m in container(job)["volumeMounts"] if m["mountPath"] == "/dev/shm")
    volume = next(v for v in pod(job)["volumes"] if v["name"] == mount["name"])
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": shm}


def test_gpus_are_limited_cpu_only_requested(tmp_path):
    text = BASE.replace("240", "64") + "gpus_per_node: 2\nresources: {cpu: 500m, memory: 8Gi}\n"
    job = objects(tmp_path, text)["PyTorchJob"]
    assert container(job)["resources"] == {
        "requests": {"cpu": "500m", "memory": "8Gi", "nvidia.com/gpu": "2"},
        "limits": {"memory": "8Gi", "nvidia.com/gpu": "2"},
    }
    assert job["spec"]["nprocPerNode"] == "2"


def test_env_runtime_facts_user_env_wins_and_secrets_are_references(tmp_path):
    text = BASE + (
        "env: {PYTORCH_CUDA_ALLOC_CONF: 'max_split_size_mb:128', NCCL_DEBUG: INFO}\n"
        "secret_env: {HF_TOKEN: {secret: hf, key: token}}\n"
        "metrics: {port: 9100, gpu_sample_seconds: 2.5, peak_tflops: 312}\n"
    )
    job = objects(tmp_path, text)["PyTorchJob"]
    assert env(job) == {
        "ORCH_JOB_NAME": "demo",
        "ORCH_OUTPUT_DIR": "/orch/output",
        "ORCH_METRICS_PORT": "9100",
        "ORCH_GPU_SAMPLE_SECONDS": "2.5",
        "ORCH_PEAK_TFLOPS": "312.0",
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "120",  # train.checkpoint.on_stop (test_stop_grace.py)
        "NCCL_DEBUG": "INFO",
        "HF_TOKEN": {"secretKeyRef": {"name": "hf", "key": "token"}},
    }
    assert [e["name"] for e in container(job)["env"]].count("PYTORCH_CUDA_ALLOC_CONF") == 1
    assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in container(job)["ports"]
    mounts = {m["mountPath"] for m in container(job)["volumeMounts"]}
    assert "/orch/output" in mounts


def test_metrics_off_means_no_podmonitor_no_port_and_exporter_off(tmp_path):
    found = objects(tmp_path, BASE + "metrics: {enabled: false}\n")
    assert set(found) == {"ConfigMap", "PyTorchJob"}
    job = found["PyTorchJob"]
    assert [p["name"] for p in container(job)["ports"]] == ["pytorchjob-port"]
    assert env(job)["ORCH_METRICS_PORT"] == "0"


def test_podmonitor_selects_the_jobs_pods_by_the_metrics_port(tmp_path):
    found = objects(tmp_path, BASE + "metrics: {release: prom, interval: 1m}\nlabels: {team: a}\n")
    monitor, job = found["PodMonitor"], found["PyTorchJob"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    pod_labels = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["podMetricsEndpoints"] == [
        # honorLabels: the exporter's own `job` label (the orch job name) must survive the scrape.
        {"port": "metrics", "path": "/metrics", "honorLabels": True, "interval": "60s"}
    ]


def test_labels_queue_and_user_labels_cannot_hide_the_job(tmp_path):
    text = BASE + "labels: {team: nlp, orch.dev/job: other}\nscheduling: {queue: team-a}\n"
    job = objects(tmp_path, text)["PyTorchJob"]
    labels = job["metadata"]["labels"]
    assert labels[naming.LABEL_JOB] == "demo" and labels["team"] == "nlp"
    assert labels[naming.LABEL_MANAGED_BY] == naming.MANAGED_BY
    assert labels[naming.LABEL_KUEUE_QUEUE] == "team-a"
    pod_labels = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["labels"]
    assert naming.LABEL_KUEUE_QUEUE not in pod_labels and pod_labels[naming.LABEL_JOB] == "demo"


def test_run_policy_and_restart_policy(tmp_path):
    text = BASE + "restart: {policy: exit-code, backoff_limit: 7}\ndeadline: 2h\nttl_after_finished: 1d\n"
    job = objects(tmp_path, text)["PyTorchJob"]
    assert job["spec"]["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "backoffLimit": 7,
        "activeDeadlineSeconds": 7200,
        "ttlSecondsAfterFinished": 86400,
    }
    assert job["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"] == "ExitCode"


def test_security_context_is_restrictive_by_default(tmp_path):
    job = objects(tmp_path)["PyTorchJob"]
    assert pod(job)["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert container(job)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


def test_pod_overrides_merge_into_every_replica(tmp_path):
    text = (
        BASE
        + """nodes: 2
restart: {policy: on-failure}
pod_overrides:
  hostIPC: true
  securityContext: {runAsNonRoot: true}
  containers:
    - {name: pytorch, imagePullPolicy: Always, securityContext: {capabilities: {add: [IPC_LOCK]}}}
    - {name: sidecar, image: busybox}
  tolerations: [{key: a, operator: Exists}]
"""
    )
    job = objects(tmp_path, text)["PyTorchJob"]
    for rtype in ("Master", "Worker"):
        spec = pod(job, rtype)
        assert spec["hostIPC"] is True
        assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True}
        main, sidecar = spec["containers"]
        assert main["name"] == "pytorch" and main["imagePullPolicy"] == "Always"
        assert main["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert main["command"][:3] == LAUNCHER
        assert sidecar == {"name": "sidecar", "image": "busybox"}
        assert spec["tolerations"] == [{"key": "a", "operator": "Exists"}]


def test_merge_overrides_null_deletes_and_plain_lists_replace():
    base = {"a": {"b": 1, "c": 2}, "args": ["x"], "keep": 1}
    assert merge_overrides(base, {"a": {"b": None}, "args": ["y", "z"]}) == {
        "a": {"c": 2},
        "args": ["y", "z"],
        "keep": 1,
    }
    assert base == {"a": {"b": 1, "c": 2}, "args": ["x"], "keep": 1}  # inputs untouched


def test_name_override_renames_every_object_and_reference(tmp_path):
    spec = load(BASE, tmp_path)
    rendered = yaml.safe_dump(render.render(spec, name="demo-x7k2"))
    assert "demo-x7k2-config" in rendered and "name: demo\n" not in rendered
    assert "demo\n" not in rendered.replace("demo-x7k2", "")


def test_render_needs_an_image(tmp_path):
    spec = load("name: demo\ntrain: {task: digits}\n", tmp_path)
    with pytest.raises(SpecError, match="image"):
        render.render(spec)


def test_yaml_and_json_output_round_trip(tmp_path):
    found = render.render(load(BASE, tmp_path))
    assert list(yaml.safe_load_all(render.to_yaml(found))) == found
    assert json.loads(render.to_json(found)) == {"apiVersion": "v1", "kind": "List", "items": found}
    assert "train.json: |" in render.to_yaml(found)  # the train section stays readable
