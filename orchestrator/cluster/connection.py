"""Which cluster and namespace orch talks to, chosen like kubectl does, and the `Cluster` for it.

`--kubeconfig`, else `$KUBECONFIG` (several files, merged; missing ones skipped), else `~/.kube/config`, else
the in-cluster service account; `--context` picks a context; the namespace is `-n`, else the job's
`namespace`, else the context's namespace, else `default`.

A kubeconfig is user input: each file is parsed and checked first (kubeconfig.py: YAML errors and wrong
shapes become one `kubeconfig FILE:LINE:COL: field: what is wrong` line, exit 2) before the client reads it,
and whatever the client's loader still throws is reported the same way here. A credential plugin (`user.exec`) that fails stops
the command with its message; the client would only log it and send the requests without credentials.
The kubeconfig's credentials are handed to `Cluster` as `secrets`, so no message can print them.

Two transports (rest.py): `connect(..., lean=True)` (the follow commands: status, list, logs, wait, delete)
sends through urllib3 directly when the context's user is a bearer token (`token`, `tokenFile`) or a client
certificate (files or `-data`) and its cluster names only a server, its CA (file or data),
`insecure-skip-tls-verify` and `tls-server-name`: the kubernetes package (~0.7 CPU-s to import) is not
loaded. Anything else (credential plugins, auth providers, `proxy-url`, basic auth, impersonation, the
in-cluster service account) and every other command go through the official client, as before.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from orchestrator import naming
from orchestrator.cluster.client import Cluster
from orchestrator.cluster.errors import KubeconfigError
from orchestrator.cluster.kubeconfig import Kubeconfig, TLSSetupError, kubeconfig_path, tls_options
from orchestrator.cluster.session import DEFAULT_NAMESPACE
from orchestrator.redaction import redact_url, scrub

if TYPE_CHECKING:
    from orchestrator.cluster.rest import LeanTransport

IN_CLUSTER_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class Target:
    """Which cluster and namespace to talk to, as the user chose them (kubectl's flags)."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    request_timeout: float | None = None  # seconds; None: $ORCH_REQUEST_TIMEOUT or the default


CONNECTION_POOL = 128


def connect(target: Target, *, job_namespace: str | None = None, lean: bool = False) -> Cluster:
    """A `Cluster` for `target`: kubeconfig like kubectl, namespace -n > job's > context's > default.

    `lean`: send through urllib3 directly when the kubeconfig's user and cluster are of the common forms
    (`lean_transport`), without importing the `kubernetes` package (~0.7 CPU-s); anything else, and without
    `lean`, through the official client (docs/decisions.md: the follow commands ask for it, submit does not)."""
    path = kubeconfig_path(target.kubeconfig)
    if path is None:
        if target.context:
            raise KubeconfigError(f"--context {target.context} needs a kubeconfig, and none was found")
        return _official(target, job_namespace, None, None)
    kubeconfig = Kubeconfig.read(path)
    context_name = target.context or kubeconfig.current_context
    context = kubeconfig.context(context_name, explicit=target.context is not None)
    kubeconfig.check_server(context_name)
    kubeconfig.check_tls(context_name)
    if kubeconfig.clusters[str(context.get("cluster"))].get("insecure-skip-tls-verify") is True:
        # As kubectl, silent about what the kubeconfig asked for: urllib3 would print two lines (with a file
        # path) for each place a request is made from.
        import warnings

        import urllib3

        warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)
    transport = lean_transport(kubeconfig, context_name or "") if lean else None
    if transport is None:
        _check_tls_material(kubeconfig, context_name or "")
        return _official(target, job_namespace, kubeconfig, context_name)
    secrets = [*kubeconfig.secrets(), *([transport.token] if transport.token else [])]
    return _cluster(
        target, job_namespace, transport, f"context {context_name}", context.get("namespace"), secrets
    )


def _cluster(
    target: Target,
    job_namespace: str | None,
    transport: Any,
    where: str,
    context_namespace: str | None,
    secrets: list[str],
) -> Cluster:
    namespace = _checked_namespace(target, job_namespace, context_namespace, where)
    flags = (*(("--kubeconfig", target.kubeconfig) if target.kubeconfig else ()),
             *(("--context", target.context) if target.context else ()))  # fmt: skip
    return Cluster(
        transport,
        namespace,
        server=f"{redact_url(transport.host)} ({where})",
        request_timeout=target.request_timeout,
        secrets=secrets,
        kubectl_flags=flags,
    )


