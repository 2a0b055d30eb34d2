"""Which transport a command talks through (orchestrator/cluster/rest.py): the follow commands send through
urllib3 directly when the kubeconfig's user is a token or a client certificate, and never import `kubernetes`
then; anything else (a credential plugin, an auth provider) goes through the official client, as submit does.
Real requests to the emulator, over HTTP and over HTTPS with certificates made here (tests/fakes/tls.py)."""

from __future__ import annotations

import base64
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from orchestrator import cluster
from orchestrator.cluster.connection import lean_transport
from orchestrator.cluster.kubeconfig import Kubeconfig
from orchestrator.cluster.rest import LeanTransport, OfficialTransport
from orchestrator.kube.kinds import POD
from tests.cluster.test_faults import one_error_line
from tests.fakes.emulator import serve
from tests.fakes.kube import Kube
from tests.fakes.tls import Certificates, make_certificates

NS = "team-a"


def kubeconfig(path: Path, server: str, user: dict, cluster_fields: dict | None = None) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, **(cluster_fields or {})}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": NS}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def connect(path: Path, *, lean: bool = True) -> cluster.Cluster:
    return cluster.connect(cluster.Target(kubeconfig=str(path)), lean=lean)


EXEC = {
    "exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": sys.executable,
        "args": ["-c", "import json; print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1', "
                       "'kind': 'ExecCredential', 'status': {'token': 'from-the-plugin'}}))"],
        "interactiveMode": "Never",
    }
}  # fmt: skip


# --- which transport -----------------------------------------------------------------------------------------


