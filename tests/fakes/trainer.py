"""Plays Kubeflow Trainer v2 for one TrainJob on the emulator: the trainer controller, JobSet's controller, the
Job controller and the kubelet (nothing of them can run here).

What it does is read from their source (see orchestrator/apis/trainjob.py for the references): the
trainer builds a JobSet named like the TrainJob from the runtime's JobSet template, with TrainJob.spec.trainer
(image, command, args, env, numNodes, resourcesPerNode) applied to the `node` container of the `node`
replicated job, and the torch plugin's PET_* env; JobSet creates the Job `<name>-node-0`, whose pods are named
`<name>-node-0-<index>-<suffix>` and labelled by JobSet and the Job controller. The TrainJob's conditions are
only Suspended, Complete and Failed, the last two copied from the JobSet's (kubeflow/trainer
pkg/apis/trainer/v1alpha1/trainjob_types.go; pkg/runtime/framework/plugins/jobset/jobset.go `Status`: no
release sets a Created condition), and its jobsStatus is the JobSet's replicatedJobsStatus, counted in child
Jobs, not pods. A JobSet restart deletes every pod and recreates them with the next restart attempt.

`fail_pod` plays a pod's failure through the Job controller's podFailurePolicy and backoffLimit
(kubernetes pkg/controller/job/pod_failure_policy.go) and then JobSet's failurePolicy (kubernetes-sigs/jobset
pkg/controllers/failure_policy.go `executeFailurePolicy`), from the rendered runtime.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from typing import Any

import yaml

from tests.fakes.emulator import (
    CLUSTERTRAININGRUNTIMES,
    JOBSETS,
    PODS,
    TRAININGRUNTIMES,
    TRAINJOBS,
    now_stamp,
)
from tests.fakes.kube import Kube
from tests.schemas import crd_file

NODE = "node"
MASTER_PORT = 29500
_suffixes = itertools.count(10000)

# The default ClusterTrainingRuntime `torch-distributed` (kubeflow/trainer manifests/base/runtimes), abridged.
DEFAULT_POD_TEMPLATE = {
    "spec": {"containers": [{"name": NODE, "image": "pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime",
                             "command": ["/bin/bash", "-c", "torchrun /workspace/train.py"]}]},
}  # fmt: skip


class TrainerV2:
    def __init__(self, kube: Kube, namespace: str, name: str, *, version: str = "v2.2") -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.version = version  # the Trainer release played, where releases differ
        self.restart_attempt = 0
        self.restarts_counted = 0  # JobSet status.restartsCountTowardsMax
        self.job_failures = 0  # the Job's failed pods that count against its backoffLimit
        self.pods: list[str] = []  # by node rank
        self.pod_owner: dict[str, Any] = {}

    # --- reading what orch submitted

    def trainjob(self) -> dict[str, Any]:
        job = self.kube.get(TRAINJOBS, self.namespace, self.name)
        assert job is not None, f"no TrainJob {self.namespace}/{self.name}"
        return job

    def runtime(self) -> dict[str, Any] | None:
        ref = self.trainjob()["spec"]["runtimeRef"]
        if ref.get("kind", "ClusterTrainingRuntime") == "TrainingRuntime":
            return self.kube.get(TRAININGRUNTIMES, self.namespace, ref["name"])
        return self.kube.get(CLUSTERTRAININGRUNTIMES, None, ref["name"])

    def pod_template(self) -> dict[str, Any]:
        """The `node` replicated job's pod template with TrainJob.spec.trainer and the torch plugin applied."""
        runtime = self.runtime()
        template = DEFAULT_POD_TEMPLATE
        if runtime is not None:
            replicated = runtime["spec"]["template"]["spec"]["replicatedJobs"]
            template = next(r for r in replicated if r["name"] == NODE)["template"]["spec"]["template"]
        template = copy.deepcopy(template)
        trainer = self.trainjob()["spec"].get("trainer") or {}
        container = next(c for c in template["spec"]["containers"] if c["name"] == NODE)
        for key in ("image", "command", "args"):
            if key in trainer:
                container[key] = trainer[key]
        if "resourcesPerNode" in trainer:
            per_node = trainer["resourcesPerNode"]
            if self.version in ("v2.1", "v2.2"):
                # pkg/runtime/framework/plugins/jobset/builder.go (v2.1.0, v2.2.0) Trainer():
                # `Containers[j].WithResources(requirements)`: the runtime container's resources are replaced.
                container["resources"] = per_node
            else:
                # v2.3.0: merged into the runtime's (pkg/util/trainingruntime MergeResourceRequirements).
                merged = copy.deepcopy(container.get("resources") or {})
                for key in ("limits", "requests"):
                    if per_node.get(key):
                        merged[key] = {**merged.get(key, {}), **per_node[key]}
                container["resources"] = merged
        env = {e["name"]: e for e in container.get("env") or []}
        env.update({e["name"]: e for e in trainer.get("env") or []})
        env.update({e["name"]: e for e in self.pet_env()})
        container["env"] = list(env.values())
        return template

    def num_nodes(self) -> int:
        trainer = self.trainjob()["spec"].get("trainer") or {}
        policy = ((self.runtime() or {}).get("spec") or {}).get("mlPolicy") or {}
        return int(trainer.get("numNodes") or policy.get("numNodes") or 1)

    def pet_env(self) -> list[dict[str, Any]]:
        """What the torch plugin injects (pkg/runtime/framework/plugins/torch): torchrun reads PET_*."""
        trainer = self.trainjob()["spec"].get("trainer") or {}
        policy = ((self.runtime() or {}).get("spec") or {}).get("mlPolicy") or {}
        nproc = trainer.get("numProcPerNode") or (policy.get("torch") or {}).get("numProcPerNode") or "auto"
        index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        return [
            {"name": "PET_NNODES", "value": str(self.num_nodes())},
            {"name": "PET_NPROC_PER_NODE", "value": str(nproc)},
            {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": index}}},
            {"name": "PET_MASTER_ADDR", "value": f"{self.name}-{NODE}-0-0.{self.name}"},
            {"name": "PET_MASTER_PORT", "value": str(MASTER_PORT)},
        ]

    # --- the controllers' part

    def start(self, *, running: bool = True) -> list[str]:
        """Create the JobSet and its pods; set Created (and, with `running`, the pods running and ready)."""
        self.kube.put(JOBSETS, self.namespace, {
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": self.name, "ownerReferences": [self._owner()]},
        })  # fmt: skip
        jobset = self.kube.get(JOBSETS, self.namespace, self.name)
        assert jobset is not None
        # The pods' owner is really the Job, the Job's the JobSet; the emulated collector needs one link.
        self.pod_owner = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": self.name,
                          "uid": jobset["metadata"]["uid"]}  # fmt: skip
        self._create_pods(running=running)
        self.set_jobs_status(ready=1 if running else 0, active=1)
        return self.pods

    def restart(self, *, running: bool = True) -> list[str]:
        """JobSet's failure policy restarts the whole JobSet: every pod is deleted and created anew (only while
        the runtime's `failurePolicy.maxRestarts` allows it; beyond that JobSet fails instead)."""
        policy = (
            (((self.runtime() or {}).get("spec") or {}).get("template") or {})
            .get("spec", {})
            .get("failurePolicy")
        )
        allowed = int((policy or {}).get("maxRestarts") or 0)
        assert self.restarts_counted < allowed, (
            f"the JobSet allows {allowed} restarts: it would fail, not restart"
        )
        self.restarts_counted += 1
        return self._recreate(running=running)

    def _recreate(self, *, running: bool) -> list[str]:
        for pod in self.pods:
            self._end_log(pod)  # the kubelet kills the containers: their logs end
            self.kube.delete(PODS, self.namespace, pod)
        self.restart_attempt += 1
        self.job_failures = 0  # new Jobs
        self._create_pods(running=running)
        self.set_jobs_status(ready=1 if running else 0, active=1)
        return self.pods

    # --- a pod fails: the Job controller, then JobSet

    def job_template(self) -> dict[str, Any]:
        runtime = self.runtime() or {}
        replicated = runtime["spec"]["template"]["spec"]["replicatedJobs"]
        return next(r for r in replicated if r["name"] == NODE)["template"]["spec"]

    def fail_pod(self, pod: str, *, exit_code: int, disrupted: bool = False, running: bool = True) -> str:
        """The container of `pod` exits with `exit_code` (a preempted or evicted pod also gets the condition
        DisruptionTarget). Returns what the controllers did: "replaced" (the Job made a new pod), "restarted"
        (JobSet recreated every pod) or "failed" (the TrainJob failed)."""
        conditions = [
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
        ] * disrupted
        self._end_log(pod)
        self.kube.patch(PODS, self.namespace, pod, {"status": {
            "phase": "Failed", "conditions": conditions, "containerStatuses": [{"name": NODE, "restartCount": 0,
            "state": {"terminated": {"exitCode": exit_code, "reason": "Error"}}, "lastState": {}}],
        }})  # fmt: skip
        job = self.job_template()
        action, rule_index = self._pod_failure_policy_action(job, exit_code, conditions)
        if action == "FailJob":
            what = f"with exit code {exit_code}" if not disrupted else "has condition DisruptionTarget"
            return self._job_failed(
                "PodFailurePolicy",
                f"Pod {self.namespace}/{pod} {what} matching FailJob rule at index {rule_index}",
                running=running,
            )
        if action != "Ignore":
            self.job_failures += 1
        if self.job_failures > int(job.get("backoffLimit", 6)):
            return self._job_failed("BackoffLimitExceeded", "Job has reached the specified backoff limit",
                                    running=running)  # fmt: skip
        index = self.pods.index(pod)
        self.kube.delete(PODS, self.namespace, pod)
        self._create_pod(index, running=running)
        return "replaced"

    @staticmethod
    def _pod_failure_policy_action(
        job: dict[str, Any], exit_code: int, conditions: list[dict[str, Any]]
    ) -> tuple[str, int]:
        """The first podFailurePolicy rule that matches (pod_failure_policy.go matchPodFailurePolicy):
        onExitCodes on the `node` container's non-zero exit code, onPodConditions on the pod's conditions.
        No rule matching: "Count"."""
        rules = (job.get("podFailurePolicy") or {}).get("rules") or []
        for index, rule in enumerate(rules):
            if on_codes := rule.get("onExitCodes"):
                in_values = exit_code in on_codes["values"]
                if exit_code != 0 and in_values == (on_codes["operator"] == "In"):
                    return rule["action"], index
            for pattern in rule.get("onPodConditions") or []:
                if any(c["type"] == pattern["type"] and c["status"] == pattern.get("status", "True")
                       for c in conditions):  # fmt: skip
                    return rule["action"], index
        return "Count", -1

    def _job_failed(self, reason: str, message: str, *, running: bool) -> str:
        """JobSet's failurePolicy for a failed child Job: no policy fails the JobSet; else the first rule
        whose onJobFailureReasons match (empty: any), or the default RestartJobSet, which counts against
        maxRestarts (and fails the JobSet once they are spent)."""
        self.set_jobs_status(failed=1)
        policy = ((self.runtime() or {})["spec"]["template"]["spec"]).get("failurePolicy")
        if policy is None:
            return self._fail("FailedJobs", "jobset failed due to one or more job failures")
        rule = next(
            (r for r in policy.get("rules") or [] if not r.get("onJobFailureReasons")
             or reason in r["onJobFailureReasons"]),
            {"action": "RestartJobSet"},
        )  # fmt: skip
        if rule["action"] == "FailJobSet":
            return self._fail(
                "FailJobSetFailurePolicyAction", f"applying FailJobSet failure policy action: {message}"
            )
        if rule["action"] == "RestartJobSet":
            if self.restarts_counted >= int(policy.get("maxRestarts") or 0):
                return self._fail(
                    "ReachedMaxRestarts", "jobset failed due to reaching max number of restarts"
                )
            self.restarts_counted += 1
        self._recreate(running=running)
        return "restarted"

    def _end_log(self, pod: str) -> None:
        with contextlib.suppress(KeyError):  # a pod that never ran has no log
            self.kube.end_log(self.namespace, pod)

    def _fail(self, reason: str, message: str) -> str:
        for pod in self.pods:
            self._end_log(pod)
        self.set_condition("Failed", reason, message)  # the JobSet's condition, copied by the trainer
        return "failed"

    def finish(self, *, succeeded: bool = True) -> None:
        """Every pod exits (0, or 1 for the failed ones); the JobSet and then the TrainJob say so."""
        for pod in self.pods:
            self.kube.end_log(self.namespace, pod)
            self.set_pod_phase(pod, "Succeeded" if succeeded else "Failed")
        if succeeded:
            self.set_jobs_status(succeeded=1)
            self.set_condition("Complete", "AllJobsCompleted", "jobset completed successfully")
        else:
            self.set_jobs_status(failed=1)
            self.set_condition("Failed", "FailedJobs", "jobset failed due to one or more job failures")

    def set_condition(self, ctype: str, reason: str, message: str) -> None:
        conditions = [
            c for c in (self.trainjob().get("status") or {}).get("conditions") or [] if c["type"] != ctype
        ]
        conditions.append({"type": ctype, "status": "True", "reason": reason, "message": message,
                           "lastTransitionTime": now_stamp()})  # fmt: skip
        self.kube.patch(TRAINJOBS, self.namespace, self.name, {"status": {"conditions": conditions}})

    def set_jobs_status(
        self, *, ready: int = 0, active: int = 0, succeeded: int = 0, failed: int = 0
    ) -> None:
        entry = {"name": NODE, "ready": ready, "active": active, "succeeded": succeeded, "failed": failed,
                 "suspended": 0}  # fmt: skip
        self.kube.patch(TRAINJOBS, self.namespace, self.name, {"status": {"jobsStatus": [entry]}})

    def set_pod_phase(self, pod: str, phase: str) -> None:
        exit_code = {"Succeeded": 0, "Failed": 1}.get(phase)
        state = (
            {"running": {"startedAt": now_stamp()}}
            if exit_code is None
            else {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}}
        )
        self.kube.patch(PODS, self.namespace, pod, {"status": {
            "phase": phase, "containerStatuses": [{"name": NODE, "restartCount": 0, "state": state, "lastState": {}}],
        }})  # fmt: skip

    # --- helpers

    def _owner(self) -> dict[str, Any]:
        job = self.trainjob()
        return {"apiVersion": job["apiVersion"], "kind": "TrainJob", "name": self.name,
                "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}  # fmt: skip

    def _create_pods(self, *, running: bool) -> None:
        self.pods = []
        for index in range(self.num_nodes()):
            self._create_pod(index, running=running)

    def _create_pod(self, index: int, *, running: bool) -> None:
        """The pod of completion index `index` (in self.pods at that index)."""
        template = self.pod_template()
        job_name = f"{self.name}-{NODE}-0"
        pod = f"{job_name}-{index}-{next(_suffixes)}"
        labels = {
            **((template.get("metadata") or {}).get("labels") or {}),
            "jobset.sigs.k8s.io/jobset-name": self.name,
            "jobset.sigs.k8s.io/replicatedjob-name": NODE,
            "jobset.sigs.k8s.io/job-index": "0",
            "jobset.sigs.k8s.io/restart-attempt": str(self.restart_attempt),
            "batch.kubernetes.io/job-name": job_name,
            "job-name": job_name,
            "batch.kubernetes.io/job-completion-index": str(index),
        }
        annotations = {
            **((template.get("metadata") or {}).get("annotations") or {}),
            "batch.kubernetes.io/job-completion-index": str(index),
            "jobset.sigs.k8s.io/restart-attempt": str(self.restart_attempt),
        }
        self.kube.put(PODS, self.namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "labels": labels, "annotations": annotations,
                         "ownerReferences": [self.pod_owner]},
            "spec": {**template["spec"], "nodeName": f"gpu-node-{index + 1}" if running else "",
                     "hostname": f"{job_name}-{index}", "subdomain": self.name},
            "status": {"phase": "Pending", "containerStatuses": [
                {"name": NODE, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]},
        })  # fmt: skip
        if running:
            self.set_pod_phase(pod, "Running")
            self.kube.start_log(self.namespace, pod)
        if index < len(self.pods):
            self.pods[index] = pod
        else:
            self.pods.append(pod)


