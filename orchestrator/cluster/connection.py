"""Which cluster and namespace orch talks to, chosen like kubectl does, and the `Cluster` for it.

`--kubeconfig`, else `$KUBECONFIG` (several files, merged; missing ones skipped), else `~/.kube/config`, else
the in-cluster service account; `--context` picks a context; the namespace is `-n`, else the job's
`namespace`, else the context's namespace, else `default`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import cast

from orchestrator.cluster.client import DEFAULT_NAMESPACE, Cluster
from orchestrator.cluster.errors import KubeconfigError

IN_CLUSTER_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class Target:
    """Which cluster and namespace to talk to, as the user chose them (kubectl's flags)."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None


def connect(target: Target, *, job_namespace: str | None = None) -> Cluster:
    """A `Cluster` for `target`: kubeconfig like kubectl, namespace -n > job's > context's > default."""
    from kubernetes import client, config

    path = _kubeconfig_path(target.kubeconfig)
    configuration = client.Configuration()
    if path is None:
        if target.context:
            raise KubeconfigError(f"--context {target.context} needs a kubeconfig, and none was found")
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as e:
            raise KubeconfigError(
                "no kubeconfig found (looked at --kubeconfig, $KUBECONFIG, ~/.kube/config) "
                "and not running inside a cluster"
            ) from e
        context_namespace = _read_file(IN_CLUSTER_NAMESPACE_FILE)
        where = "in-cluster service account"
    else:
        context_namespace, context_name = _context_namespace(path, target.context)
        try:
            config.load_kube_config(
                config_file=path,
                context=target.context,
                client_configuration=configuration,
                persist_config=False,
            )
        except (config.ConfigException, OSError, ValueError) as e:
            raise KubeconfigError(f"cannot use kubeconfig {path} (context {context_name}): {e}") from e
        where = f"context {context_name}"
    # orch retries itself (with backoff and a clear final message); urllib3's silent retries would stack.
    configuration.retries = 0
    namespace = target.namespace or job_namespace or context_namespace or DEFAULT_NAMESPACE
    return Cluster(client.ApiClient(configuration), namespace, server=f"{configuration.host} ({where})")


def resolve_namespace(target: Target, *, job_namespace: str | None = None) -> str:
    """The namespace `connect` would use, without contacting the cluster (for `--dry-run=client`)."""
    if target.namespace or job_namespace:
        return target.namespace or job_namespace or DEFAULT_NAMESPACE
    path = _kubeconfig_path(target.kubeconfig)
    if path is None:
        return _read_file(IN_CLUSTER_NAMESPACE_FILE) or DEFAULT_NAMESPACE
    return _context_namespace(path, target.context)[0] or DEFAULT_NAMESPACE


def _kubeconfig_path(explicit: str | None) -> str | None:
    """kubectl's order. $KUBECONFIG may list several files (merged); missing ones are skipped."""
    if explicit:
        if not os.path.exists(os.path.expanduser(explicit)):
            raise KubeconfigError(f"kubeconfig {explicit} does not exist")
        return os.path.expanduser(explicit)
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    existing = [os.path.expanduser(p) for p in listed if os.path.exists(os.path.expanduser(p))]
    if existing:
        return os.pathsep.join(existing)
    if listed:
        raise KubeconfigError(f"none of the files in $KUBECONFIG exist: {os.environ['KUBECONFIG']}")
    default = os.path.expanduser("~/.kube/config")
    return default if os.path.exists(default) else None


def _context_namespace(path: str, context: str | None) -> tuple[str | None, str]:
    from kubernetes import config

    try:
        contexts, current = config.list_kube_config_contexts(path)
    except (config.ConfigException, OSError, ValueError) as e:
        raise KubeconfigError(f"cannot read kubeconfig {path}: {e}") from e
    by_name = {c["name"]: c for c in contexts or []}
    name = context or (current or {}).get("name")
    if name not in by_name:
        available = ", ".join(sorted(by_name)) or "none"
        which = f"context {name!r} is" if context else "no current-context is"
        raise KubeconfigError(
            f"{which} not in kubeconfig {path} (contexts: {available}); pick one with --context"
        )
    return (by_name[name].get("context") or {}).get("namespace"), cast(str, name)  # a key of by_name


def _read_file(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None
