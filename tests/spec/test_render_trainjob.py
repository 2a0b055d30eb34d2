"""What the TrainJob rendering decides, and what the queue/gang/recovery settings render on both APIs, one
behaviour per test (the goldens in test_golden pin whole objects; these say why). docs/cluster.md, "Queues,
gangs and recovery", cites these tests."""

from __future__ import annotations

import pytest

from orchestrator import naming
from orchestrator.apis import trainjob
from orchestrator.errors import SpecError
from orchestrator.rendering import render
from tests.fakes import volcano
from tests.spec.conftest import load
from tests.spec.manifest_checks import objects_errors
from tests.spec.test_spec_cmds import orch

BASE = "name: demo\nimage: example.com/trainer:1\ntrain: {task: digits, batch_size: 64}\n"
MULTI = BASE + "nodes: 4\ngpus_per_node: 8\n"


def objects(tmp_path, text=BASE, *overrides, api="trainjob"):
    return {o["kind"]: o for o in render.render(load(text, tmp_path, *overrides), api=api)}


def runtime_job(found):
    (rjob,) = found["TrainingRuntime"]["spec"]["template"]["spec"]["replicatedJobs"]
    return rjob


def runtime_pod(found):
    return runtime_job(found)["template"]["spec"]["template"]


# --- TrainJob carries what the PyTorchJob carries ----------------------------------------------------------


