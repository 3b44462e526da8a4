"""The control plane's PKI: a CA and a serving certificate signed by it.

`gpufleet up` and `gpufleet server` keep them under <state-dir>/pki and reuse them across
restarts, so a kubeconfig handed out once (it carries the CA) stays valid. Keys are ECDSA
P-256: small, fast to make, and accepted by kubectl, httpx and the official clients.

The serving certificate names, besides the server's own addresses, what a program in a pod
dials (``kubernetes.default.svc`` and its longer and shorter forms, and the ClusterIP of the
``default/kubernetes`` Service), as kube-apiserver's does; one made before without them is
made again from the same CA at the next start.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpufleet.utils.files import write_private

CA_DAYS = 3650
SERVING_DAYS = 825
# The names in-cluster clients reach the API server by (KUBERNETES_SERVICE_HOST, kubeconfigs
# written for pods), and the ClusterIP of the default/kubernetes Service: the first address of
# the service range, as Kubernetes reserves it.
IN_CLUSTER_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local")
KUBERNETES_SERVICE_IP = "10.96.0.1"


@dataclass(frozen=True)
class ServingPki:
    ca_cert: Path
    cert: Path
    key: Path

    def ca_pem(self) -> bytes:
        return self.ca_cert.read_bytes()


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> dt.datetime:
    # Certificate validity is wall-clock by nature (the peer checks it against its own clock).
    return dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)


def make_ca(common_name: str = "gpufleet-ca") -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of a new self-signed CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = _now()
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(start + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _san(hosts: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for h in dict.fromkeys(hosts):
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(h))
    return out


def make_serving_cert(ca_cert_pem: bytes, ca_key_pem: bytes, hosts: list[str],
                      common_name: str = "gpufleet-apiserver") -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for a TLS server answering on ``hosts`` (names or IPs)."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    start = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(start + dt.timedelta(days=SERVING_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(_san(hosts)), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def uncovered(cert_pem: bytes, hosts: list[str]) -> list[str]:
    """The names and addresses of ``hosts`` that the certificate does not name."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return list(hosts)
    have = {str(v) for v in san.get_values_for_type(x509.IPAddress)} | set(san.get_values_for_type(x509.DNSName))
    return [h for h in hosts if (str(ipaddress.ip_address(h)) if _is_ip(h) else h) not in have]


def _covers(cert_pem: bytes, hosts: list[str]) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    if cert.not_valid_after_utc - dt.datetime.now(dt.UTC) < dt.timedelta(days=30):
        return False
    return not uncovered(cert_pem, hosts)


def _is_ip(h: str) -> bool:
    try:
        ipaddress.ip_address(h)
        return True
    except ValueError:
        return False


def serving_hosts(listen_host: str) -> list[str]:
    """The names a serving certificate must cover for a server listening on ``listen_host``:
    loopback, the in-cluster names, and for a wildcard address the host's names and every
    address of its interfaces (agents on other machines dial one of them)."""
    import socket

    import psutil

    hosts = ["127.0.0.1", "::1", "localhost", *IN_CLUSTER_NAMES, KUBERNETES_SERVICE_IP]
    if listen_host in ("0.0.0.0", "::", ""):
        hosts += [socket.gethostname(), socket.getfqdn()]
        for addrs in psutil.net_if_addrs().values():
            for a in addrs:
                if a.family in (socket.AF_INET, socket.AF_INET6):
                    hosts.append(a.address.split("%")[0])
    else:
        hosts.append(listen_host)
    return list(dict.fromkeys(h for h in hosts if h))


def ensure_pki(directory: Path, hosts: list[str]) -> ServingPki:
    """The CA (made once, kept) and a serving certificate for ``hosts`` under ``directory``;
    the serving certificate is remade when it no longer covers the hosts or nears expiry."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca_crt, ca_key = directory / "ca.crt", directory / "ca.key"
    crt, key = directory / "apiserver.crt", directory / "apiserver.key"
    if not (ca_crt.exists() and ca_key.exists()):
        cert_pem, key_pem = make_ca()
        write_private(ca_key, key_pem)
        write_private(ca_crt, cert_pem)
        crt.unlink(missing_ok=True)
    if not (crt.exists() and key.exists() and _covers(crt.read_bytes(), hosts)):
        cert_pem, key_pem = make_serving_cert(ca_crt.read_bytes(), ca_key.read_bytes(), hosts)
        write_private(key, key_pem)
        write_private(crt, cert_pem)
    return ServingPki(ca_cert=ca_crt, cert=crt, key=key)
