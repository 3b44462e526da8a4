"""Workload identity against a real `gpufleet up`: `kubectl create token` (1.27-1.33), the
token signing in as its service account through kubectl and the official Python client
(`client.Configuration` with an api_key, and the in-cluster loader reading the files a pod's
kube-api-access volume holds), with RBAC deciding what it may do."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import jwt
import pytest
import yaml
from e2e_helpers import Cluster, Kubectl, kubectl_binary, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.config.incluster_config import InClusterConfigLoader

pytestmark = pytest.mark.e2e

ISSUER = "https://kubernetes.default.svc.cluster.local"
NS = "identity"


@pytest.fixture(scope="module")
def admin(kubectl: Kubectl) -> Kubectl:
    kubectl("create", "namespace", NS).ok()
    # The controllers give the namespace its default service account and the CA.
    wait_for(lambda: kubectl("get", "sa", "default", "-n", NS).returncode == 0, what="the default service account")
    wait_for(lambda: kubectl("get", "cm", "kube-root-ca.crt", "-n", NS).returncode == 0, what="kube-root-ca.crt")
    kubectl("create", "serviceaccount", "trainer", "-n", NS).ok()
    return kubectl


def claims(token: str) -> dict:
    return jwt.decode(token, options={"verify_signature": False})


@pytest.mark.parametrize("version", ["1.27", "1.28", "1.29", "1.30", "1.31", None, "1.33"])
def test_kubectl_create_token(admin: Kubectl, kubectl_factory: Callable[[str], Kubectl], cluster: Cluster,
                              version: str | None) -> None:
    kc = kubectl_factory(kubectl_binary(version))
    token = kc("create", "token", "trainer", "-n", NS).ok().stdout.strip()
    c = claims(token)
    assert c["sub"] == f"system:serviceaccount:{NS}:trainer" and c["aud"] == [ISSUER] and c["iss"] == ISSUER
    assert c["exp"] - c["iat"] == 3600
    # Verified with the control plane's public key, as any JWT consumer would.
    public = (cluster.state_dir / "pki" / "sa.pub").read_bytes()
    jwt.decode(token, public, algorithms=["RS256"], audience=ISSUER)

    longer = claims(kc("create", "token", "trainer", "-n", NS, "--duration", "2h", "--audience", "vault",
                       "--audience", ISSUER).ok().stdout.strip())
    assert longer["exp"] - longer["iat"] == 7200 and longer["aud"] == ["vault", ISSUER]
    short = kc("create", "token", "trainer", "-n", NS, "--duration", "5m").failed()
    assert ("spec.expirationSeconds: Invalid value: 300: may not specify a duration less than 10 minutes"
            in short.stderr)
    missing = kc("create", "token", "ghost", "-n", NS).failed()
    assert 'serviceaccounts "ghost" not found' in missing.stderr


def test_a_pod_bound_token_and_whoami(admin: Kubectl, tmp_path: Path) -> None:
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "job-0", "namespace": NS},
                "spec": {"serviceAccountName": "trainer", "containers": [{"name": "main", "image": "busybox"}]}}
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(manifest))
    admin("apply", "-f", str(tmp_path / "pod.yaml")).ok()
    pod = json.loads(admin("get", "pod", "job-0", "-n", NS, "-o", "json").ok().stdout)
    volumes = [v for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access-")]
    assert len(volumes) == 1
    assert pod["spec"]["containers"][0]["volumeMounts"] == [
        {"name": volumes[0]["name"], "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True}]

    token = admin("create", "token", "trainer", "-n", NS, "--bound-object-kind", "Pod",
                  "--bound-object-name", "job-0").ok().stdout.strip()
    assert claims(token)["kubernetes.io"]["pod"] == {"name": "job-0", "uid": pod["metadata"]["uid"]}
    who = json.loads(admin("auth", "whoami", "--token", token, "-o", "json").ok().stdout)["status"]["userInfo"]
    assert who["username"] == f"system:serviceaccount:{NS}:trainer"
    assert who["groups"] == ["system:serviceaccounts", f"system:serviceaccounts:{NS}", "system:authenticated"]
    assert who["extra"]["authentication.kubernetes.io/pod-name"] == ["job-0"]
    table = admin("auth", "whoami", "--token", token).ok().stdout
    assert f"system:serviceaccount:{NS}:trainer" in table

    denied = admin("get", "pods", "-n", NS, "--token", token).failed()
    assert (f'User "system:serviceaccount:{NS}:trainer" cannot list resource "pods" in API group "" in the '
            f'namespace "{NS}"') in denied.stderr
    # The pod gone, its token is worth nothing (no node: the pod is deleted at once).
    admin("delete", "pod", "job-0", "-n", NS, "--wait=true").ok()
    gone = admin("auth", "whoami", "--token", token).failed()
    assert "Unauthorized" in gone.stderr or "provide credentials" in gone.stderr


def test_the_python_client_authenticates_with_the_token(admin: Kubectl, cluster: Cluster) -> None:
    token = admin("create", "token", "trainer", "-n", NS).ok().stdout.strip()
    configuration = client.Configuration()
    configuration.host = cluster.url
    configuration.api_key = {"authorization": token}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    configuration.ssl_ca_cert = str(cluster.state_dir / "pki" / "ca.crt")
    with client.ApiClient(configuration) as api:
        core = client.CoreV1Api(api)
        with pytest.raises(ApiException) as denied:
            core.list_namespaced_pod(NS)
        assert denied.value.status == 403
        admin("create", "rolebinding", "trainer-views", "-n", NS, "--clusterrole", "view",
              f"--serviceaccount={NS}:trainer").ok()
        assert core.list_namespaced_pod(NS).items is not None
        with pytest.raises(ApiException) as elsewhere:
            core.list_namespaced_pod("default")
        assert elsewhere.value.status == 403
        review = client.AuthenticationV1Api(api).create_self_subject_review(
            client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview"))
        assert review.status.user_info.username == f"system:serviceaccount:{NS}:trainer"


def test_in_cluster_config_from_the_files_of_a_pods_volume(admin: Kubectl, cluster: Cluster) -> None:
    """What `config.load_incluster_config()` does in a pod, from the files its kube-api-access
    volume holds: the token, the published CA (kube-root-ca.crt) and the service address."""
    ca = json.loads(admin("get", "cm", "kube-root-ca.crt", "-n", NS, "-o", "json").ok().stdout)["data"]["ca.crt"]
    assert ca == (cluster.state_dir / "pki" / "ca.crt").read_text()
    mount = Path(tempfile.mkdtemp(prefix="serviceaccount-"))
    (mount / "token").write_text(admin("create", "token", "trainer", "-n", NS).ok().stdout.strip())
    (mount / "ca.crt").write_text(ca)
    port = cluster.url.rsplit(":", 1)[1]
    loader = InClusterConfigLoader(token_filename=str(mount / "token"), cert_filename=str(mount / "ca.crt"),
                                   environ={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port})
    configuration = client.Configuration()
    loader.load_and_set(configuration)
    with client.ApiClient(configuration) as api:
        review = client.AuthenticationV1Api(api).create_self_subject_review(
            client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview"))
        assert review.status.user_info.username == f"system:serviceaccount:{NS}:trainer"