def test_trainjob_carries_every_per_pod_setting(tmp_path):
    text = MULTI + (
        "resources: {cpu: '16', memory: 64Gi, shm: 12Gi}\n"
        "env: {NCCL_DEBUG: INFO}\n"
        "secret_env: {HF_TOKEN: {secret: hf, key: token}}\n"
        "volumes: [{name: data, mount: /data, pvc: ds, read_only: true}]\n"
        "node_selector: {gpu: h100}\n"
        "tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]\n"
        "affinity: {nodeAffinity: {}}\n"
        "service_account: trainer\n"
        "image_pull_secrets: [regcred]\n"
        "scheduling: {priority_class: high}\n"
        "labels: {team: nlp}\n"
        "annotations: {example.com/owner: me}\n"
        "deadline: 2h\n"
        "metrics: {port: 9100}\n"
        "pod_overrides: {hostIPC: true, containers: [{name: node, imagePullPolicy: Always}]}\n"
    )
    found = objects(tmp_path, text)
    pyjob = objects(tmp_path, text, api="pytorchjob")["PyTorchJob"]
    v1_pod = pyjob["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    (v1_container,) = v1_pod["spec"]["containers"]
    job = found["TrainJob"]
    trainer = job["spec"]["trainer"]
    assert trainer["image"] == "example.com/trainer:1"
    assert trainer["command"] == v1_container["command"]  # the same torchrun line under both APIs
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (4, 8)
    assert trainer["resourcesPerNode"] == v1_container["resources"]
    assert trainer["env"] == v1_container["env"]  # incl. HF_TOKEN as a secretKeyRef
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in trainer[
        "env"
    ]
    assert job["spec"]["activeDeadlineSeconds"] == 7200
    assert job["spec"]["runtimeRef"] == {
        "name": "demo",
        "apiGroup": trainjob.GROUP,
        "kind": "TrainingRuntime",
    }
    pod = runtime_pod(found)
    assert pod["metadata"] == v1_pod["metadata"]  # labels and annotations
    for key in ("securityContext", "serviceAccountName", "nodeSelector", "tolerations", "affinity", "imagePullSecrets",
                "priorityClassName", "volumes", "hostIPC"):  # fmt: skip
        assert pod["spec"][key] == v1_pod["spec"][key], key
    (container,) = pod["spec"]["containers"]
    assert container["name"] == "node" and container["imagePullPolicy"] == "Always"
    assert container["volumeMounts"] == v1_container["volumeMounts"]  # /dev/shm 12Gi, /etc/orch, output, data
    assert container["securityContext"] == v1_container["securityContext"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]
    selector = found["PodMonitor"]["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert objects_errors(list(found.values())) == []


def test_the_runtime_has_the_torch_distributed_shape_and_is_named_like_the_job(tmp_path):
    found = objects(tmp_path, MULTI)
    runtime = found["TrainingRuntime"]
    assert runtime["metadata"]["name"] == found["TrainJob"]["metadata"]["name"] == "demo"
    assert runtime["metadata"]["labels"][naming.LABEL_JOB] == "demo"  # `orch delete` finds it with the job
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 4, "torch": {}}
    rjob = runtime_job(found)
    assert rjob["name"] == "node" and rjob["replicas"] == 1
    assert rjob["template"]["metadata"]["labels"] == {trainjob.LABEL_TRAINJOB_ANCESTOR: "trainer"}


def test_render_auto_is_a_pytorchjob_and_api_picks_the_kind(tmp_path):
    assert "PyTorchJob" in objects(tmp_path, BASE, api=None)
    assert "PyTorchJob" in objects(tmp_path, BASE + "api: pytorchjob\n", api=None)
    assert {"TrainingRuntime", "TrainJob"} <= set(objects(tmp_path, BASE + "api: trainjob\n", api=None))
    assert "PyTorchJob" in objects(tmp_path, BASE + "api: trainjob\n", api="pytorchjob")


def test_orch_render_api_flag(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(BASE)
    result = orch("render", str(job), "--api", "trainjob")
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stdout.splitlines() if line.startswith("kind:")] == [
        "kind: ConfigMap",
        "kind: TrainingRuntime",
        "kind: TrainJob",
        "kind: PodMonitor",
    ]


@pytest.mark.parametrize(
    ("extra", "field", "line"),
    [
        ("nodes: 2\nelastic: {min_nodes: 1, max_nodes: 2}\n", "elastic", 5),
        ("ttl_after_finished: 1d\n", "ttl_after_finished", 4),
        ("env: {PET_NNODES: '2'}\n", "env", 4),
        (
            "runtime: torch-distributed\nmetrics: {enabled: false}\nscheduling: {scheduler: volcano}\n",
            "scheduling.scheduler",
            6,
        ),
        (
            "runtime: torch-distributed\nmetrics: {enabled: false}\npod_overrides: {hostIPC: true}\n",
            "pod_overrides.hostIPC",
            6,
        ),
        ("runtime: torch-distributed\nrestart: {policy: never}\n", "restart", 5),
    ],
)
def test_what_a_trainjob_cannot_carry_is_one_line_naming_the_field(tmp_path, extra, field, line):
    job = tmp_path / "job.yaml"
    job.write_text(BASE + extra)
    result = orch("render", str(job), "--api", "trainjob")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"error: {job}:{line}:") and f": {field}: " in result.stderr, (
        result.stderr
    )
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_a_name_too_long_for_the_jobsets_pod_names_is_refused(tmp_path):
    """JobSet names pods <name>-node-0-<index>-<5 random> (<= 63): a 50-character name fits a PyTorchJob,
    not a TrainJob; the error says how long it may be."""
    job = tmp_path / "job.yaml"
    job.write_text(BASE.replace("name: demo", "name: " + "a" * 50) + "nodes: 16\n")
    result = orch("render", str(job), "--api", "trainjob")
    assert result.returncode == 2 and result.stderr.startswith(
        f"error: {job}:1:1: name: 50 characters is too long"
    )
    assert "use at most 47" in result.stderr
    assert orch("render", str(job)).returncode == 0
    spec = load(BASE + "nodes: 16\n", tmp_path)
    with pytest.raises(SpecError, match="^name: 49 characters"):
        render.render(spec, api="trainjob", name="b" * 49)  # a submit name is checked too
    assert objects_errors(render.render(spec, api="trainjob", name="b" * 47)) == []


def test_library_render_refuses_an_api_the_spec_cannot_use(tmp_path):
    spec = load(BASE + "nodes: 2\nelastic: {min_nodes: 1, max_nodes: 2}\n", tmp_path)
    with pytest.raises(SpecError, match=r"^elastic: TrainJob"):
        render.render(spec, api="trainjob")
    with pytest.raises(SpecError, match="api"):
        render.render(spec, api="mpijob")
    with pytest.raises(SpecError, match=r"^runtime: .*api: trainjob"):
        render.render(load(BASE + "runtime: x\nmetrics: {enabled: false}\n", tmp_path), api="pytorchjob")


