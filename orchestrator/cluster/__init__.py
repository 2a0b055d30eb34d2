"""Everything orch says to a Kubernetes cluster, through the official `kubernetes` client.

This package is the only code that imports `kubernetes`, and only inside functions: importing it costs
~0.7 CPU-s, which `orch --help` and `orch render` must not pay, nor do the follow commands (status, list,
logs, wait, delete) for a token or client-certificate kubeconfig: they send through urllib3 directly
(`rest.LeanTransport`, chosen by `connection`). The transport is injectable (`Cluster(transport or
api_client, ...)`), so tests point it at an API emulator over real HTTP.

- `errors`: the `ClusterError` family every failed request becomes.
  (What each job API reads from its objects is in orchestrator/apis/; the kinds in orchestrator/kube/kinds.py.)
- `client`: `Cluster`, one namespace of one cluster; one method = one request (the verbs).
- `session`: how one request is made: the deadline, bounded retries, the answer read and checked.
- `failures`: what a failed request was (retry it?) and the `ClusterError` it becomes, in one line.
- `rest`: the API's paths, sent through one of two transports (the official `ApiClient`, or urllib3).
- `connection`: `Target` and `connect`: kubeconfig, context and namespace chosen like kubectl; the transport.
- `kubeconfig`: the kubeconfig files found, parsed, merged and checked; their TLS material loaded.
- `objects`: submit (the job, then what it owns; all or nothing), prepare, roll back.
- `jobs`: find a job on whichever API has it; status, list, wait, delete.
- `logs`: every pod's log, once or followed (`LogFollower`).
- `probes`: read-only facts for `orch doctor --cluster`.

The names below are the package's public interface (what the commands use).
"""

from __future__ import annotations

from orchestrator.cluster.client import Cluster
from orchestrator.cluster.connection import Target, connect, resolve_namespace
from orchestrator.cluster.errors import (
    AlreadyExists,
    ClusterError,
    ClusterUnreachable,
    Forbidden,
    Interrupted,
    KubeconfigError,
    NotFound,
    OperatorNotInstalled,
    Unauthorized,
)
from orchestrator.cluster.jobs import (
    Job,
    delete_job,
    job_pods,
    job_status,
    list_jobs,
    locate,
    suspected_nodes,
    wait_for,
)
from orchestrator.cluster.logs import LogFollower, stream_logs
from orchestrator.cluster.objects import (
    Submission,
    choose_api,
    preflight,
    prepare,
    signals_interrupt,
    submit,
    submittable,
)
from orchestrator.cluster.session import poll_seconds
from orchestrator.kube.kinds import Resource

__all__ = [
    "AlreadyExists",
    "Cluster",
    "ClusterError",
    "ClusterUnreachable",
    "choose_api",
    "Forbidden",
    "Interrupted",
    "Job",
    "KubeconfigError",
    "LogFollower",
    "NotFound",
    "OperatorNotInstalled",
    "Resource",
    "Submission",
    "Target",
    "Unauthorized",
    "connect",
    "delete_job",
    "job_pods",
    "job_status",
    "list_jobs",
    "locate",
    "poll_seconds",
    "preflight",
    "prepare",
    "submittable",
    "suspected_nodes",
    "resolve_namespace",
    "signals_interrupt",
    "stream_logs",
    "submit",
    "wait_for",
]