def _official(
    target: Target, job_namespace: str | None, kubeconfig: Kubeconfig | None, context_name: str | None
) -> Cluster:
    """Through the official client: its kubeconfig loader (credential plugins, auth providers, proxies) or
    the in-cluster service account."""
    from kubernetes import client, config

    from orchestrator.cluster.rest import OfficialTransport

    configuration = client.Configuration()
    # Connections kept for reuse: the client's default (5 per CPU) is below what `orch logs -f` holds open
    # (its streams + 2 watches); each one over it would be closed with a warning on stderr.
    configuration.connection_pool_maxsize = CONNECTION_POOL
    secrets: list[str] = []
    if kubeconfig is None:
        try:
            # kubernetes' config loaders are untyped
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException as e:
            raise KubeconfigError(
                "no kubeconfig found (looked at --kubeconfig, $KUBECONFIG, ~/.kube/config) "
                "and not running inside a cluster"
            ) from e
        context_namespace = _read_file(IN_CLUSTER_NAMESPACE_FILE)
        where = "in-cluster service account"
    else:
        path = kubeconfig.path
        context = kubeconfig.contexts[context_name or ""]
        context_namespace = context.get("namespace")
        user = kubeconfig.user(context.get("user"))
        secrets = kubeconfig.secrets()
        errors = _LoggedErrors()
        try:
            with errors.captured():
                config.load_kube_config(  # type: ignore[no-untyped-call]  # untyped, as above
                    config_file=path,
                    context=target.context,
                    client_configuration=configuration,
                    persist_config=False,
                )
        except Exception as e:  # the client's loader of user input raises anything; say it in one line
            raise KubeconfigError(
                scrub(f"kubeconfig {path}: context {context_name}: cannot use it: {e}", secrets)
            ) from e
        if errors.messages:  # e.g. the exec plugin failed: the client would go on without credentials
            raise KubeconfigError(scrub(_credentials_message(path, context, user, errors.messages), secrets))
        where = f"context {context_name}"
    # orch retries itself (with backoff and a clear final message); urllib3's silent retries would stack.
    # No redirect is followed (rest.py says why): urllib3 hands the 3xx back instead.
    import urllib3

    configuration.retries = urllib3.Retry(total=0, redirect=False)
    secrets += _configuration_secrets(configuration)
    transport = OfficialTransport(client.ApiClient(configuration))
    return _cluster(target, job_namespace, transport, where, context_namespace, secrets)


# --- the lean transport ------------------------------------------------------------------------------------

# What a kubeconfig may hold for the lean transport to serve it; anything else (an exec plugin, an auth
# provider, a proxy-url, basic auth, impersonation, a field added later) goes through the official client.
LEAN_USER_KEYS = frozenset(
    {"token", "tokenFile", "client-certificate", "client-certificate-data", "client-key", "client-key-data"}
)
LEAN_CLUSTER_KEYS = frozenset(
    {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify",
     "tls-server-name", "extensions"}
)  # fmt: skip
LEAN_CONTEXT_KEYS = frozenset({"cluster", "user", "namespace", "extensions"})


def lean_transport(kubeconfig: Kubeconfig, context_name: str) -> LeanTransport | None:
    """A urllib3 transport for the context, when its user and cluster hold only what the lean transport
    serves (LEAN_*_KEYS, as strings, with the official client's precedence: `token` over `tokenFile`, `-data`
    over the file); None otherwise (the caller falls back to the official client). Relative file names are
    relative to the kubeconfig file that defined the entry, as kubectl reads them."""
    import urllib3

    from orchestrator.cluster.rest import LeanTransport

    context = kubeconfig.contexts[context_name]
    cluster_name, user_name = str(context.get("cluster")), context.get("user") or ""
    cluster = kubeconfig.clusters[cluster_name]
    user = kubeconfig.users.get(user_name, {})
    strings = {
        k: v for k, v in {**cluster, **user}.items() if k not in ("insecure-skip-tls-verify", "extensions")
    }
    if (
        set(context) - LEAN_CONTEXT_KEYS
        or set(cluster) - LEAN_CLUSTER_KEYS
        or set(user) - LEAN_USER_KEYS
        or not all(isinstance(v, str) for v in strings.values())
        or not isinstance(cluster.get("insecure-skip-tls-verify", False), bool)
        or any(k.startswith("client-certificate") for k in user)
        != any(k.startswith("client-key") for k in user)
    ):
        return None

    def fail(problem: str) -> NoReturn:
        raise KubeconfigError(
            scrub(f"kubeconfig {kubeconfig.path}: context {context_name}: cannot use it: {problem}",
                  kubeconfig.secrets())
        )  # fmt: skip

    token = user.get("token") or None
    if token is None and user.get("tokenFile"):
        try:
            with open(kubeconfig.file("users", user_name, "tokenFile"), encoding="utf-8") as f:
                token = f.read().strip() or None
        except OSError as e:
            fail(f"users.{user_name}.tokenFile: {e.strerror}: {user['tokenFile']}")
        except UnicodeDecodeError:
            fail(f"users.{user_name}.tokenFile: {user['tokenFile']} is not text")
    host = str(cluster["server"]).rstrip("/")
    pool_options: dict[str, Any] = {}
    if host.startswith("https"):
        try:
            pool_options = tls_options(kubeconfig, cluster_name, user_name)
        except TLSSetupError as e:
            fail(str(e))
    # orch retries itself (with backoff and a clear final message); urllib3's silent retries would stack.
    pool = urllib3.PoolManager(num_pools=4, maxsize=CONNECTION_POOL, retries=0, **pool_options)
    return LeanTransport(host, pool, token=token)


