"""kubectl against a secured `gpufleet up`: TLS with the generated CA, the admin token of the
generated kubeconfig, team tokens from `gpufleet token create`, and RBAC answers kubectl
prints as it would against a real cluster."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from e2e_helpers import Cluster, Kubectl

pytestmark = pytest.mark.e2e


def gpufleet(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", *args, "--kubeconfig", cluster.kubeconfig],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"gpufleet {' '.join(args)}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def as_user(kubectl: Kubectl, kubeconfig: Path) -> Kubectl:
    return Kubectl(kubectl.binary, str(kubeconfig), tempfile.mkdtemp(prefix="kubectl-home-"))


def test_generated_kubeconfig_speaks_tls_with_an_admin_token(cluster: Cluster, kubectl: Kubectl) -> None:
    doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    entry = doc["clusters"][0]["cluster"]
    assert entry["server"].startswith("https://127.0.0.1:") and "insecure-skip-tls-verify" not in entry
    assert entry["certificate-authority-data"] and doc["users"][0]["user"]["token"]
    assert "No resources found in default namespace." in kubectl("get", "pods").ok().stderr
    assert kubectl("auth", "can-i", "create", "pods").ok().stdout.strip() == "yes"
    assert kubectl("auth", "can-i", "delete", "nodes").ok().stdout.strip() == "yes"
    who = kubectl("auth", "whoami", "-o", "json").ok()
    assert yaml.safe_load(who.stdout)["status"]["userInfo"] == {
        "username": "admin", "groups": ["system:masters", "system:authenticated"]}


def test_team_token_is_confined_to_its_namespace(cluster: Cluster, kubectl: Kubectl, tmp_path: Path) -> None:
    for ns in ("team-a", "team-b"):
        kubectl("create", "namespace", ns).ok()
    kubeconfig = tmp_path / "alice.kubeconfig"
    gpufleet(cluster, "token", "create", "--namespace", "team-a", "--role", "edit", "--user", "alice",
             "--write-kubeconfig", str(kubeconfig))
    alice = as_user(kubectl, kubeconfig)
    # Its own namespace (the kubeconfig's default): everything edit allows.
    assert "No resources found in team-a namespace." in alice("get", "pods").ok().stderr
    assert alice("create", "configmap", "settings", "--from-literal=k=v").ok().stdout.strip() == \
        "configmap/settings created"
    assert alice("auth", "can-i", "create", "deployments").ok().stdout.strip() == "yes"
    # Anywhere else: Kubernetes' Forbidden, word for word.
    denied = alice("get", "pods", "-n", "team-b").failed()
    assert denied.stderr.strip() == ('Error from server (Forbidden): pods is forbidden: User "alice" cannot list '
                                     'resource "pods" in API group "" in the namespace "team-b"')
    denied = alice("delete", "configmap", "x", "-n", "team-b").failed()
    assert 'configmaps "x" is forbidden: User "alice" cannot delete resource "configmaps"' in denied.stderr
    no = alice("auth", "can-i", "list", "pods", "-n", "team-b")
    assert (no.returncode, no.stdout.strip()) == (1, "no")
    assert alice("auth", "can-i", "list", "nodes").stdout.strip() == "no"
    assert "alice" in alice("auth", "whoami").ok().stdout
    rules = {line.split()[0]: line for line in alice("auth", "can-i", "--list").ok().stdout.splitlines()[1:]}
    assert "create" in rules["deployments.apps"] and "delete" in rules["configmaps"]
    assert "resourcequotas" in rules and "create" not in rules["resourcequotas"]
    assert "nodes" not in rules
    assert "configmaps" not in alice("auth", "can-i", "--list", "-n", "team-b").ok().stdout


def test_requests_without_a_valid_token_are_turned_away(cluster: Cluster, kubectl: Kubectl,
                                                        tmp_path: Path) -> None:
    made = gpufleet(cluster, "token", "create", "--namespace", "default", "--role", "view", "-o", "json")
    token = yaml.safe_load(made.stdout)
    doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    doc["users"][0]["user"] = {"token": token["token"]}
    revoked = tmp_path / "revoked.kubeconfig"
    revoked.write_text(yaml.safe_dump(doc))
    assert "No resources found" in as_user(kubectl, revoked)("get", "pods").ok().stderr
    gpufleet(cluster, "token", "delete", token["id"])
    doc["users"][0]["user"] = {"token": token["token"][:-1] + "x"}
    forged = tmp_path / "forged.kubeconfig"
    forged.write_text(yaml.safe_dump(doc))
    for path in (forged, revoked):
        result = as_user(kubectl, path)("get", "pods").failed()
        assert "You must be logged in to the server" in result.stderr, result