def trainjob_crd(version: str) -> dict:
    """The TrainJob CRD as Trainer `version` serves it, made from the newest one (v2.3) by taking away what
    the older releases lack (pkg/apis/trainer/v1alpha1/trainjob_types.go at v2.1.0 and v2.2.0):
    v2.2 has no terminationGracePeriodSeconds in a runtime patch's pod spec; v2.1 has neither
    activeDeadlineSeconds nor runtimePatches, but podTemplateOverrides."""
    crd = yaml.safe_load(crd_file("trainjobs.trainer.kubeflow.org.yaml").read_text())
    crd = copy.deepcopy(crd)
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]["properties"]
    patch_pod = spec["runtimePatches"]["items"]["properties"]["trainingRuntimeSpec"]["properties"][
        "template"
    ]["properties"]["spec"]["properties"]["replicatedJobs"]["items"]["properties"]["template"]["properties"][
        "spec"
    ]["properties"]["template"]["properties"]["spec"]["properties"]
    assert "terminationGracePeriodSeconds" in patch_pod and "activeDeadlineSeconds" in spec  # v2.3 as read
    if version in ("v2.1", "v2.2"):
        del patch_pod["terminationGracePeriodSeconds"]
    if version == "v2.1":
        del spec["activeDeadlineSeconds"], spec["runtimePatches"]
        spec["podTemplateOverrides"] = {"type": "array", "items": {"type": "object"}}
    return crd
