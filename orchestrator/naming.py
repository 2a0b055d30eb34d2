"""Names orch writes into Kubernetes objects and reads back: labels, container/port names, object names.

Rendering (orchestrator/rendering/) writes these; the reading side (cluster/, kube/read.py, status.py, the
API modules' readers) selects and reads with the same constants, so a rename happens in one place. What one
job API alone names (its controller's labels, its container) lives in that API's module (orchestrator/apis/).
The name rules are here too: the job file's `name:`/`namespace:` and every name a command or
`orchestrator.api` is given (`job_name_problem`, `namespace_problem`) obey the same ones. Imports nothing of
orch.
"""

from __future__ import annotations

import re

# --- Labels orch puts on every object it renders (the PyTorchJob, its pod templates, ConfigMap, PodMonitor).
LABEL_JOB = "orch.dev/job"  # value: the job name; selects one job's objects and pods
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "orch"  # LABEL_MANAGED_BY value: `orch list` selects orch's jobs with MANAGED_SELECTOR
LABEL_NAME = "app.kubernetes.io/name"  # value: the job name
LABEL_INSTANCE = "app.kubernetes.io/instance"  # value: the job name
LABEL_COMPONENT = "app.kubernetes.io/component"
COMPONENT_TRAINING = "training"  # LABEL_COMPONENT value of the job and its pods
COMPONENT_CONFIG = "config"  # ... of the ConfigMap
COMPONENT_MONITORING = "monitoring"  # ... of the PodMonitor
COMPONENT_RUNTIME = "runtime"  # ... of the TrainingRuntime orch renders for a TrainJob

MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"

# --- Labels of a cluster sweep's trials (`orch sweep --cluster`), on every object of a trial's job: the sweep
# finds its trials' jobs again by them after a restart (`orch list -l orch.dev/sweep=NAME` lists them).
LABEL_SWEEP = "orch.dev/sweep"  # value: the sweep's name (its study's)
LABEL_TRIAL = "orch.dev/trial"  # value: the trial's number in the study

# Kueue admits a job into the LocalQueue named by this label (on the PyTorchJob itself).
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
# Kueue's WorkloadPriorityClass of a queued job (label on the job object).
LABEL_KUEUE_JOB_UID = "kueue.x-k8s.io/job-uid"  # on the Workload Kueue makes for a job (its uid)
LABEL_KUEUE_PRIORITY = "kueue.x-k8s.io/priority-class"
# Kueue topology-aware scheduling: annotations on pod templates naming the node label of a topology level.
ANNOTATION_KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
ANNOTATION_KUEUE_PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
ANNOTATION_KUEUE_PODSET_GROUP = "kueue.x-k8s.io/podset-group-name"  # PodSets placed in one domain together
# Volcano: the queue of a TrainJob's PodGroup (Trainer v2's volcano plugin reads it from the JobSet template).
ANNOTATION_VOLCANO_QUEUE = "scheduling.volcano.sh/queue-name"
# scheduling.scheduler values that gang-schedule a PodGroup: Volcano, and the scheduler-plugins chart's
# second scheduler (coscheduling plugin).
SCHEDULER_VOLCANO = "volcano"
SCHEDULER_COSCHEDULING = "scheduler-plugins-scheduler"
# The node label the kubelet sets to the node's host name: scheduling.exclude_nodes keeps pods off these.
LABEL_HOSTNAME = "kubernetes.io/hostname"
# The Prometheus operator's Prometheus selects PodMonitors by this label (kube-prometheus-stack: the Helm release).
LABEL_PROMETHEUS_RELEASE = "release"

# --- Annotations orch puts on what it submits.
ANNOTATION_SUBMISSION = "orch.dev/submission"  # one random id per `orch submit`: recognises its own objects
# JSON {"mlflow": {tracking_uri, experiment, run_name}, "tensorboard": dir}; `orch status` shows it
ANNOTATION_TRACKING = "orch.dev/tracking"
ANNOTATION_OUTPUT_URL = (
    "orch.dev/output-url"  # output.url: where the run keeps its checkpoints; orch status shows it
)

# --- GPUs: the device plugin's resource and GPU feature discovery's node label (read-only for orch).
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # e.g. NVIDIA-H100-80GB-HBM3

# --- Containers, ports, paths inside the pods.
METRICS_PORT_NAME = "metrics"  # the PodMonitor scrapes this named port
CONFIG_DIR = "/etc/orch"  # the ConfigMap is mounted here, read-only
TRAIN_CONFIG_KEY = "train.json"
TRAIN_CONFIG_PATH = f"{CONFIG_DIR}/{TRAIN_CONFIG_KEY}"
OUTPUT_DIR = "/orch/output"  # ORCH_OUTPUT_DIR in pods (an emptyDir: survives container restarts)


# --- Kubernetes name rules (apimachinery's validation.go). Every pattern is applied with re.fullmatch (Python's
# `$` would also match before a final newline, so `name: "digits\n"` would pass); they carry no anchors. Their
# classes are ASCII only: a look-alike letter (Cyrillic "е") is not [a-z].
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_JOB_NAME_LENGTH = 50  # pods are named <name>-worker-<index>, services too; 63 is the label limit
MAX_LABEL_LENGTH = 63  # a DNS-1123 label (a namespace)
JOB_NAME_RULE = (
    f"a DNS-1035 label of at most {MAX_JOB_NAME_LENGTH} characters (lowercase letters, digits and '-', "
    "starting with a letter)"
)
NAMESPACE_RULE = (
    f"a DNS-1123 label of at most {MAX_LABEL_LENGTH} characters (lowercase letters, digits and '-')"
)


def job_name_problem(value: str) -> str | None:
    """What is wrong with `value` as a job name (the job file's `name:` rule), or None. A job name goes into
    request paths, selectors and PromQL as it is: nothing but this rule lets one through."""
    return _problem(value, DNS1035_LABEL, MAX_JOB_NAME_LENGTH, "job name", JOB_NAME_RULE)


def namespace_problem(value: str) -> str | None:
    """What is wrong with `value` as a namespace (a DNS-1123 label, as the API server requires), or None."""
    return _problem(value, DNS1123_LABEL, MAX_LABEL_LENGTH, "namespace", NAMESPACE_RULE)


def _problem(value: str, pattern: re.Pattern[str], limit: int, what: str, rule: str) -> str | None:
    # ascii(): a look-alike or control character shows as its escape, so the user sees what is wrong
    shown = ascii(value) if len(value) <= 60 else f"{ascii(value[:50])}... ({len(value)} characters)"
    if not value:
        return f"an empty {what}; it must be {rule}"
    if len(value) > limit or not pattern.fullmatch(value):
        return f"{shown} is not a valid {what}: it must be {rule}"
    return None


def config_map_name(job_name: str) -> str:
    """The ConfigMap holding a job's `train` section."""
    return f"{job_name}-config"


def job_selector(job_name: str) -> str:
    """Label selector for everything orch rendered for one job (its pods included)."""
    return f"{LABEL_JOB}={job_name}"


def standard_labels(job_name: str, component: str) -> dict[str, str]:
    """The labels orch puts on each object of a job; user labels never override these."""
    return {
        LABEL_NAME: job_name,
        LABEL_INSTANCE: job_name,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_JOB: job_name,
    }
