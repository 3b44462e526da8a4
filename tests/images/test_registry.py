"""The local OCI registry fixture (tests/oci_registry.py) with real podman pulls: what works
with credentials, and what the registry answers without them or for a missing image, as
podman prints it (the node agent reports these texts in ErrImagePull messages)."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
from pathlib import Path

import pytest
from oci_images import ensure_images
from oci_registry import LocalRegistry, certs_dir, local_registry

from gpufleet.apiserver.server import ApiServer
from gpufleet.store.base import open_store
from gpufleet.utils.http import RawRequest

LOCAL_BUSYBOX = "localhost/gpufleet/busybox:1"


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture
def no_auth(tmp_path: Path) -> list[str]:
    """podman options that use no stored credentials at all, only what a test passes."""
    path = tmp_path / "auth.json"
    path.write_text("{}")
    return ["--authfile", str(path)]


def image_id(ref: str) -> str:
    proc = podman("image", "inspect", "--format", "{{.Id}}", ref)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_an_authenticated_pull_gets_the_pushed_image_and_it_runs(oci_registry: LocalRegistry, no_auth):
    ref = oci_registry.images["busybox"]
    assert ref == f"{oci_registry.address}/gpufleet/busybox:1"
    proc = podman("pull", *no_auth, "--creds", oci_registry.creds, ref)
    assert proc.returncode == 0, proc.stderr
    try:
        assert image_id(ref) == image_id(LOCAL_BUSYBOX)
        run = podman("run", "--rm", "--runtime", "runc", "--ulimit", "nofile=1024:1024",
                     "--ulimit", "nproc=1024:1024", ref, "cat", "/www/index.html")  # fmt: skip
        assert (run.returncode, run.stdout) == (0, "hello from gpufleet\n"), run.stderr
    finally:
        podman("rmi", ref)
    # Dropping the pulled name left the image under its own name.
    assert image_id(LOCAL_BUSYBOX)


def test_a_pull_without_credentials_is_refused(oci_registry: LocalRegistry, no_auth):
    ref = oci_registry.images["busybox"]
    proc = podman("pull", *no_auth, ref)
    assert proc.returncode != 0
    # podman 4.3: "Error: initializing source docker://127.0.0.1:PORT/gpufleet/busybox:1:
    # reading manifest 1 in 127.0.0.1:PORT/gpufleet/busybox: unauthorized: authentication required"
    assert "unauthorized: authentication required" in proc.stderr, proc.stderr
    assert f"reading manifest 1 in {oci_registry.address}/gpufleet/busybox" in proc.stderr


def test_a_wrong_password_is_refused_the_same_way(oci_registry: LocalRegistry, no_auth):
    proc = podman("pull", *no_auth, "--creds", f"{oci_registry.username}:wrong", oci_registry.images["busybox"])
    assert proc.returncode != 0
    assert "unauthorized: authentication required" in proc.stderr, proc.stderr


def test_a_missing_image_is_manifest_unknown(oci_registry: LocalRegistry, no_auth):
    proc = podman("pull", *no_auth, "--creds", oci_registry.creds, oci_registry.ref("gpufleet/no-such-image:1"))
    assert proc.returncode != 0
    # "... reading manifest 1 in 127.0.0.1:PORT/gpufleet/no-such-image: manifest unknown: manifest unknown"
    assert "manifest unknown" in proc.stderr, proc.stderr
    assert "gpufleet/no-such-image" in proc.stderr


def test_tls_is_verified_against_the_throwaway_ca(oci_registry: LocalRegistry, no_auth, tmp_path):
    trusted = certs_dir() / oci_registry.address / "ca.crt"
    assert trusted.read_bytes() == oci_registry.ca_cert.read_bytes()
    # Without that CA podman does not accept the registry's certificate.
    empty = tmp_path / "no-certs"
    empty.mkdir()
    proc = podman("pull", *no_auth, "--cert-dir", str(empty), "--creds", oci_registry.creds,
                  oci_registry.images["busybox"])  # fmt: skip
    assert proc.returncode != 0
    assert "x509: certificate signed by unknown authority" in proc.stderr, proc.stderr


async def test_the_pull_secret_is_a_valid_secret_whose_config_authenticates_podman(
    oci_registry: LocalRegistry, tmp_path: Path, sqlite_url: str
):
    secret = oci_registry.pull_secret("regcred", "team-a")
    assert (secret["type"], list(secret["data"])) == ("kubernetes.io/dockerconfigjson", [".dockerconfigjson"])
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    entry = config["auths"][oci_registry.address]
    assert base64.b64decode(entry["auth"]).decode() == f"{oci_registry.username}:{oci_registry.password}"

    # The API server takes it as it is (its validation wants .dockerconfigjson for this type).
    store = open_store(sqlite_url)
    await store.start()
    try:
        server = ApiServer(store)
        await server.start()
        for path, body in [("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": "team-a"}}),
                           ("/api/v1/namespaces/team-a/secrets", secret)]:  # fmt: skip
            resp = await server.handle(
                RawRequest("POST", path, [], {"content-type": "application/json"}, json.dumps(body).encode())
            )
            assert resp.status == 201, resp.body
    finally:
        await store.close()

    # The same document is podman's auth file format: a pull with it and no --creds works.
    auth = tmp_path / "from-secret.json"
    auth.write_text(json.dumps(config))
    ref = oci_registry.images["busybox"]
    proc = podman("pull", "--authfile", str(auth), ref)
    try:
        assert proc.returncode == 0, proc.stderr
    finally:
        podman("rmi", ref)


def test_a_registry_goes_away_with_its_trust_and_pulled_names(tmp_path: Path, no_auth):
    with local_registry(tmp_path / "reg", push=ensure_images("busybox")) as reg:
        host, port = reg.address.split(":")
        trust = certs_dir() / reg.address
        assert (trust / "ca.crt").exists()
        pulled = podman("pull", *no_auth, "--creds", reg.creds, reg.images["busybox"])
        assert pulled.returncode == 0, pulled.stderr
    assert not trust.exists()
    names = podman("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    assert not [n for n in names if n.startswith(reg.address + "/")], names
    assert image_id(LOCAL_BUSYBOX)
    with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=2):
        pass