def _check_tls_material(kubeconfig: Kubeconfig, context_name: str) -> None:
    """The TLS material the official client will load, loaded here first: a CA or a key that does not load
    is then the same one line (naming the field) from every command, before anything is sent."""
    context = kubeconfig.contexts[context_name]
    cluster_name = str(context.get("cluster"))
    if not str(kubeconfig.clusters[cluster_name].get("server")).startswith("https"):
        return
    try:
        tls_options(kubeconfig, cluster_name, context.get("user") or "")
    except TLSSetupError as e:
        raise KubeconfigError(
            scrub(
                f"kubeconfig {kubeconfig.path}: context {context_name}: cannot use it: {e}",
                kubeconfig.secrets(),
            )
        ) from None


def resolve_namespace(target: Target, *, job_namespace: str | None = None) -> str:
    """The namespace `connect` would use, without contacting the cluster (for `--dry-run=client`)."""
    if target.namespace or job_namespace:
        return _checked_namespace(target, job_namespace, None, "")
    path = kubeconfig_path(target.kubeconfig)
    if path is None:
        in_cluster = _read_file(IN_CLUSTER_NAMESPACE_FILE)
        return _checked_namespace(target, None, in_cluster, "in-cluster service account")
    kubeconfig = Kubeconfig.read(path)
    name = target.context or kubeconfig.current_context
    context = kubeconfig.context(name, explicit=target.context is not None)
    return _checked_namespace(target, None, context.get("namespace"), f"context {name}")


def _checked_namespace(target: Target, job_namespace: str | None, context_namespace: Any, where: str) -> str:
    """-n > the job's > the context's > default, which must be a valid namespace (it goes into every request
    path): a bad one, wherever it came from, is refused before anything is sent."""
    namespace = target.namespace or job_namespace or context_namespace or DEFAULT_NAMESPACE
    problem = naming.namespace_problem(namespace) if isinstance(namespace, str) else "not a string"
    if problem is None:
        return str(namespace)
    if target.namespace or job_namespace:
        raise KubeconfigError(f"namespace: {problem}")
    raise KubeconfigError(f"{where}: namespace: {problem}; pass -n NAMESPACE, or fix the {where}")


class _LoggedErrors(logging.Handler):
    """Collects what the kubernetes client logs at ERROR while loading a kubeconfig (it logs, not raises,
    when a credential plugin fails) and keeps it off stderr."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def captured(self) -> Any:
        @contextlib.contextmanager
        def scope() -> Iterator[None]:
            root = logging.getLogger()
            root.addHandler(self)
            try:
                yield
            finally:
                root.removeHandler(self)

        return scope()


def _credentials_message(
    path: str, context: dict[str, Any], user: tuple[str, dict[str, Any]], logged: list[str]
) -> str:
    name, body = user
    said = " ".join(" ".join(m.split()) for m in logged)
    plugin = body.get("exec")
    if isinstance(plugin, dict):
        return f"the credential plugin of kubeconfig user {name} ({plugin.get('command')}) failed: {said}"
    return f"kubeconfig {path}: the credentials of user {name} could not be loaded: {said}"


def _configuration_secrets(configuration: Any) -> list[str]:
    """Credentials the client holds (tokens from plugins included), bare and with their prefixes."""
    found = [str(configuration.password or "")]
    for value in (configuration.api_key or {}).values():
        found += [str(value), str(value).partition(" ")[2]]
    return [s for s in found if len(s) >= 4]


def _read_file(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None
