"""The pure parts of authentication and authorization: token files, rule matching, the
default roles, the PKI."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography import x509

from gpufleet.apiserver.admission import UserInfo
from gpufleet.apiserver.auth.certs import ensure_pki
from gpufleet.apiserver.auth.nodeauthz import NodeAuthorizer, pod_references
from gpufleet.apiserver.auth.rbac import Attributes, Decision, bootstrap_policy, rule_allows, subject_matches
from gpufleet.apiserver.auth.tokens import TokenFileError, ensure_admin_token, parse_token_csv
from gpufleet.apiserver.requestinfo import parse_request


def test_static_token_file_in_kubernetes_csv_format() -> None:
    tokens = parse_token_csv('# admins\nt1,alice,u1,"system:masters,ops"\nt2,bob,u2\n\n')
    assert tokens["t1"] == UserInfo("alice", ["system:masters", "ops"])
    assert tokens["t2"] == UserInfo("bob", [])
    with pytest.raises(TokenFileError, match=r"tokens.csv:1: expected token,user,uid"):
        parse_token_csv("t3,carol\n", "tokens.csv")


def test_admin_token_is_made_once(tmp_path: Path) -> None:
    path = tmp_path / "tokens.csv"
    path.write_text("t2,bob,u2\n")
    token = ensure_admin_token(path)
    assert ensure_admin_token(path) == token
    assert parse_token_csv(path.read_text())[token] == UserInfo("admin", ["system:masters"])
    assert path.stat().st_mode & 0o077 == 0


def attrs(method: str, path: str) -> Attributes:
    return Attributes.from_request(parse_request(method, path, False))


@pytest.mark.parametrize(("rule", "method", "path", "allowed"), [
    ({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}, "GET", "/api/v1/namespaces/a/pods/p", True),
    ({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}, "GET", "/api/v1/namespaces/a/pods", False),
    ({"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}, "GET", "/api/v1/namespaces/a/pods/p/log", False),
    ({"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}, "GET", "/api/v1/namespaces/a/pods/p/log",
     True),
    ({"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["patch"]},
     "PATCH", "/apis/apps/v1/namespaces/a/deployments/d/status", True),
    ({"apiGroups": ["apps"], "resources": ["*"], "verbs": ["list"]}, "GET", "/api/v1/pods", False),
    ({"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["c1"], "verbs": ["get", "update"]},
     "PUT", "/api/v1/namespaces/a/configmaps/c1", True),
    ({"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["c1"], "verbs": ["get", "update"]},
     "PUT", "/api/v1/namespaces/a/configmaps/c2", False),
    ({"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["c1"], "verbs": ["list"]},
     "GET", "/api/v1/namespaces/a/configmaps", False),
    ({"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}, "DELETE", "/api/v1/namespaces/a/pods", False),
    ({"apiGroups": [""], "resources": ["pods"], "verbs": ["deletecollection"]}, "DELETE", "/api/v1/namespaces/a/pods",
     True),
    ({"nonResourceURLs": ["/apis/*"], "verbs": ["get"]}, "GET", "/apis/apps/v1", True),
    ({"nonResourceURLs": ["/apis"], "verbs": ["get"]}, "GET", "/apis/apps", False),
    ({"nonResourceURLs": ["/healthz"], "verbs": ["get"]}, "POST", "/healthz", False),
    ({"nonResourceURLs": ["*"], "verbs": ["*"]}, "GET", "/api/v1/namespaces/a/pods", False),
])
def test_rule_matching(rule: dict, method: str, path: str, allowed: bool) -> None:
    assert rule_allows(rule, attrs(method, path)) is allowed


def test_watch_and_namespace_attributes() -> None:
    watch = Attributes.from_request(parse_request("GET", "/api/v1/namespaces/a/pods", True))
    assert (watch.verb, watch.namespace) == ("watch", "a")
    # A Namespace object counts as inside itself, so a RoleBinding in "a" may reach it.
    assert attrs("GET", "/api/v1/namespaces/a").namespace == "a"


def test_proxy_paths_and_field_selectors_reach_the_authorizer() -> None:
    proxy = Attributes.from_request(parse_request("GET", "/api/v1/nodes/n1/proxy/stats/summary", False))
    assert (proxy.verb, proxy.resource, proxy.name, proxy.subresource) == ("get", "nodes", "n1", "proxy")
    assert rule_allows({"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}, proxy)
    assert not rule_allows({"apiGroups": [""], "resources": ["nodes"], "verbs": ["*"]}, proxy)
    # Other subresources keep refusing deeper paths (they are not resource requests).
    assert not parse_request("GET", "/api/v1/namespaces/a/pods/p/log/more", False).is_resource_request
    listed = Attributes.from_request(parse_request("GET", "/api/v1/pods", True, "spec.nodeName=n1"))
    assert (listed.verb, listed.field_selector) == ("watch", "spec.nodeName=n1")


async def test_node_authorizer_scopes_pod_lists_to_the_node() -> None:
    node = NodeAuthorizer(store=None)  # type: ignore[arg-type]  # pods decisions read no store

    async def decide(verb: str, selector: str = "", subresource: str = "") -> Decision | None:
        return await node.decide("n1", Attributes(verb=verb, resource="pods", field_selector=selector,
                                                  subresource=subresource))
    refused = Decision(False, "can only list/watch pods with spec.nodeName field selector")
    for verb in ("list", "watch"):
        assert (await decide(verb, "spec.nodeName=n1")).allowed
        assert (await decide(verb, "spec.nodeName==n1,status.phase=Running")).allowed
        for selector in ("", "spec.nodeName=n2", "spec.nodeName!=n1", "spec.nodeName=n1x", "metadata.name=n1",
                         "spec.nodeName"):
            assert await decide(verb, selector) == refused, selector
    # get, writes and subresources are left to RBAC and NodeRestriction.
    assert await decide("get") is None and await decide("patch") is None
    assert await decide("list", subresource="status") is None


def test_subjects() -> None:
    alice = UserInfo("alice", ["team", "system:authenticated"])
    assert subject_matches({"kind": "User", "name": "alice"}, alice)
    assert subject_matches({"kind": "Group", "name": "team"}, alice)
    assert not subject_matches({"kind": "User", "name": "team"}, alice)
    sa = UserInfo("system:serviceaccount:ns1:builder", [])
    assert subject_matches({"kind": "ServiceAccount", "name": "builder"}, sa, "ns1")
    assert not subject_matches({"kind": "ServiceAccount", "name": "builder", "namespace": "ns2"}, sa, "ns1")


def test_default_roles_nest_view_in_edit_in_admin() -> None:
    roles = {o["metadata"]["name"]: o["rules"] for o in bootstrap_policy() if o["kind"] == "ClusterRole"}
    assert {"cluster-admin", "admin", "edit", "view"} <= set(roles)

    def can(role: str, method: str, path: str) -> bool:
        return any(rule_allows(r, attrs(method, path)) for r in roles[role])
    secrets = "/api/v1/namespaces/a/secrets"
    assert not can("view", "GET", secrets) and can("edit", "GET", secrets)
    assert can("view", "GET", "/api/v1/namespaces/a/pods/p/log")
    assert not can("view", "POST", "/apis/apps/v1/namespaces/a/deployments")
    assert can("edit", "POST", "/apis/apps/v1/namespaces/a/deployments")
    assert can("edit", "PATCH", "/apis/apps/v1/namespaces/a/deployments/d/scale")
    rb = "/apis/rbac.authorization.k8s.io/v1/namespaces/a/rolebindings"
    assert not can("edit", "POST", rb) and can("admin", "POST", rb)
    assert can("cluster-admin", "DELETE", "/api/v1/nodes/n") and can("cluster-admin", "GET", "/metrics")
    # EndpointSlices: read by all three (kubectl describe ingress lists them), written by none,
    # as Kubernetes' roles have it.
    slices = "/apis/discovery.k8s.io/v1/namespaces/a/endpointslices"
    for role in ("view", "edit", "admin"):
        assert can(role, "GET", slices) and can(role, "GET", f"{slices}/web-x") and not can(role, "POST", slices)


def test_edit_and_admin_may_act_as_their_namespace_service_accounts() -> None:
    """As Kubernetes' edit role (aggregated into admin): ``impersonate`` on serviceaccounts,
    and nothing else to impersonate; view gets none of it."""
    roles = {o["metadata"]["name"]: o["rules"] for o in bootstrap_policy() if o["kind"] == "ClusterRole"}

    def can(role: str, attributes: Attributes) -> bool:
        return any(rule_allows(r, attributes) for r in roles[role])
    as_sa = Attributes(verb="impersonate", resource="serviceaccounts", namespace="a", name="builder")
    assert can("edit", as_sa) and can("admin", as_sa) and not can("view", as_sa)
    for other in (Attributes(verb="impersonate", resource="users", name="alice"),
                  Attributes(verb="impersonate", resource="groups", name="system:masters"),
                  Attributes(verb="impersonate", group="authentication.k8s.io", resource="uids", name="42")):
        assert not can("edit", other) and not can("admin", other), other


def test_pki_is_made_once_and_verifies(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki", ["127.0.0.1", "localhost"])
    ca = pki.ca_cert.read_bytes()
    cert = pki.cert.read_bytes()
    again = ensure_pki(tmp_path / "pki", ["127.0.0.1", "localhost"])
    assert again.ca_cert.read_bytes() == ca and again.cert.read_bytes() == cert
    assert pki.key.stat().st_mode & 0o077 == 0
    # A new name gets a new serving certificate from the same CA.
    wider = ensure_pki(tmp_path / "pki", ["127.0.0.1", "gpu-head.example"])
    assert wider.ca_cert.read_bytes() == ca and wider.cert.read_bytes() != cert
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(str(wider.cert), str(wider.key))  # the key matches the certificate
    leaf = x509.load_pem_x509_certificate(wider.cert.read_bytes())
    leaf.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "gpu-head.example" in names.get_values_for_type(x509.DNSName)


def test_every_way_a_pod_references_secrets_configmaps_claims_and_its_service_account() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {
        "serviceAccountName": "trainer",
        "imagePullSecrets": [{"name": "pull"}],
        "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "init-env"}}]}],
        "containers": [{"name": "c",
                        "envFrom": [{"configMapRef": {"name": "cm-env"}, "prefix": "X_"}],
                        "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "key", "key": "k"}}},
                                {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm-key", "key": "k"}}},
                                {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                {"name": "D", "value": "plain"}]}],
        "ephemeralContainers": [{"name": "e", "env": [{"name": "E", "valueFrom": {
            "secretKeyRef": {"name": "debug", "key": "k"}}}]}],
        "volumes": [
            {"name": "v1", "secret": {"secretName": "vol"}},
            {"name": "v2", "configMap": {"name": "cm-vol"}},
            {"name": "v3", "projected": {"sources": [{"secret": {"name": "proj"}},
                                                     {"configMap": {"name": "cm-proj"}},
                                                     {"serviceAccountToken": {"path": "t"}}]}},
            {"name": "v4", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "csi"}}},
            {"name": "v5", "azureFile": {"secretName": "azure", "shareName": "s"}},
            {"name": "v6", "emptyDir": {}},
            {"name": "v7", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
        ]}}
    assert pod_references(pod) == {
        "secrets": {"pull", "init-env", "key", "debug", "vol", "proj", "csi", "azure"},
        "configmaps": {"cm-env", "cm-key", "cm-vol", "cm-proj"},
        "persistentvolumeclaims": {"data", "p-scratch"},
        "serviceaccounts": {"trainer"},
    }
    none = {"secrets": set(), "configmaps": set(), "persistentvolumeclaims": set(), "serviceaccounts": set()}
    assert pod_references({"spec": {"containers": [{"name": "c"}]}}) == none
    # Malformed shapes (the authorizer reads whatever the store holds) reference nothing.
    assert pod_references({"spec": {"volumes": "x", "containers": [{"env": [None, {"valueFrom": 3}]}]}}) == none
    assert pod_references({"metadata": [], "spec": {"volumes": [{"persistentVolumeClaim": "x"}, {"ephemeral": 1}]}}) \
        == none
