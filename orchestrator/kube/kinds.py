"""The Kubernetes resources orch reads and writes, named once (group, version, plural, kind)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core API
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def ref(self, name: str) -> str:
        """kubectl's name for one object of this kind: pytorchjob.kubeflow.org/demo, configmap/demo-config."""
        return f"{self.kind.lower()}{'.' + self.group if self.group else ''}/{name}"

    def __str__(self) -> str:  # how kubectl and RBAC name it: pytorchjobs.kubeflow.org, configmaps
        return f"{self.plural}.{self.group}" if self.group else self.plural


CONFIGMAP = Resource("", "v1", "configmaps", "ConfigMap")
POD = Resource("", "v1", "pods", "Pod")
POD_LOG = Resource("", "v1", "pods/log", "Pod")
EVENT = Resource("", "v1", "events", "Event")
NODE = Resource("", "v1", "nodes", "Node")
VERSION = Resource("", "", "version", "Version")
JOBSET = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")  # what Kubeflow Trainer v2 runs on
KUEUE_GROUP = "kueue.x-k8s.io"
# Why a queued job waits: its Workload (Kueue v0.16+ serves v1beta2, v0.14-v0.15 v1beta1 only), and its
# LocalQueue's pending count. Newest first: orch reads the first version the cluster serves.
KUEUE_WORKLOADS = tuple(Resource(KUEUE_GROUP, v, "workloads", "Workload") for v in ("v1beta2", "v1beta1"))
KUEUE_LOCAL_QUEUES = tuple(
    Resource(KUEUE_GROUP, v, "localqueues", "LocalQueue") for v in ("v1beta2", "v1beta1")
)
VOLCANO_PODGROUP = Resource("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup")
PODMONITOR = Resource("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor")
SELF_SUBJECT_ACCESS_REVIEW = Resource(
    "authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview"
)
CRD = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition")
