"""Kubeconfig files as kubectl reads them: found (`kubeconfig_path`), parsed and merged (`Kubeconfig.read`),
checked (the shape orch and the client read, the server, the TLS fields kubectl refuses), and their TLS
material loaded (`tls_options`). connection.py chooses the cluster and the transport from what is read here.

A kubeconfig is user input: each file is parsed here first (YAML errors and wrong shapes become one
`kubeconfig FILE:LINE:COL: field: what is wrong` line, exit 2), and nothing of its text is echoed in an error
(a line may hold a token). The users' credentials are collected (`Kubeconfig.secrets`) so that no message
can print them.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, NoReturn

from orchestrator.cluster.errors import KubeconfigError
from orchestrator.job.yaml_positions import positions
from orchestrator.redaction import redact_url


def kubeconfig_path(explicit: str | None) -> str | None:
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


# Fields of a kubeconfig user that hold credentials (client-go's AuthInfo, and the auth-provider config).
SECRET_KEYS = frozenset(
    {"token", "password", "client-key-data", "access-token", "refresh-token", "id-token", "client-secret"}
)


@dataclass
class Kubeconfig:
    """The parts of one or more kubeconfig files orch reads, merged like kubectl (the first file wins)."""

    path: str
    contexts: dict[str, dict[str, Any]] = field(default_factory=dict)
    users: dict[str, dict[str, Any]] = field(default_factory=dict)
    clusters: dict[str, dict[str, Any]] = field(default_factory=dict)
    current_context: str | None = None
    raw_users: list[Any] = field(default_factory=list)
    origins: dict[tuple[str, str], str] = field(default_factory=dict)  # (section, name): the file defining it

    @classmethod
    def read(cls, path: str) -> Kubeconfig:
        merged = cls(path)
        for file in path.split(os.pathsep):
            data, positions = _parse(file)
            _check_shape(file, data, positions)
            for item in data.get("contexts") or []:
                merged.contexts.setdefault(item["name"], item.get("context") or {})
            for item in data.get("clusters") or []:
                merged.clusters.setdefault(item["name"], item.get("cluster") or {})
                merged.origins.setdefault(("clusters", item["name"]), file)
            for item in data.get("users") or []:
                merged.users.setdefault(item["name"], item.get("user") or {})
                merged.origins.setdefault(("users", item["name"]), file)
                merged.raw_users.append(item.get("user"))
            if merged.current_context is None:
                merged.current_context = data.get("current-context") or None
        return merged

    def context(self, name: str | None, *, explicit: bool) -> dict[str, Any]:
        if name not in self.contexts:
            available = ", ".join(sorted(self.contexts)) or "none"
            which = f"context {name!r} is" if explicit else "no current-context is"
            raise KubeconfigError(
                f"{which} not in kubeconfig {self.path} (contexts: {available}); pick one with --context"
            )
        return self.contexts[name]

    def check_server(self, name: str | None) -> None:
        """The context's cluster must exist and name a server (else the client would send to "")."""
        cluster = self.contexts[name or ""].get("cluster")
        if cluster not in self.clusters:
            raise KubeconfigError(
                f"kubeconfig {self.path}: context {name}: its cluster {cluster!r} is not defined"
            )
        server = self.clusters[cluster].get("server")
        if not server:
            raise KubeconfigError(f"kubeconfig {self.path}: context {name}: cluster {cluster} has no server")
        if problem := _server_problem(str(server)):
            shown = "" if problem == "is not a URL" else f"{redact_url(str(server))} "
            raise KubeconfigError(
                f"kubeconfig {self.path}: context {name}: clusters.{cluster}.server: {shown}{problem} "
                "(e.g. https://10.0.0.1:6443)"
            )

    def check_tls(self, name: str | None) -> None:
        """What kubectl refuses in the TLS fields of the context's cluster and user is refused here too, by
        every command, before anything is sent (client-go: clientcmd/validation.go's validateClusterInfo and
        validateAuthInfo; transport.TLSConfigFor for insecure with a CA): a field given both as a file and as
        `-data`, a file that cannot be read, `insecure-skip-tls-verify` beside a certificate-authority."""
        context = self.contexts[name or ""]
        cluster_name, user_name = str(context.get("cluster")), context.get("user") or ""
        cluster, user = self.clusters[cluster_name], self.users.get(user_name, {})
        where = f"kubeconfig {self.path}: context {name}"

        def given(entry: dict[str, Any], key: str) -> bool:
            return isinstance(entry.get(key), str) and entry[key] != ""

        if cluster.get("insecure-skip-tls-verify") is True and (
            given(cluster, "certificate-authority") or given(cluster, "certificate-authority-data")
        ):
            raise KubeconfigError(
                f"{where}: clusters.{cluster_name}: insecure-skip-tls-verify beside a certificate-authority: "
                "one says verify the server with it, the other do not verify (kubectl refuses the pair too); "
                "remove one"
            )
        for section, entry_name, entry, key in (
            ("clusters", cluster_name, cluster, "certificate-authority"),
            ("users", user_name, user, "client-certificate"),
            ("users", user_name, user, "client-key"),
        ):
            if given(entry, key) and given(entry, f"{key}-data"):
                raise KubeconfigError(
                    f"{where}: {section}.{entry_name}: both {key} and {key}-data are set (kubectl refuses "
                    "that too); keep one"
                )
            if given(entry, key):
                path = self.file(section, entry_name, key)
                try:
                    with open(path, "rb"):
                        pass
                except OSError as e:
                    raise KubeconfigError(
                        f"{where}: {section}.{entry_name}.{key}: {e.strerror}: {path}"
                    ) from None

    def file(self, section: str, name: str, key: str) -> str:
        """The file an entry's `key` names: relative to the kubeconfig file that defined the entry, as kubectl
        reads it ($KUBECONFIG may merge files from several folders)."""
        entry = (self.clusters if section == "clusters" else self.users)[name]
        origin = self.origins.get((section, name), self.path)
        return os.path.join(os.path.dirname(os.path.abspath(origin)), os.path.expanduser(str(entry[key])))

    def user(self, name: str | None) -> tuple[str, dict[str, Any]]:
        return name or "", self.users.get(name or "", {})

    def secrets(self) -> list[str]:
        """Every credential written in the users section (and in exec plugins' environment)."""
        found: list[str] = []
        budget = [100_000]  # nodes visited: YAML aliases can make a small file a huge tree

        def walk(node: Any, key: str = "") -> None:
            budget[0] -= 1
            if budget[0] < 0:
                return
            if isinstance(node, dict):
                for k, v in node.items():
                    walk(v, str(k))
                    if k == "env" and isinstance(v, list):  # exec: [{name, value}]
                        found.extend(str(e.get("value")) for e in v if isinstance(e, dict) and e.get("value"))
            elif isinstance(node, list):
                for v in node:
                    walk(v, key)
            elif key in SECRET_KEYS and node not in (None, ""):
                found.append(str(node))

        walk(self.raw_users)
        return found