def test_runtime_name_references_the_cluster_runtime_and_patches_the_pods(tmp_path):
    text = MULTI + (
        "runtime: torch-distributed\nmetrics: {enabled: false}\n"
        "volumes: [{name: data, mount: /data, pvc: ds}]\nnode_selector: {gpu: h100}\n"
        "scheduling: {queue: team-a}\n"
    )
    found = objects(tmp_path, text)
    assert "TrainingRuntime" not in found
    job = found["TrainJob"]
    assert job["spec"]["runtimeRef"] == {
        "name": "torch-distributed",
        "apiGroup": trainjob.GROUP,
        "kind": "ClusterTrainingRuntime",
    }
    (patch,) = job["spec"]["runtimePatches"]
    assert patch["manager"] == trainjob.RUNTIME_PATCH_MANAGER
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = rjob["template"]["spec"]["template"]
    assert pod["metadata"]["labels"][naming.LABEL_JOB] == "demo"
    assert pod["spec"]["nodeSelector"] == {"gpu": "h100"}
    assert {v["name"] for v in pod["spec"]["volumes"]} == {"orch-shm", "orch-config", "orch-output", "data"}
    (container,) = pod["spec"]["containers"]
    assert set(container) == {"name", "securityContext", "volumeMounts"}  # env etc. travel in spec.trainer
    assert job["metadata"]["labels"][naming.LABEL_KUEUE_QUEUE] == "team-a"
    assert objects_errors(list(found.values())) == []


# --- Queues, gangs and recovery, on both APIs ---------------------------------------------------------------


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_kueue_queue_labels_the_job_and_creates_it_suspended(tmp_path, api):
    """Kueue admits the job's Workload (all pods) at once and then unsuspends it: nothing starts before."""
    found = objects(tmp_path, MULTI + "scheduling: {queue: team-a, priority: research}\n", api=api)
    job = found["PyTorchJob" if api == "pytorchjob" else "TrainJob"]
    assert job["metadata"]["labels"][naming.LABEL_KUEUE_QUEUE] == "team-a"
    assert job["metadata"]["labels"][naming.LABEL_KUEUE_PRIORITY] == "research"
    suspend = job["spec"]["runPolicy"]["suspend"] if api == "pytorchjob" else job["spec"]["suspend"]
    assert suspend is True


