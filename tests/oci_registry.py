"""A real OCI registry for tests: Debian's docker-registry (the CNCF distribution registry)
on 127.0.0.1 at a free port, serving TLS with a certificate from a throwaway CA and asking
for htpasswd (bcrypt) credentials.

podman trusts the CA for that host:port only (certs.d/<host:port>/ca.crt, removed again at
the end), so anything on this machine that runs podman, the node agent included, pulls from
it with verified TLS and no insecure-registry setting.

    with local_registry(tmp, push={"busybox": "localhost/gpufleet/busybox:1"}) as reg:
        reg.images["busybox"]          # "127.0.0.1:<port>/gpufleet/busybox:1"
        reg.pull_secret("regcred")     # a kubernetes.io/dockerconfigjson Secret manifest

tests/conftest.py offers it as the session fixture `oci_registry`."""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REGISTRY_BIN = "/usr/bin/docker-registry"
HOST = "127.0.0.1"


@dataclass
class LocalRegistry:
    address: str  # host:port, the registry part of an image reference
    username: str
    password: str
    ca_cert: Path  # PEM of the CA that signed the registry's certificate
    images: dict[str, str] = field(default_factory=dict)  # name -> reference in this registry

    @property
    def creds(self) -> str:
        """The `user:password` form podman's --creds takes."""
        return f"{self.username}:{self.password}"

    def ref(self, repository: str) -> str:
        """A reference in this registry, e.g. ref("gpufleet/busybox:1")."""
        return f"{self.address}/{repository}"

    def push(self, local_ref: str, repository: str | None = None) -> str:
        """Push a local image (localhost/gpufleet/python:3.11 -> <address>/gpufleet/python:3.11)."""
        target = self.ref(repository or local_ref.removeprefix("localhost/"))
        proc = subprocess.run(
            ["podman", "push", "--quiet", "--creds", self.creds, local_ref, f"docker://{target}"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise AssertionError(f"podman push {local_ref} to {target} failed: {proc.stderr.strip()}")
        return target

    def docker_config(self) -> dict:
        """The ~/.docker/config.json (and podman auth.json) form of the credentials."""
        auth = base64.b64encode(self.creds.encode()).decode()
        return {"auths": {self.address: {"username": self.username, "password": self.password, "auth": auth}}}

    def pull_secret(self, name: str = "registry-creds", namespace: str = "default") -> dict:
        """A kubernetes.io/dockerconfigjson Secret for imagePullSecrets, as
        `kubectl create secret docker-registry` writes it."""
        payload = json.dumps(self.docker_config(), separators=(",", ":")).encode()
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(payload).decode()},
        }


def certs_dir() -> Path:
    """Where podman looks for per-registry CAs: system-wide as root, per user otherwise."""
    if os.geteuid() == 0:
        return Path("/etc/containers/certs.d")
    return Path(os.path.expanduser("~/.config/containers/certs.d"))


@contextlib.contextmanager
def local_registry(workdir: Path, push: dict[str, str] | None = None) -> Iterator[LocalRegistry]:
    """Start the registry, trust its CA, push `push` (name -> local reference); on leaving,
    stop it, remove the trust and the local names pulled from it."""
    _require_tools()
    workdir.mkdir(parents=True, exist_ok=True)
    ca_pem = _write_tls(workdir)
    username, password = "gpufleet", secrets.token_urlsafe(16)
    htpasswd = subprocess.run(
        ["htpasswd", "-nbB", username, password], capture_output=True, text=True, check=True
    ).stdout
    (workdir / "htpasswd").write_text(htpasswd)
    proc, port = _start(workdir)
    address = f"{HOST}:{port}"
    trust = certs_dir() / address
    try:
        trust.mkdir(parents=True, exist_ok=True)
        shutil.copy(ca_pem, trust / "ca.crt")
        registry = LocalRegistry(address, username, password, ca_pem)
        for name, local_ref in (push or {}).items():
            registry.images[name] = registry.push(local_ref)
        yield registry
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(trust, ignore_errors=True)
        _forget_pulled(address)


def _require_tools() -> None:
    missing = [t for t in ("podman", "htpasswd") if shutil.which(t) is None]
    if not os.path.exists(REGISTRY_BIN):
        missing.append(REGISTRY_BIN)
    if missing:
        pytest.fail(
            f"the local registry needs {', '.join(missing)}: run scripts/setup.sh "
            "(apt-get install -y docker-registry apache2-utils podman)",
            pytrace=False,
        )


def _write_tls(workdir: Path) -> Path:
    """A CA and a server certificate for 127.0.0.1 signed by it; returns the CA's path."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufleet test registry CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST)), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = workdir / "ca.crt"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (workdir / "server.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    server_key = workdir / "server.key"
    server_key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    server_key.chmod(0o600)
    return ca_pem


def _config(workdir: Path, port: int) -> dict:
    return {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(workdir / "data")}, "delete": {"enabled": True}},
        "http": {
            "addr": f"{HOST}:{port}",
            "secret": secrets.token_hex(16),
            "tls": {"certificate": str(workdir / "server.crt"), "key": str(workdir / "server.key")},
        },
        "auth": {"htpasswd": {"realm": "gpufleet-test-registry", "path": str(workdir / "htpasswd")}},
    }


def _start(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    # The free port is found by binding and letting go: another process can take it in
    # between, so a registry that cannot listen gets another port.
    for _ in range(5):
        port = _free_port()
        config = workdir / "config.yml"
        config.write_text(yaml.safe_dump(_config(workdir, port)))
        log_path = workdir / "registry.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [REGISTRY_BIN, "serve", str(config)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        if _wait_ready(proc, port, workdir / "ca.crt"):
            return proc, port
        log_text = log_path.read_text(errors="replace")
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if "address already in use" not in log_text:
            pytest.fail(f"docker-registry did not come up:\n{log_text[-3000:]}", pytrace=False)
    pytest.fail("docker-registry found no free port", pytrace=False)


def _wait_ready(proc: subprocess.Popen[bytes], port: int, ca: Path, deadline_s: float = 30) -> bool:
    """True once /v2/ answers over verified TLS (401: it wants credentials, as configured)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            urllib.request.urlopen(f"https://{HOST}:{port}/v2/", context=ctx, timeout=2)
        except urllib.error.HTTPError as e:
            if e.code == 401:
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _forget_pulled(address: str) -> None:
    """Drop the local names of images pulled from the registry (the images stay when another
    name, such as the localhost/gpufleet one they were pushed from, still holds them)."""
    proc = subprocess.run(
        ["podman", "images", "--format", "json"], capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        return
    for entry in json.loads(proc.stdout or "[]"):
        for name in entry.get("Names") or []:
            if name.startswith(address + "/"):
                subprocess.run(["podman", "rmi", name], capture_output=True, timeout=60, check=False)