def _parse(file: str) -> tuple[dict[str, Any], dict[tuple[str | int, ...], tuple[int, int]]]:
    """A kubeconfig file's data and the position of each value; nothing of its text is echoed in errors."""
    import yaml

    try:
        with open(file, "rb") as f:
            text = f.read(MAX_KUBECONFIG_BYTES + 1)
    except OSError as e:
        raise KubeconfigError(f"kubeconfig {file}: cannot read it: {e.strerror}") from e
    if len(text) > MAX_KUBECONFIG_BYTES:
        raise KubeconfigError(f"kubeconfig {file}: larger than {MAX_KUBECONFIG_BYTES // 2**20} MiB")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text) if node is not None else {}
    except yaml.MarkedYAMLError as e:  # its str() quotes the line, which may hold a token: not shown
        mark = e.problem_mark or e.context_mark
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = " ".join(str(p) for p in (e.context, e.problem) if p)
        raise KubeconfigError(f"kubeconfig {file}{where}: not valid YAML: {problem}") from None
    except yaml.YAMLError as e:
        reason = getattr(e, "reason", None) or type(e).__name__
        raise KubeconfigError(f"kubeconfig {file}: not valid YAML: {reason}") from None
    except RecursionError:
        raise KubeconfigError(f"kubeconfig {file}: not valid YAML: nested too deeply") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        kind = (
            "list" if isinstance(data, list) else "string" if isinstance(data, str) else type(data).__name__
        )
        raise KubeconfigError(f"kubeconfig {file}:1:1: not a kubeconfig (a YAML {kind}, not a mapping)")
    return data, positions(node) if node is not None else {}


MAX_KUBECONFIG_BYTES = 16 * 2**20


