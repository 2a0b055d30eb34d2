"""Certificates for an API server served over HTTPS: a CA, the server's certificate (127.0.0.1), a client
certificate, all made here with `cryptography` (nothing is read from the machine)."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Pem:
    cert: bytes
    key: bytes


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(subject: str, issuer: Pem | None, *, ca: bool = False, server: bool = False) -> Pem:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    if issuer is None:
        issuer_name, signing_key = _name(subject), key
    else:
        issuer_name = x509.load_pem_x509_certificate(issuer.cert).subject
        signing_key = serialization.load_pem_private_key(issuer.key, None)  # type: ignore[assignment]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("kubernetes.default.svc")]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(signing_key, hashes.SHA256())  # type: ignore[arg-type]
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return Pem(cert.public_bytes(serialization.Encoding.PEM), key_pem)


@dataclass
class Certificates:
    ca: Pem
    server: Pem
    client: Pem
    other_ca: Pem  # signed nothing here: a kubeconfig naming it has the wrong CA

    def server_context(self, tmp: Path, *, require_client_cert: bool = True) -> ssl.SSLContext:
        """The API server's side: its certificate, and client certificates checked against the CA."""
        (tmp / "server.crt").write_bytes(self.server.cert)
        (tmp / "server.key").write_bytes(self.server.key)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=self.ca.cert.decode())
        context.load_cert_chain(tmp / "server.crt", tmp / "server.key")
        context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
        return context


def make_certificates() -> Certificates:
    ca = _issue("orch-test-ca", None, ca=True)
    return Certificates(
        ca=ca,
        server=_issue("kube-apiserver", ca, server=True),
        client=_issue("tester", ca),
        other_ca=_issue("someone-elses-ca", None, ca=True),
    )
