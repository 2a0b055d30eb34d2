"""Plays Kueue and Volcano for one job on the emulator: the objects they write about a job that waits, as they
write them (nothing of them can run here).

Kueue (kubernetes-sigs/kueue v0.14-v0.19): the job reconciler makes one Workload per job, named
`<kind>-<job name>-<hash>` with the first 5 hex digits of sha1(kind, group, name, uid)
(pkg/controller/jobframework/workload_names.go), labelled `kueue.x-k8s.io/job-uid` (pkg/controller/constants)
and owned by the job; the scheduler sets QuotaReserved=False with the flavor assigner's message while the
quota does not fit (pkg/scheduler/scheduler.go; reason "Pending" in v0.14, "WaitingForQuota" from v0.16;
pkg/scheduler/flavorassigner/flavorassigner.go: "couldn't assign flavors to pod set ...: insufficient unused
quota for ..."), then QuotaReserved=True and Admitted=True with status.admission.clusterQueue. A LocalQueue
counts its waiting workloads in status.pendingWorkloads (apis/kueue/v1beta2/localqueue_types.go).

Volcano (volcano-sh/volcano): a job's PodGroup is named like the job (the v1 operator's
pkg/controller.v1/common/scheduling.go, Trainer v2's pkg/runtime/framework/plugins/volcano); while the gang
does not fit, status.phase is Pending or Inqueue and the condition Unschedulable=True, reason
NotEnoughResources, says "N/M tasks in gang unschedulable: ..." (pkg/scheduler/cache/cache.go
RecordJobStatusEvent, pkg/scheduler/framework/job_updater.go).
"""

from __future__ import annotations

import hashlib
from typing import Any

from tests.fakes.emulator import PODGROUPS, localqueues, now_stamp, workloads
from tests.fakes.kube import Kube

KIND_GROUPS = {"PyTorchJob": "kubeflow.org", "TrainJob": "trainer.kubeflow.org"}


def workload_name(kind: str, name: str, uid: str) -> str:
    digest = hashlib.sha1("\n".join((kind, KIND_GROUPS[kind], name, uid)).encode()).hexdigest()
    return f"{kind.lower()}-{name}-{digest[:5]}"


class Kueue:
    def __init__(self, kube: Kube, namespace: str, version: str = "v1beta2") -> None:
        self.kube, self.namespace, self.version = kube, namespace, version

    def local_queue(self, name: str, *, pending: int) -> None:
        self.kube.put(localqueues(self.version), self.namespace, {
            "apiVersion": f"kueue.x-k8s.io/{self.version}", "kind": "LocalQueue",
            "metadata": {"name": name}, "spec": {"clusterQueue": "cluster-queue"},
            "status": {"pendingWorkloads": pending, "reservingWorkloads": 0, "admittedWorkloads": 0},
        })  # fmt: skip

    def queue(self, job: dict[str, Any], *, pod_sets: dict[str, int], message: str) -> str:
        """The Workload of `job`, waiting for quota with the scheduler's `message`; returns its name."""
        kind, meta = job["kind"], job["metadata"]
        name = workload_name(kind, meta["name"], meta["uid"])
        reason = "Pending" if self.version == "v1beta1" else "WaitingForQuota"
        self.kube.put(workloads(self.version), self.namespace, {
            "apiVersion": f"kueue.x-k8s.io/{self.version}", "kind": "Workload",
            "metadata": {
                "name": name, "labels": {"kueue.x-k8s.io/job-uid": meta["uid"]},
                "ownerReferences": [{"apiVersion": job["apiVersion"], "kind": kind, "name": meta["name"],
                                     "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": {"queueName": meta["labels"]["kueue.x-k8s.io/queue-name"],
                     "podSets": [{"name": n, "count": c} for n, c in pod_sets.items()]},
            "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": reason,
                                       "message": message, "lastTransitionTime": now_stamp()}]},
        })  # fmt: skip
        return name

    def admit(self, workload: str) -> None:
        conditions = [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
             "message": "Quota reserved in ClusterQueue cluster-queue", "lastTransitionTime": now_stamp()},
            {"type": "Admitted", "status": "True", "reason": "Admitted",
             "message": "The workload is admitted", "lastTransitionTime": now_stamp()},
        ]  # fmt: skip
        self.kube.patch(workloads(self.version), self.namespace, workload, {
            "status": {"conditions": conditions, "admission": {"clusterQueue": "cluster-queue"}},
        })  # fmt: skip


def volcano_podgroup(kube: Kube, namespace: str, job_name: str, *, members: int, pending: int) -> None:
    """The PodGroup of a gang that does not fit yet."""
    message = (
        f"{pending}/{members} tasks in gang unschedulable: pod group is not ready, "
        f"{pending} Pending, {members} minAvailable"
    )
    kube.put(PODGROUPS, namespace, {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": job_name}, "spec": {"minMember": members, "queue": "research"},
        "status": {"phase": "Inqueue", "conditions": [
            {"type": "Unschedulable", "status": "True", "reason": "NotEnoughResources", "message": message,
             "lastTransitionTime": now_stamp()}]},
    })  # fmt: skip
