"""Secrets encrypted at rest (`--encryption-provider-config`), against a real `gpufleet up`
and the real kubectl: the database file (and its WAL) never holds a Secret's value, kubectl
reads it back, a key put first still reads what the old one wrote and kubectl's rewrite moves
every Secret to it, and a server without the key refuses those Secrets alone."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import Kubectl, kubectl_binary, wait_for_url

VALUE = "s3cr3t-at-rest-5d1e9c-distinctive"
KEY1 = base64.b64encode(os.urandom(32)).decode()
KEY2 = base64.b64encode(os.urandom(32)).decode()


def config(path: Path, *keys: tuple[str, str], identity: bool = True) -> Path:
    lines = ["apiVersion: apiserver.config.k8s.io/v1", "kind: EncryptionConfiguration", "resources:",
             "  - resources: [secrets]", "    providers:", "      - aescbc:", "          keys:"]
    for name, secret in keys:
        lines += [f"            - name: {name}", f"              secret: {secret}"]
    if identity:
        lines.append("      - identity: {}")
    path.write_text("\n".join(lines) + "\n")
    return path


class Server:
    def __init__(self, root: Path, *args: str) -> None:
        self.root = root
        self.state = root / "state"
        self.log = root / "server.log"
        env = dict(os.environ, HOME=str(root), PYTHONUNBUFFERED="1")
        env.pop("KUBECONFIG", None)
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpufleet.cli.main", "up", "--state-dir", str(self.state), "--port", "0",
                 "--no-agent", "--gateway-port", "-1", *args],
                stdout=subprocess.PIPE, stderr=log, text=True, env=env, start_new_session=True)
        self.url = wait_for_url(self.proc, self.log, 60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def database_bytes(self) -> bytes:
        return b"".join(p.read_bytes() for p in (self.state / "state.db", self.state / "state.db-wal")
                        if p.exists())


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gpufleet-atrest-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def kubectl_for(server: Server, root: Path) -> Kubectl:
    home = root / "kubectl-home"
    home.mkdir(exist_ok=True)
    return Kubectl(kubectl_binary(), str(server.state / "kubeconfig"), str(home))


def secret_value(kubectl: Kubectl, name: str) -> str:
    encoded = kubectl("get", "secret", name, "-o", "jsonpath={.data.password}").ok().stdout
    return base64.b64decode(encoded).decode()


def stored_value(state: Path, name: str) -> str:
    with contextlib.closing(sqlite3.connect(state / "state.db")) as db:
        return db.execute("SELECT value FROM objects WHERE resource = 'secrets' AND name = ?", (name,)).fetchone()[0]


def test_secrets_are_encrypted_at_rest_rotated_and_refused_without_the_key(root: Path) -> None:
    kubectl_binary()  # a missing kubectl fails before anything starts
    enc1 = config(root / "enc1.yaml", ("key1", KEY1))
    server = Server(root, "--encryption-provider-config", str(enc1))
    try:
        kubectl = kubectl_for(server, root)
        kubectl("create", "secret", "generic", "db-password", f"--from-literal=password={VALUE}").ok()
        kubectl("create", "configmap", "plain", "--from-literal=k=visible-config-value").ok()
        assert secret_value(kubectl, "db-password") == VALUE
        raw = server.database_bytes()
        assert VALUE.encode() not in raw
        assert base64.b64encode(VALUE.encode()) not in raw
        # The check can fail: what is not encrypted is there to be read, and so is the prefix.
        assert b"visible-config-value" in raw
        assert b"k8s:enc:aescbc:v1:key1:" in raw
    finally:
        server.stop()
    assert stored_value(server.state, "db-password").startswith('"k8s:enc:aescbc:v1:key1:')

    # Rotation: a new key first, the old one still listed: old Secrets read, and kubectl's
    # rewrite re-encrypts every one with the new key.
    enc2 = config(root / "enc2.yaml", ("key2", KEY2), ("key1", KEY1))
    server = Server(root, "--encryption-provider-config", str(enc2))
    try:
        kubectl = kubectl_for(server, root)
        assert secret_value(kubectl, "db-password") == VALUE
        listed = kubectl("get", "secrets", "-A", "-o", "json").ok().stdout
        kubectl("replace", "-f", "-", input=listed).ok()
        assert secret_value(kubectl, "db-password") == VALUE
    finally:
        server.stop()
    assert stored_value(server.state, "db-password").startswith('"k8s:enc:aescbc:v1:key2:')

    # Only the new key now: the rewritten Secrets read.
    enc3 = config(root / "enc3.yaml", ("key2", KEY2))
    server = Server(root, "--encryption-provider-config", str(enc3))
    try:
        assert secret_value(kubectl_for(server, root), "db-password") == VALUE
    finally:
        server.stop()

    # Without the key: those Secrets are refused with the reason, the rest is served.
    server = Server(root)
    try:
        kubectl = kubectl_for(server, root)
        failed = kubectl("get", "secret", "db-password", "-o", "yaml").failed()
        assert 'unable to transform key "/registry/secrets/default/db-password"' in failed.stderr, failed
        assert "aescbc key 'key2'" in failed.stderr and "--encryption-provider-config" in failed.stderr, failed
        assert VALUE not in failed.stdout + failed.stderr
        assert kubectl("get", "configmap", "plain", "-o", "jsonpath={.data.k}").ok().stdout == "visible-config-value"
        kubectl("create", "namespace", "still-writable").ok()
        assert server.proc.poll() is None
    finally:
        server.stop()


@pytest.mark.parametrize(("body", "words"), [
    ("      - secretbox:\n          keys:\n            - name: k\n              secret: " + KEY1 + "\n",
     "resources[0].providers[0].secretbox: not supported by gpufleet; use aescbc or aesgcm"),
    ("      - aescbc:\n          keys:\n            - name: k\n              secret: c2hvcnQ=\n",
     "resources[0].providers[0].aescbc.keys[0].secret: secret is not of the expected length, got 5"),
    ("      - aescbc:\n          keys:\n            - name: k\n              secret: '%%%'\n",
     "resources[0].providers[0].aescbc.keys[0].secret: is not valid base64"),
    ("      - rot13: {}\n", "resources[0].providers[0].rot13: unknown provider"),
])
def test_a_bad_config_refuses_to_start_naming_the_field(root: Path, body: str, words: str) -> None:
    path = root / "enc.yaml"
    path.write_text("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n"
                    "  - resources: [secrets]\n    providers:\n" + body)
    done = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", "up", "--state-dir", str(root / "state"),
                           "--port", "0", "--no-agent", "--encryption-provider-config", str(path)],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, COLUMNS="400"))
    assert done.returncode == 2, done
    err = " ".join(done.stderr.split())
    assert "--encryption-provider-config" in err and words in err, done.stderr
    assert not (root / "state" / "state.db").exists()
