"""What a TrainJob's restart policies do when pods fail or are preempted, and what `orch status` reads back
(issue #19 points 9 and 10).

The test plays the Job controller's podFailurePolicy and JobSet's failurePolicy from the rendered runtime
(tests/fakes/trainer.py `fail_pod`, which cites their source) and the kubelet; orch is the real CLI over
real HTTP to the emulator.
"""

from __future__ import annotations

import json

from tests.cluster.test_trainjob import NS, submit, v2  # noqa: F401  (v2 is a fixture)
from tests.fakes.emulator import PODS, TRAINJOBS
from tests.fakes.trainer import NODE, TrainerV2


def write_job(tmp_path, restart: str, nodes: int = 2):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        f"name: demo\nimage: registry.example/trainer:1\nnodes: {nodes}\nrestart: {restart}\n"
        "output: {pvc: ckpt}\ntrain: {task: digits, batch_size: 96, max_steps: 10}\n"
    )
    return job_file


def status(env) -> dict:
    return json.loads(env.orch("status", "demo", "-o", "json").stdout)


def test_preemption_restarts_the_whole_job_without_spending_max_restarts(v2, tmp_path):  # noqa: F811
    submit(v2, write_job(tmp_path, "{policy: job, max_restarts: 1}"))
    trainer = TrainerV2(v2.kube, NS, "demo")
    pods = trainer.start()
    # Two preemptions: the Job fails by its podFailurePolicy (DisruptionTarget), JobSet restarts uncounted.
    assert trainer.fail_pod(pods[0], exit_code=143, disrupted=True) == "restarted"
    assert trainer.fail_pod(trainer.pods[1], exit_code=137, disrupted=True) == "restarted"
    # A real failure is what max_restarts counts: one is allowed, the second fails the job.
    assert trainer.fail_pod(trainer.pods[0], exit_code=1) == "restarted"
    state = status(v2)
    assert (state["phase"], state["restarts"]) == ("Running", 3)
    assert trainer.fail_pod(trainer.pods[1], exit_code=139) == "failed"
    state = status(v2)
    assert (state["phase"], state["reason"]) == ("Failed", "ReachedMaxRestarts")


def test_exit_code_policy_replaces_a_preempted_pod_and_fails_the_jobset_on_a_program_error(v2, tmp_path):  # noqa: F811
    submit(v2, write_job(tmp_path, "{policy: exit-code, backoff_limit: 0}", nodes=1))
    trainer = TrainerV2(v2.kube, NS, "demo")
    (pod,) = trainer.start()
    assert trainer.fail_pod(pod, exit_code=143, disrupted=True) == "replaced"  # not counted: backoffLimit 0
    (pod,) = trainer.pods
    assert trainer.fail_pod(pod, exit_code=1) == "failed"  # 1-127: FailJob, then FailJobSet
    state = status(v2)
    assert (state["phase"], state["reason"]) == ("Failed", "FailJobSetFailurePolicyAction")
    assert "with exit code 1 matching FailJob rule" in state["message"]


def test_trainjob_phase_comes_from_jobs_status_and_pods_never_a_created_condition(v2, tmp_path):  # noqa: F811
    kube = v2.kube
    submit(v2, write_job(tmp_path, "{policy: job, max_restarts: 2}", nodes=2))
    trainer = TrainerV2(kube, NS, "demo")
    first = trainer.start(running=False)
    conditions = (kube.get(TRAINJOBS, NS, "demo").get("status") or {}).get("conditions") or []
    assert "Created" not in {c["type"] for c in conditions}  # no Trainer release sets it
    state = status(v2)
    assert (state["phase"], state["reason"], state["message"]) == (
        "Pending",
        "PodsStarting",
        "0 of 2 pods running",
    )

    trainer.set_pod_phase(first[0], "Running")  # one pod runs, the other waits for room
    state = status(v2)
    assert (state["phase"], state["message"]) == ("Pending", "1 of 2 pods running")

    kube.patch(PODS, NS, first[1], {"status": {"phase": "Running", "containerStatuses": [
        {"name": NODE, "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
         "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}})  # fmt: skip
    state = status(v2)
    assert (state["phase"], state["reason"]) == ("Restarting", "CrashLoopBackOff")
    assert state["message"] == f"pod {first[1]} restarted 4 times"

    trainer.restart(running=False)  # JobSet recreates every pod: the new ones are not running yet
    state = status(v2)
    assert (state["phase"], state["restarts"]) == ("Restarting", 1)
    assert state["message"] == "0 of 2 pods running (after 1 whole-job restart)"
    for pod in trainer.pods:
        trainer.set_pod_phase(pod, "Running")
    trainer.set_jobs_status(ready=1, active=1)
    state = status(v2)
    assert (state["phase"], state["reason"], state["restarts"]) == ("Running", "JobsReady", 1)
    assert "Restarts:    1" in v2.orch("status", "demo").stdout

    trainer.set_jobs_status(failed=1)  # a child Job failed; the TrainJob has not
    assert (status(v2)["phase"], status(v2)["reason"]) == ("Restarting", "JobFailed")
    listed = json.loads(v2.orch("list", "-o", "json").stdout)[0]  # list reads no pods: jobsStatus alone
    assert (listed["phase"], listed["reason"]) == ("Restarting", "JobFailed")