def test_priority_and_topology_need_a_queue(tmp_path):
    with pytest.raises(SpecError, match=r"scheduling.priority: needs scheduling.queue"):
        load(BASE + "scheduling: {priority: research}\n", tmp_path)
    with pytest.raises(SpecError, match=r"scheduling.topology: needs scheduling.queue"):
        load(BASE + "scheduling: {topology: {required: rack}}\n", tmp_path)


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_volcano_gang_uses_volcanos_queue_and_all_pods(tmp_path, api):
    found = objects(
        tmp_path, MULTI + "scheduling: {scheduler: volcano, queue: research, priority_class: high}\n", api=api
    )
    if api == "pytorchjob":
        job = found["PyTorchJob"]
        assert job["spec"]["runPolicy"]["schedulingPolicy"] == {
            "minAvailable": 4,
            "queue": "research",
            "priorityClass": "high",
        }
        pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    else:
        job, runtime = found["TrainJob"], found["TrainingRuntime"]
        assert runtime["spec"]["podGroupPolicy"] == {
            "volcano": {}
        }  # the trainer makes a PodGroup of numNodes
        assert runtime["spec"]["template"]["metadata"]["annotations"] == {
            naming.ANNOTATION_VOLCANO_QUEUE: "research"
        }
        pod = runtime_pod(found)["spec"]
    assert pod["schedulerName"] == "volcano" and pod["priorityClassName"] == "high"
    assert naming.LABEL_KUEUE_QUEUE not in job["metadata"]["labels"]  # the queue is Volcano's, not Kueue's


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_coscheduler_gang(tmp_path, api):
    found = objects(tmp_path, MULTI + "scheduling: {scheduler: scheduler-plugins-scheduler}\n", api=api)
    if api == "pytorchjob":
        assert found["PyTorchJob"]["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 4}
    else:
        assert found["TrainingRuntime"]["spec"]["podGroupPolicy"] == {"coscheduling": {}}
        assert runtime_pod(found)["spec"]["schedulerName"] == "scheduler-plugins-scheduler"


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_gang_is_off_for_one_pod_and_when_asked(tmp_path, api):
    one = objects(tmp_path, BASE + "scheduling: {scheduler: volcano}\n", api=api)
    off = objects(tmp_path, MULTI + "scheduling: {scheduler: volcano, gang: false}\n", api=api)
    for found in (one, off):
        if api == "pytorchjob":
            assert "schedulingPolicy" not in found["PyTorchJob"]["spec"]["runPolicy"]
        else:
            assert "podGroupPolicy" not in found["TrainingRuntime"]["spec"]


@pytest.mark.parametrize(
    ("api", "policy"),
    [("pytorchjob", "on-failure"), ("pytorchjob", "job"), ("trainjob", "job"), ("trainjob", "on-failure")],
)
def test_topology_annotations_on_every_pod_template(tmp_path, api, policy):
    text = MULTI + f"scheduling: {{queue: q, topology: {{required: rack}}}}\nrestart: {{policy: {policy}}}\n"
    found = objects(tmp_path, text, api=api)
    if api == "pytorchjob":
        templates = [r["template"] for r in found["PyTorchJob"]["spec"]["pytorchReplicaSpecs"].values()]
    else:
        templates = [runtime_pod(found)]
    for template in templates:
        annotations = template["metadata"]["annotations"]
        assert annotations[naming.ANNOTATION_KUEUE_REQUIRED_TOPOLOGY] == "rack"
        # Master and Workers are two PodSets: one group keeps them in one domain. A TrainJob's runtime has one
        # replicated job, one PodSet, and Kueue refuses a group of one (pkg/controller/jobframework/
        # tas_validation.go ValidatePodSetGroupingTopology: "can only define groups of exactly 2 pod sets").
        assert (naming.ANNOTATION_KUEUE_PODSET_GROUP in annotations) == (len(templates) == 2)
    preferred = objects(tmp_path, MULTI + "scheduling: {queue: q, topology: {preferred: rack}}\n", api=api)
    pod = (
        runtime_pod(preferred)
        if api == "trainjob"
        else preferred["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    )
    assert pod["metadata"]["annotations"] == {naming.ANNOTATION_KUEUE_PREFERRED_TOPOLOGY: "rack"}


@pytest.mark.parametrize(
    ("policy", "pod_restart", "job_fields", "failure_policy"),
    [
        (
            "job",
            "Never",
            {"backoffLimit": 0, "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}},
            {"maxRestarts": 5, "rules": [{"name": "Disruption", "action": "RestartJobSetAndIgnoreMaxRestarts",
                                          "onJobFailureReasons": ["PodFailurePolicy"]}]},
        ),
        ("on-failure", "OnFailure", {"backoffLimit": 7}, None),
        ("never", "Never", {"backoffLimit": 0}, None),
    ],
)  # fmt: skip
def test_trainjob_restart_policy(tmp_path, policy, pod_restart, job_fields, failure_policy):
    """job: a failed pod fails its Job (Never, backoffLimit 0), and JobSet's failurePolicy recreates every
    Job: all pods restart together, at most max_restarts times; a disrupted pod's Job fails by its
    podFailurePolicy, and that reason restarts the JobSet without counting (issue #19 point 9)."""
    found = objects(tmp_path, MULTI + f"restart: {{policy: {policy}, max_restarts: 5, backoff_limit: 7}}\n")
    rjob = runtime_job(found)["template"]["spec"]
    assert rjob["template"]["spec"]["restartPolicy"] == pod_restart
    assert {k: v for k, v in rjob.items() if k != "template"} == job_fields
    assert found["TrainingRuntime"]["spec"]["template"]["spec"].get("failurePolicy") == failure_policy


def test_trainjob_exit_code_policy_fails_at_once_on_program_errors(tmp_path):
    found = objects(tmp_path, MULTI + "restart: {policy: exit-code, backoff_limit: 4}\n")
    rjob = runtime_job(found)["template"]["spec"]
    assert rjob["backoffLimit"] == 4 and rjob["template"]["spec"]["restartPolicy"] == "Never"
    disruption, rule = rjob["podFailurePolicy"]["rules"]
    assert disruption == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == list(range(1, 128))
    assert found["TrainingRuntime"]["spec"]["template"]["spec"]["failurePolicy"] == {
        "rules": [
            {"name": "ProgramError", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}
        ]
    }
    assert objects_errors(list(found.values())) == []


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_output_on_a_pvc_mounts_the_claim_at_the_output_dir(tmp_path, api):
    found = objects(tmp_path, BASE + "output: {pvc: ckpt}\n", api=api)
    pod = (
        runtime_pod(found)["spec"]
        if api == "trainjob"
        else found["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    )
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == naming.OUTPUT_DIR)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["persistentVolumeClaim"] == {"claimName": "ckpt"}
    assert (
        mount["subPath"] == "demo"
    )  # jobs sharing a claim keep apart; a resubmitted job finds its checkpoints


# --- what `orch submit` warns about ------------------------------------------------------------------------

PARTIAL = "nothing prevents partial scheduling"
LOST = "restarted job starts from step 0"
UNBOUNDED = "so backoff_limit (3) does not bound the retries"  # issue #19 point 7
PER_AGENT = "bounds each pod's torchrun agent, not the job"  # issue #19 point 8


@pytest.mark.parametrize(
    ("extra", "api", "expected"),
    [
        ("", "pytorchjob", [PARTIAL, PER_AGENT]),  # 4 pods, default scheduler, no queue; restarts in place
        ("", "trainjob", [PARTIAL, LOST]),  # ... and the JobSet restart makes new pods
        ("scheduling: {queue: q}\n", "trainjob", [LOST]),
        ("scheduling: {scheduler: volcano}\noutput: {pvc: c}\n", "trainjob", []),
        ("scheduling: {scheduler: scheduler-plugins-scheduler}\n", "pytorchjob", [PER_AGENT]),
        ("scheduling: {queue: q}\nrestart: {policy: on-failure}\n", "pytorchjob", []),
        ("scheduling: {gang: false}\nrestart: {policy: on-failure}\n", "trainjob", []),
        ("scheduling: {queue: q}\nrestart: {policy: exit-code}\n", "pytorchjob", [LOST, UNBOUNDED]),
        ("scheduling: {queue: q}\nrestart: {policy: exit-code}\noutput: {pvc: c}\n", "pytorchjob", []),
        ("scheduling: {queue: q}\nrestart: {policy: exit-code}\noutput: {url: 's3://b/p'}\n", "pytorchjob",
         [UNBOUNDED]),  # the start count lives in the output dir, an emptyDir beside an object store
        ("scheduling: {queue: q}\nvolumes: [{name: c, mount: /ckpt, pvc: c}]\n", "trainjob", [LOST]),
        ("scheduling: {queue: q}\nvolumes: [{name: c, mount: /ckpt, pvc: c}]\n"
         "train: {task: digits, batch_size: 64, checkpoint: {dir: /ckpt/demo}}\n", "trainjob", []),
    ],
)  # fmt: skip
def test_submit_warnings(tmp_path, extra, api, expected):
    text = "name: demo\nimage: i:1\nnodes: 4\ngpus_per_node: 8\nresources: {cpu: 8}\n" + extra
    if "train:" not in extra:
        text += "train: {task: digits, batch_size: 64}\n"
    found = render.warnings(load(text, tmp_path), api)
    assert len(found) == len(expected) and all(e in w for e, w in zip(expected, found, strict=True)), found


def test_pytorchjob_max_restarts_meaning_is_said_in_one_line(tmp_path):
    """4 nodes, max_restarts 3: backoffLimit 12, so up to 3 x (4 + 12) + 12 group restarts, not 3."""
    (line,) = [
        w for w in render.warnings(load(BASE + "nodes: 4\n", tmp_path), "pytorchjob") if PER_AGENT in w
    ]
    assert "re-form the group up to 60 times" in line and "exactly 3 times" in line and "\n" not in line


def test_one_pod_jobs_get_no_partial_scheduling_warning(tmp_path):
    assert render.warnings(load(BASE + "resources: {memory: 8Gi}\n", tmp_path), "trainjob") == []


IMAGE_WARNING = "has the tag :latest: each pod pulls whatever it names when it starts"
BEST_EFFORT = "resources sets no cpu or memory, so the pods are BestEffort"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("image: example.com/trainer\n", ["has no tag (that is :latest)", BEST_EFFORT]),
        ("image: registry:5000/trainer:latest\n", [IMAGE_WARNING, BEST_EFFORT]),
        ("image: registry:5000/trainer\nresources: {cpu: 8}\n", ["has no tag"]),
        ("image: example.com/trainer:latest@sha256:" + "0" * 64 + "\nresources: {memory: 1Gi}\n", []),
        ("image: example.com/trainer:1\ngpus_per_node: 1\n", [BEST_EFFORT]),  # a GPU limit is no request
        ("image: example.com/trainer:1\npod_overrides: {containers: [{name: trainer, resources: "
         "{requests: {cpu: '1'}}}]}\n", []),
        ("image: example.com/trainer:1\napi: trainjob\nruntime: torch-distributed\n", []),
    ],
    ids=["no-tag", "latest", "registry-port", "digest", "gpu-only", "pod-overrides", "runtime"],
)  # fmt: skip
def test_an_image_of_no_version_and_pods_without_requests_are_warned_about(tmp_path, extra, expected):
    """#33: `:latest` (or no tag) and BestEffort pods render and run, so they are warnings, not errors; a
    digest, a version tag, a cpu or memory request (also through pod_overrides) or a runtime's pod are not."""
    text = "name: demo\ntrain: {task: digits, batch_size: 64}\n" + extra
    found = render.warnings(load(text, tmp_path), "trainjob")
    assert len(found) == len(expected) and all(e in w for e, w in zip(expected, found, strict=True)), found


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize(
    "job", [BASE + "scheduling: {scheduler: volcano, queue: research}\n",
            MULTI + "scheduling: {scheduler: volcano, queue: research, gang: false}\n"],
    ids=["one-pod", "gang-false"],
)  # fmt: skip
def test_pods_without_a_gang_wait_in_the_volcano_queue_asked_for(tmp_path, api, job):
    """No PodGroup is rendered for them, so Volcano makes one per pod, from the pod's annotation (played by
    tests/fakes/volcano.py); without it they would land in the queue "default"."""
    found = objects(tmp_path, job, api=api)
    if api == "pytorchjob":
        templates = [r["template"] for r in found["PyTorchJob"]["spec"]["pytorchReplicaSpecs"].values()]
    else:
        templates = [runtime_pod(found)]
    for template in templates:
        assert volcano.queue_of(template) == "research"


def test_a_named_runtime_gets_its_metrics_scraped_by_port_number(tmp_path):
    """`runtime: NAME` keeps metrics on (#24): the runtime's pods do not declare orch's port, so the PodMonitor
    scrapes the training container at the pod IP and the port number; the trainer is told to serve there."""
    rendered = objects(tmp_path, BASE + "runtime: torch-distributed\nmetrics: {port: 9555}\n")
    assert objects_errors(list(rendered.values())) == []  # the PodMonitor and TrainJob fit their CRDs
    monitor = rendered["PodMonitor"]
    assert monitor["spec"]["podMetricsEndpoints"] == [{
        "path": "/metrics", "honorLabels": True, "interval": "15s",
        "relabelings": [
            {"sourceLabels": ["__meta_kubernetes_pod_container_name"], "regex": "node", "action": "keep"},
            {"sourceLabels": ["__meta_kubernetes_pod_ip"], "targetLabel": "__address__", "replacement": "$1:9555"},
            {"targetLabel": "endpoint", "replacement": "metrics"},
        ],
    }]  # fmt: skip
    assert monitor["spec"]["selector"]["matchLabels"] == {naming.LABEL_JOB: "demo"}
    job = rendered["TrainJob"]
    env = {e["name"]: e.get("value") for e in job["spec"]["trainer"]["env"]}
    assert env["ORCH_METRICS_PORT"] == "9555"
    patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert patch["template"]["spec"]["template"]["metadata"]["labels"][naming.LABEL_JOB] == "demo"


RUNTIME = BASE + "api: trainjob\nruntime: torch-distributed\nmetrics: {enabled: false}\n"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ("{initContainers: [{name: warm, image: busybox}]}", "pod_overrides.initContainers"),
        ("{containers: [{name: sidecar, image: busybox}]}", "pod_overrides.containers: [0] 'sidecar'"),
        (
            "{containers: [{name: pytorch}, {name: proxy, volumeMounts: []}]}",
            "pod_overrides.containers: [1] 'proxy'",
        ),
    ],
)
def test_runtime_patches_the_webhook_refuses_are_refused_at_validate(tmp_path, overrides, field):
    """Trainer's webhook (pkg/runtime/framework/plugins/jobset/jobset.go Validate, played by
    manifest_checks.trainer_webhook_errors) refuses a runtime patch with an initContainer or a container that
    the runtime's job does not have; a ClusterTrainingRuntime's containers are not known at validate time, so
    only the main container may be patched (pytorch/node, with what ContainerPatch has)."""
    job = tmp_path / "job.yaml"
    job.write_text(RUNTIME + f"pod_overrides: {overrides}\n")
    for command in ("validate", "render"):
        result = orch(command, str(job))
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert result.stderr.startswith(f"error: {job}:7:") and f": {field}" in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1


def test_a_patch_of_the_main_container_the_webhook_takes_still_renders(tmp_path):
    text = (
        RUNTIME + "pod_overrides: {containers: [{name: pytorch, volumeMounts: [{name: x, mountPath: /x}]}],"
    )
    text += " volumes: [{name: x, emptyDir: {}}]}\n"
    found = objects(tmp_path, text)
    assert objects_errors(list(found.values())) == []