def _server_problem(server: str) -> str | None:
    """What is wrong with a cluster's `server` as a URL, or None. Without a scheme urllib3 would guess
    (and warn); another scheme, no host or a bad port would fail each of orch's retries the same way."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(server)
    except ValueError:
        return "is not a URL"
    if parts.scheme not in ("http", "https"):
        return "is not an https:// (or http://) URL"
    try:
        host, _ = parts.hostname, parts.port
    except ValueError:
        return "has no valid port"
    return None if host else "has no host"


def _check_shape(
    file: str, data: dict[str, Any], positions: dict[tuple[str | int, ...], tuple[int, int]]
) -> None:
    """What orch and the client read must have the kubeconfig's shape, else one line naming the field."""

    def fail(path: tuple[str | int, ...], problem: str) -> NoReturn:
        line, column = next(
            (positions[path[:n]] for n in range(len(path), -1, -1) if path[:n] in positions), (1, 1)
        )
        dotted = "".join(
            f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(path)
        )
        raise KubeconfigError(f"kubeconfig {file}:{line}:{column}: {dotted}: {problem}")

    def mapping(value: Any, path: tuple[str | int, ...]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            fail(path, "not a mapping")
        return value

    def string(value: Any, path: tuple[str | int, ...]) -> None:
        if value is not None and not isinstance(value, str):
            fail(path, "not a string")

    string(data.get("current-context"), ("current-context",))
    for section, inner in (("contexts", "context"), ("clusters", "cluster"), ("users", "user")):
        items = data.get(section)
        if items is None:
            continue
        if not isinstance(items, list):
            fail((section,), "not a list")
        for index, item in enumerate(items):
            path: tuple[str | int, ...] = (section, index)
            mapping(item, path)
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
                fail(path, "has no name")
            body = mapping(item.get(inner), (*path, inner))
            keys = {"context": ("cluster", "user", "namespace"), "cluster": ("server",), "user": ()}[inner]
            for key in keys:
                string(body.get(key), (*path, inner, key))
            if inner == "user" and body.get("exec") is not None:
                mapping(body["exec"], (*path, inner, "exec"))


# --- TLS material --------------------------------------------------------------------------------------------


class TLSSetupError(Exception):
    """A kubeconfig's TLS material that does not load, said as `field: what is wrong` (never its content)."""


def tls_options(kubeconfig: Kubeconfig, cluster_name: str, user_name: str) -> dict[str, Any]:
    """urllib3's TLS arguments for a cluster: its CA (file or data), the user's client certificate (files or
    data), `insecure-skip-tls-verify`, `tls-server-name`; what the official client's `RESTClientObject` sets.
    Whatever does not load is a `TLSSetupError` naming the field (and the file)."""
    import ssl
    import tempfile

    from urllib3.util.ssl_ import create_urllib3_context

    cluster = kubeconfig.clusters[cluster_name]
    user = kubeconfig.users.get(user_name, {})
    insecure = cluster.get("insecure-skip-tls-verify") is True
    context = create_urllib3_context(cert_reqs=ssl.CERT_NONE if insecure else ssl.CERT_REQUIRED)
    if not insecure:
        field_name = f"clusters.{cluster_name}.certificate-authority"
        if cluster.get("certificate-authority-data"):
            pem = _decoded(cluster["certificate-authority-data"], f"{field_name}-data")
            field_name += "-data"
        elif cluster.get("certificate-authority"):
            pem = _file_bytes(kubeconfig, "clusters", cluster_name, "certificate-authority")
        else:
            pem = None
        if pem is None:
            context.load_default_certs()
        else:
            try:
                context.load_verify_locations(cadata=pem.decode("ascii"))
            except (ssl.SSLError, UnicodeDecodeError, ValueError):
                raise TLSSetupError(f"{field_name}: holds no PEM certificate") from None
    pair: list[tuple[str, bytes]] = []
    for key in ("client-certificate", "client-key"):
        field_name = f"users.{user_name}.{key}"
        if user.get(f"{key}-data"):
            pair.append((f"{field_name}-data", _decoded(user[f"{key}-data"], f"{field_name}-data")))
        elif user.get(key):
            pair.append((field_name, _file_bytes(kubeconfig, "users", user_name, key)))
    if len(pair) == 2:
        (cert_field, cert_pem), (key_field, key_pem) = pair
        if b"-----BEGIN CERTIFICATE-----" not in cert_pem:
            raise TLSSetupError(f"{cert_field}: holds no PEM certificate")
        if b"PRIVATE KEY-----" not in key_pem:
            raise TLSSetupError(f"{key_field}: holds no PEM private key")
        with contextlib.ExitStack() as stack:
            paths = []
            for item in (cert_pem, key_pem):
                # ssl reads keys from files only: one only this user can read, deleted at once
                temp = stack.enter_context(tempfile.NamedTemporaryFile("wb", suffix=".pem"))
                temp.write(item)
                temp.flush()
                paths.append(temp.name)
            try:
                context.load_cert_chain(certfile=paths[0], keyfile=paths[1])
            except ssl.SSLError as e:
                said = " ".join(str(getattr(e, "reason", None) or e).split()).lower().replace("_", " ")
                raise TLSSetupError(f"{cert_field} and {key_field} do not load as a pair ({said})") from None
    options: dict[str, Any] = {"ssl_context": context, "cert_reqs": context.verify_mode}
    if insecure:
        options["assert_hostname"] = False
    if cluster.get("tls-server-name"):
        options["server_hostname"] = cluster["tls-server-name"]
    return options


MAX_TLS_FILE_BYTES = (
    2**20
)  # a CA bundle, a certificate or a key: kilobytes (a bundle of every public CA: 250 KiB)


def _decoded(value: str, field_name: str) -> bytes:
    import base64
    import binascii

    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise TLSSetupError(f"{field_name}: not base64") from None


def _file_bytes(kubeconfig: Kubeconfig, section: str, name: str, key: str) -> bytes:
    path = kubeconfig.file(section, name, key)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TLS_FILE_BYTES + 1)
    except OSError as e:
        raise TLSSetupError(f"{section}.{name}.{key}: {e.strerror}: {path}") from None
    if len(data) > MAX_TLS_FILE_BYTES:
        raise TLSSetupError(f"{section}.{name}.{key}: {path} is larger than 1 MiB")
    return data