def test_token_kubeconfig_goes_lean_and_sends_the_token(kube: Kube, tmp_path):
    connected = connect(kubeconfig(tmp_path / "kc", kube.url, {"token": "tok-1"}))
    assert isinstance(connected.transport, LeanTransport)
    assert connected.list(cluster.Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")) == []
    assert kube.requests()[-1].headers["Authorization"] == "Bearer tok-1"
    # without `lean` (submit, doctor): the official client, whatever the kubeconfig
    assert isinstance(connect(tmp_path / "kc", lean=False).transport, OfficialTransport)


def test_token_file_is_read_relative_to_the_kubeconfig_that_names_it_in_a_merged_list(
    kube: Kube, tmp_path, monkeypatch
):
    """$KUBECONFIG lists two files: the context is in the first, its user (tokenFile: token) in the second."""
    (tmp_path / "second").mkdir()
    (tmp_path / "second" / "token").write_text("from-the-file\n")
    first = {
        "clusters": [{"name": "c", "cluster": {"server": kube.url}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": NS}}],
        "current-context": "x",
    }
    second = {"users": [{"name": "u", "user": {"tokenFile": "token"}}]}
    (tmp_path / "first.yaml").write_text(yaml.safe_dump(first))
    (tmp_path / "second" / "users.yaml").write_text(yaml.safe_dump(second))
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'first.yaml'}:{tmp_path / 'second' / 'users.yaml'}")
    connected = cluster.connect(cluster.Target(), lean=True)
    assert isinstance(connected.transport, LeanTransport)
    connected.list(POD)
    assert kube.requests()[-1].headers["Authorization"] == "Bearer from-the-file"


@pytest.mark.launch  # the official client runs the exec credential plugin (tests/tiers.py cannot see it)
def test_credential_plugin_goes_through_the_official_client(kube: Kube, tmp_path):
    connected = connect(kubeconfig(tmp_path / "kc", kube.url, EXEC))
    assert isinstance(connected.transport, OfficialTransport)
    connected.list(POD)  # the plugin ran (a real process) and its token was sent
    assert kube.requests()[-1].headers["Authorization"] == "Bearer from-the-plugin"


@pytest.mark.parametrize(
    ("user", "cluster_fields"),
    [
        (EXEC, {}),
        ({"auth-provider": {"name": "oidc", "config": {"id-token": "x", "idp-issuer-url": "y"}}}, {}),
        ({"username": "me", "password": "pw"}, {}),
        ({"token": "t", "as": "someone-else"}, {}),  # impersonation
        ({"client-certificate": "me.crt"}, {}),  # a certificate without its key
        ({"token": "t"}, {"proxy-url": "http://127.0.0.1:9"}),
        ({"token": "t"}, {"insecure-skip-tls-verify": "yes"}),  # not the boolean the lean transport reads
    ],
    ids=[
        "exec",
        "auth-provider",
        "basic-auth",
        "impersonation",
        "cert-without-key",
        "proxy-url",
        "odd-value",
    ],
)
def test_what_the_lean_transport_does_not_serve_goes_to_the_official_client(tmp_path, user, cluster_fields):
    path = kubeconfig(tmp_path / "kc", "https://127.0.0.1:6443", user, cluster_fields)
    assert lean_transport(Kubeconfig.read(str(path)), "x") is None
    assert lean_transport(
        Kubeconfig.read(str(kubeconfig(tmp_path / "ok", "https://127.0.0.1:6443", {"token": "t"}))), "x"
    )


# --- the follow commands never import kubernetes -------------------------------------------------------------

CHECK = (
    "import sys, runpy\n"
    "sys.argv = ['orch', *sys.argv[1:]]\n"
    "try:\n"
    "    runpy.run_module('orchestrator', run_name='__main__')\n"
    "finally:\n"
    "    heavy = sorted({m.split('.')[0] for m in sys.modules} & {'kubernetes', 'jinja2', 'torch', 'pydantic'})\n"
    "    print('HEAVY', heavy, file=sys.stderr)\n"
)


@pytest.mark.parametrize(
    "args", [("status", "demo"), ("list",), ("wait", "demo"), ("delete", "demo")], ids=lambda a: a[0]
)
def test_follow_commands_do_not_import_kubernetes(env, job_file, args):
    assert env.orch("submit", str(job_file)).exit_code == 0
    env.kube.set_conditions(NS, "demo", ("Created", "True"), ("Succeeded", "True"))
    env.kube.add_pod(NS, "demo", "master", 0)
    result = subprocess.run(
        [sys.executable, "-c", CHECK, *args], env={**env.vars, "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stderr, result.stderr


# --- TLS -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificates() -> Certificates:
    return make_certificates()


@pytest.fixture
def https_kube(certificates: Certificates, tmp_path):  # type: ignore[no-untyped-def]
    with serve(tls=certificates.server_context(tmp_path)) as k:
        yield k


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_https_with_ca_and_client_certificate_data(
    https_kube: Kube, certificates: Certificates, tmp_path, monkeypatch: pytest.MonkeyPatch
):
    """The key is loaded from a file only this user can read, deleted at once (ssl reads keys from files)."""
    assert https_kube.url.startswith("https://")
    # A temp folder of this test's own: the official client, in other tests running beside this one, leaves
    # its *.pem files in the shared one.
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    user = {
        "client-certificate-data": b64(certificates.client.cert),
        "client-key-data": b64(certificates.client.key),
    }
    path = kubeconfig(
        tmp_path / "kc", https_kube.url, user, {"certificate-authority-data": b64(certificates.ca.cert)}
    )
    connected = connect(path)
    assert list((tmp_path / "tmp").iterdir()) == []
    assert isinstance(connected.transport, LeanTransport)
    assert connected.list(POD) == []


def test_https_with_ca_and_client_certificate_files(https_kube: Kube, certificates: Certificates, tmp_path):
    """Relative file names, as kubeconfigs written by kubeadm have them; `orch list` end to end."""
    (tmp_path / "pki").mkdir()
    for name, data in (("ca.crt", certificates.ca.cert), ("me.crt", certificates.client.cert),
                       ("me.key", certificates.client.key)):  # fmt: skip
        (tmp_path / "pki" / name).write_bytes(data)
    user = {"client-certificate": "pki/me.crt", "client-key": "pki/me.key"}
    path = kubeconfig(tmp_path / "kc", https_kube.url, user, {"certificate-authority": "pki/ca.crt"})
    assert isinstance(connect(path).transport, LeanTransport)
    from tests.fakes.cli import Env

    env = Env(https_kube, path, tmp_path, {"KUBECONFIG": str(path), "HOME": str(tmp_path)})
    result = env.orch("list")
    assert result.exit_code == 0, result.stderr
    assert "No orch jobs found" in result.output


def test_insecure_skip_tls_verify_and_tls_server_name(https_kube: Kube, certificates: Certificates, tmp_path):
    user = {
        "client-certificate-data": b64(certificates.client.cert),
        "client-key-data": b64(certificates.client.key),
    }
    insecure = kubeconfig(tmp_path / "a", https_kube.url, user, {"insecure-skip-tls-verify": True})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # urllib3's InsecureRequestWarning, as the official client gives it
        assert connect(insecure).list(POD) == []
    # the certificate names kubernetes.default.svc (and 127.0.0.1); ask for the first by name
    named = kubeconfig(tmp_path / "b", https_kube.url, user,
                       {"certificate-authority-data": b64(certificates.ca.cert),
                        "tls-server-name": "kubernetes.default.svc"})  # fmt: skip
    assert connect(named).list(POD) == []
    wrong = kubeconfig(tmp_path / "c", https_kube.url, user,
                       {"certificate-authority-data": b64(certificates.ca.cert), "tls-server-name": "elsewhere"})  # fmt: skip
    with pytest.raises(cluster.ClusterUnreachable, match="TLS: .*elsewhere"):
        connect(wrong).list(POD)


@pytest.mark.parametrize("args", [("list",), ("submit", "JOB")], ids=["lean", "official"])
def test_wrong_ca_is_one_clear_line_at_once(
    https_kube: Kube, certificates: Certificates, tmp_path, job_file, args
):
    """The server's certificate is not signed by the kubeconfig's CA: one line naming it, not five retries,
    the same through either transport."""
    user = {
        "client-certificate-data": b64(certificates.client.cert),
        "client-key-data": b64(certificates.client.key),
    }
    path = kubeconfig(
        tmp_path / "kc", https_kube.url, user, {"certificate-authority-data": b64(certificates.other_ca.cert)}
    )
    from tests.fakes.cli import FAST, Env

    env = Env(https_kube, path, tmp_path, {"KUBECONFIG": str(path), "HOME": str(tmp_path), **FAST})
    result = env.orch(*(str(job_file) if a == "JOB" else a for a in args))
    assert result.exit_code == 1
    assert one_error_line(result.stderr) == (
        f"error: cannot reach the Kubernetes API at {https_kube.url} (context x): TLS: certificate verify failed: "
        "self-signed certificate in certificate chain (is the kubeconfig's certificate-authority the cluster's CA?)"
    )
