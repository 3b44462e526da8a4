from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest
import yaml

from gpufleet.client.kubeconfig import (
    KubeConfigError,
    find_kubeconfig,
    load_kubeconfig,
    transport_from_kubeconfig,
    write_kubeconfig,
)

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_round_trip(tmp_path: Path) -> None:
    path = write_kubeconfig(
        tmp_path / "sub" / "config", "http://127.0.0.1:6443", token="s3cret", ca_data=PEM, namespace="ml"
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    cfg = load_kubeconfig(path)
    assert cfg.server == "http://127.0.0.1:6443"
    assert cfg.token == "s3cret"
    assert cfg.ca_data == PEM
    assert cfg.context == "gpufleet" and cfg.namespace == "ml"
    assert cfg.insecure is False and cfg.client_cert is None
    assert cfg.path == path


def test_written_file_has_the_shape_kubectl_reads(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", "https://10.0.0.1:6443", token="t", context="lab")
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == "v1" and doc["kind"] == "Config"
    assert doc["current-context"] == "lab"
    assert doc["contexts"] == [{"name": "lab", "context": {"cluster": "lab", "user": "lab"}}]
    assert doc["clusters"] == [{"name": "lab", "cluster": {"server": "https://10.0.0.1:6443"}}]
    assert doc["users"] == [{"name": "lab", "user": {"token": "t"}}]


def test_rewrite_keeps_private_mode(tmp_path: Path) -> None:
    target = tmp_path / "config"
    target.write_text("old")
    target.chmod(0o644)
    write_kubeconfig(target, "http://a:1")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert list(tmp_path.iterdir()) == [target]


def _write(path: Path, server: str) -> Path:
    return write_kubeconfig(path, server)


def test_lookup_order(tmp_path: Path) -> None:
    home = tmp_path / "home"
    kube = _write(home / ".kube" / "config", "http://kube:1")
    env: dict[str, str] = {}
    assert find_kubeconfig(env=env, home=home) == kube
    ours = _write(home / ".gpufleet" / "kubeconfig", "http://gpufleet:1")
    assert find_kubeconfig(env=env, home=home) == ours
    first = tmp_path / "missing"
    second = _write(tmp_path / "env-config", "http://env:1")
    env["KUBECONFIG"] = f"{first}:{second}"
    assert find_kubeconfig(env=env, home=home) == second
    explicit = _write(tmp_path / "explicit", "http://explicit:1")
    assert find_kubeconfig(explicit, env=env, home=home) == explicit
    assert load_kubeconfig(env=env, home=home).server == "http://env:1"


def test_no_kubeconfig_names_every_place(tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(tmp_path / "a")}
    with pytest.raises(KubeConfigError) as exc:
        find_kubeconfig(env=env, home=tmp_path / "home")
    text = str(exc.value)
    for where in (
        tmp_path / "a",
        tmp_path / "home" / ".gpufleet" / "kubeconfig",
        tmp_path / "home" / ".kube" / "config",
    ):
        assert str(where) in text
    with pytest.raises(KubeConfigError, match="does not exist"):
        find_kubeconfig(tmp_path / "nope")


def test_reads_files_certs_and_contexts(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file\n")
    (tmp_path / "ca.crt").write_bytes(PEM)
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "a",
        "clusters": [
            {"name": "c1", "cluster": {"server": "https://one:6443", "certificate-authority": "ca.crt"}},
            {"name": "c2", "cluster": {"server": "https://two:6443", "insecure-skip-tls-verify": True}},
        ],
        "users": [
            {"name": "u1", "user": {"tokenFile": "token"}},
            {
                "name": "u2",
                "user": {
                    "client-certificate-data": base64.b64encode(b"CERT").decode(),
                    "client-key-data": base64.b64encode(b"KEY").decode(),
                },
            },
        ],
        "contexts": [
            {"name": "a", "context": {"cluster": "c1", "user": "u1"}},
            {"name": "b", "context": {"cluster": "c2", "user": "u2", "namespace": "team"}},
        ],
    }
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(doc))
    a = load_kubeconfig(path)
    assert a.server == "https://one:6443" and a.token == "from-file"
    assert a.ca_file == str(tmp_path / "ca.crt")
    b = load_kubeconfig(path, context="b")
    assert b.insecure and b.namespace == "team" and b.token is None
    assert b.client_cert == (b"CERT", b"KEY")
    with pytest.raises(KubeConfigError, match="no context named 'zzz'"):
        load_kubeconfig(path, context="zzz")


def test_bad_files_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text("- just\n- a list\n")
    with pytest.raises(KubeConfigError, match="not a kubeconfig"):
        load_kubeconfig(path)
    path.write_text(
        yaml.safe_dump(
            {
                "current-context": "x",
                "contexts": [{"name": "x", "context": {"cluster": "c"}}],
                "clusters": [{"name": "c", "cluster": {}}],
            }
        )
    )
    with pytest.raises(KubeConfigError, match="has no server"):
        load_kubeconfig(path)


async def test_transport_from_kubeconfig_sends_the_token(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", "http://127.0.0.1:1", token="abc")
    transport = transport_from_kubeconfig(path)
    try:
        assert transport.server_url == "http://127.0.0.1:1"
        assert transport._client.headers["authorization"] == "Bearer abc"
    finally:
        await transport.close()
