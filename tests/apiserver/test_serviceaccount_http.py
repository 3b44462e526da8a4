"""Workload identity over the real TLS listener of an in-process control plane (no
controllers): the TokenRequest API, signing in with its tokens, RBAC for service accounts,
the ServiceAccount admission plugin, and what a node may ask for its pods."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography import x509

from gpufleet.agent.bootstrap import node_token
from gpufleet.apiserver.auth.certs import IN_CLUSTER_NAMES, ensure_pki, serving_hosts
from gpufleet.apiserver.auth.serviceaccounts import DEFAULT_ISSUER, load_public_keys
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client import Client, HttpTransport
from gpufleet.utils.clock import rfc3339
from gpufleet.utils.http import RawResponse

SA_PATH = "/api/v1/namespaces/{ns}/serviceaccounts/{name}/token"
MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    plane = ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path / "state",
                         run_controllers=False)
    await plane.start()
    yield plane
    await plane.stop()


def connect(cp: ControlPlane, token: str | None) -> Client:
    return Client(HttpTransport(cp.url, token=token, ca_data=cp.ca_pem), read_retries=1)


async def send(c: Client, method: str, path: str, body: Any = None) -> RawResponse:
    content = json.dumps(body) if body is not None else None
    headers = {"content-type": "application/json"} if content is not None else None
    return await c.raw_request(method, path, content=content, headers=headers, raise_for_status=False)


def body(resp: RawResponse) -> dict[str, Any]:
    return json.loads(resp.body)


async def create(c: Client, obj: dict[str, Any]) -> dict[str, Any]:
    return await c.create(obj, raw=True)


def sa(name: str, ns: str = "default", **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}, **fields}


def pod(name: str, ns: str = "default", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec}}


def token_request(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


async def request_token(c: Client, name: str, ns: str = "default", **spec: Any) -> RawResponse:
    return await send(c, "POST", SA_PATH.format(ns=ns, name=name), token_request(**spec))


async def issued(c: Client, name: str, ns: str = "default", **spec: Any) -> str:
    r = await request_token(c, name, ns, **spec)
    assert r.status == 201, r.body
    return body(r)["status"]["token"]


async def whoami(c: Client) -> dict[str, Any]:
    r = await send(c, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                   {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    assert r.status == 201, r.body
    return body(r)["status"]["userInfo"]


# -- TokenRequest -------------------------------------------------------------------------


async def test_token_request_answers_a_token_request_with_a_signed_token(cp: ControlPlane) -> None:
    admin = connect(cp, cp.admin_token)
    account = await create(admin, sa("bot"))
    r = await request_token(admin, "bot")
    assert r.status == 201, r.body
    answer = body(r)
    assert answer["apiVersion"] == "authentication.k8s.io/v1" and answer["kind"] == "TokenRequest"
    assert answer["metadata"]["name"] == "bot" and answer["metadata"]["namespace"] == "default"
    assert answer["metadata"]["uid"] == account["metadata"]["uid"]
    assert answer["spec"] == {"audiences": [DEFAULT_ISSUER], "expirationSeconds": 3600, "boundObjectRef": None}
    token = answer["status"]["token"]
    assert cp.state_dir is not None
    public = load_public_keys(cp.state_dir / "pki" / "sa.pub")[0]
    claims = jwt.decode(token, public, algorithms=["RS256"], audience=DEFAULT_ISSUER)
    assert claims["iss"] == DEFAULT_ISSUER and claims["sub"] == "system:serviceaccount:default:bot"
    assert claims["exp"] - claims["iat"] == 3600 and claims["nbf"] == claims["iat"] and claims["jti"]
    assert claims["kubernetes.io"] == {"namespace": "default",
                                       "serviceaccount": {"name": "bot", "uid": account["metadata"]["uid"]}}
    assert answer["status"]["expirationTimestamp"] == rfc3339(claims["exp"])
    for p in ("sa.key", "sa.pub"):
        assert (cp.state_dir / "pki" / p).stat().st_mode & 0o777 == 0o600


async def test_token_request_validation_speaks_kubernetes(cp: ControlPlane) -> None:
    admin = connect(cp, cp.admin_token)
    await create(admin, sa("bot"))
    await create(admin, sa("other"))
    r = await request_token(admin, "bot", expirationSeconds=599)
    assert r.status == 422
    assert body(r)["message"] == ('TokenRequest.authentication.k8s.io "" is invalid: spec.expirationSeconds: '
                                  "Invalid value: 599: may not specify a duration less than 10 minutes")
    assert body(r)["details"]["causes"][0]["field"] == "spec.expirationSeconds"
    r = await request_token(admin, "nobody")
    assert (r.status, body(r)["message"]) == (404, 'serviceaccounts "nobody" not found')
    r = await request_token(admin, "bot", boundObjectRef={"apiVersion": "v1", "kind": "Pod", "name": "missing"})
    assert (r.status, body(r)["message"]) == (404, 'pods "missing" not found')
    runs_as_other = await create(admin, pod("p", serviceAccountName="other"))
    r = await request_token(admin, "bot", boundObjectRef={"apiVersion": "v1", "kind": "Pod", "name": "p"})
    assert (r.status, body(r)["message"]) == (
        400, 'cannot bind token for serviceaccount "bot" to pod running with different serviceaccount name.')
    r = await request_token(admin, "other", boundObjectRef={"apiVersion": "v1", "kind": "Pod", "name": "p",
                                                            "uid": "not-its-uid"})
    assert r.status == 409
    assert "the UID in the bound object reference (not-its-uid) does not match the UID in record" in body(r)["message"]
    r = await request_token(admin, "other", boundObjectRef={"apiVersion": "v1", "kind": "Pod", "name": "p",
                                                            "uid": runs_as_other["metadata"]["uid"]})
    assert r.status == 201
    r = await request_token(admin, "bot", boundObjectRef={"apiVersion": "apps/v1", "kind": "Deployment",
                                                          "name": "d"})
    assert (r.status, body(r)["message"]) == (400, "cannot bind token to object of type apps/v1, Kind=Deployment")
    r = await send(admin, "POST", SA_PATH.format(ns="default", name="bot"),
                   {**token_request(), "metadata": {"name": "other"}})
    assert r.status == 422 and "metadata.name: Invalid value: \"other\": must match the service account name" in \
        body(r)["message"]
    r = await send(admin, "GET", SA_PATH.format(ns="default", name="bot"))
    assert r.status == 405


async def test_creating_tokens_is_rbac_create_on_serviceaccounts_token(cp: ControlPlane) -> None:
    admin = connect(cp, cp.admin_token)
    await create(admin, sa("bot"))
    await create(admin, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    await create(admin, sa("bot", "team"))
    alice = connect(cp, await issued(admin, "bot", "team"))
    r = await request_token(alice, "bot")
    assert r.status == 403
    assert body(r)["message"] == ('serviceaccounts "bot" is forbidden: User "system:serviceaccount:team:bot" cannot '
                                  'create resource "serviceaccounts/token" in API group "" in the namespace "default"')
    await create(admin, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                         "metadata": {"name": "edit", "namespace": "default"},
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                         "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": "team"}]})
    assert (await request_token(alice, "bot")).status == 201  # edit holds serviceaccounts/token create


# -- signing in with the token, and RBAC ----------------------------------------------------


async def test_a_service_account_is_who_its_token_says_and_rbac_applies(cp: ControlPlane) -> None:
    admin = connect(cp, cp.admin_token)
    for ns in ("team", "elsewhere"):
        await create(admin, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    account = await create(admin, sa("trainer", "team"))
    await create(admin, sa("default", "team"))
    bound = await create(admin, pod("job-0", "team", serviceAccountName="trainer"))
    token = await issued(admin, "trainer", "team",
                         boundObjectRef={"apiVersion": "v1", "kind": "Pod", "name": "job-0"})
    trainer = connect(cp, token)
    me = await whoami(trainer)
    assert me["username"] == "system:serviceaccount:team:trainer"
    assert me["uid"] == account["metadata"]["uid"]
    assert me["groups"] == ["system:serviceaccounts", "system:serviceaccounts:team", "system:authenticated"]
    assert me["extra"]["authentication.kubernetes.io/pod-name"] == ["job-0"]
    assert me["extra"]["authentication.kubernetes.io/pod-uid"] == [bound["metadata"]["uid"]]
    assert me["extra"]["authentication.kubernetes.io/credential-id"][0].startswith("JTI=")

    pods = "/api/v1/namespaces/team/pods"
    r = await send(trainer, "GET", pods)
    assert r.status == 403 and body(r)["message"] == (
        'pods is forbidden: User "system:serviceaccount:team:trainer" cannot list resource "pods" in API group "" '
        'in the namespace "team"')
    # A RoleBinding naming the service account (namespace defaulted to the binding's) grants it.
    await create(admin, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                         "metadata": {"name": "pod-reader", "namespace": "team"},
                         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]})
    await create(admin, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                         "metadata": {"name": "trainer-reads-pods", "namespace": "team"},
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
                         "subjects": [{"kind": "ServiceAccount", "name": "trainer"}]})
    r = await send(trainer, "GET", pods)
    assert r.status == 200 and [p["metadata"]["name"] for p in body(r)["items"]] == ["job-0"]
    assert (await send(trainer, "DELETE", f"{pods}/job-0")).status == 403
    assert (await send(trainer, "GET", "/api/v1/namespaces/elsewhere/pods")).status == 403
    # The access review says why.
    r = await send(trainer, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                   {"spec": {"resourceAttributes": {"namespace": "team", "verb": "list", "resource": "pods"}}})
    assert body(r)["status"] == {"allowed": True, "reason": 'RBAC: allowed by RoleBinding "trainer-reads-pods/team" '
                                                            'of Role "pod-reader" to ServiceAccount "trainer/team"'}
    # The namespace's service accounts group, bound in another namespace.
    await create(admin, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                         "metadata": {"name": "team-views", "namespace": "elsewhere"},
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
                         "subjects": [{"kind": "Group", "name": "system:serviceaccounts:team"}]})
    assert (await send(trainer, "GET", "/api/v1/namespaces/elsewhere/pods")).status == 200

    # Deleting the bound pod revokes the token at once (it had no grace period: not on a node).
    assert (await send(admin, "DELETE", f"{pods}/job-0")).status == 200
    assert (await send(trainer, "GET", pods)).status == 401


async def test_a_service_account_recreated_under_its_name_does_not_inherit_old_tokens(cp: ControlPlane) -> None:
    admin = connect(cp, cp.admin_token)
    await create(admin, sa("bot"))
    old = connect(cp, await issued(admin, "bot"))
    assert (await whoami(old))["username"] == "system:serviceaccount:default:bot"
    assert (await send(admin, "DELETE", "/api/v1/namespaces/default/serviceaccounts/bot")).status == 200
    await create(admin, sa("bot"))
    assert (await send(old, "GET", "/api")).status == 401


async def test_tokens_for_other_audiences_do_not_open_the_api(cp: ControlPlane) -> None:
    admin = connect(cp, cp.admin_token)
    await create(admin, sa("bot"))
    vault_only = await issued(admin, "bot", audiences=["vault"])
    assert (await send(connect(cp, vault_only), "GET", "/api")).status == 401
    both = await issued(admin, "bot", audiences=["vault", DEFAULT_ISSUER])
    assert (await send(connect(cp, both), "GET", "/api")).status == 200


async def test_a_projected_volume_token_is_extended_and_warns_after_its_time(cp: ControlPlane) -> None:
    admin = connect(cp, cp.admin_token)
    await create(admin, sa("default"))
    p = await create(admin, pod("p"))
    r = await request_token(admin, "default", expirationSeconds=3607,
                            boundObjectRef={"apiVersion": "v1", "kind": "Pod", "name": "p",
                                            "uid": p["metadata"]["uid"]})
    assert r.status == 201
    claims = jwt.decode(body(r)["status"]["token"], options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == 365 * 24 * 3600
    assert claims["kubernetes.io"]["warnafter"] - claims["iat"] == 3607
    assert claims["kubernetes.io"]["pod"] == {"name": "p", "uid": p["metadata"]["uid"]}
    # What was asked for is what status reports.
    assert body(r)["spec"]["expirationSeconds"] == 3607


# -- the ServiceAccount admission plugin -----------------------------------------------------


def api_access_volume(name: str) -> dict[str, Any]:
    return {"name": name, "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                    "path": "namespace"}]}},
    ]}}


async def test_a_pod_gets_its_service_account_and_the_api_access_volume(cp: ControlPlane) -> None:
    admin = connect(cp, cp.admin_token)
    await create(admin, sa("default"))
    created = await create(admin, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
        "spec": {"initContainers": [{"name": "init", "image": "busybox"}],
                 "containers": [{"name": "a", "image": "busybox"},
                                {"name": "b", "image": "busybox",
                                 "volumeMounts": [{"name": "own", "mountPath": MOUNT}]}],
                 "volumes": [{"name": "own", "emptyDir": {}}]}})
    spec = created["spec"]
    assert spec["serviceAccountName"] == spec["serviceAccount"] == "default"
    [volume] = [v for v in spec["volumes"] if v["name"] != "own"]
    assert volume["name"].startswith("kube-api-access-") and len(volume["name"]) == len("kube-api-access-") + 5
    assert all(ch in "bcdfghjklmnpqrstvwxz2456789" for ch in volume["name"][-5:])
    assert volume == api_access_volume(volume["name"])
    mount = {"name": volume["name"], "readOnly": True, "mountPath": MOUNT}
    assert spec["initContainers"][0]["volumeMounts"] == [mount]
    assert spec["containers"][0]["volumeMounts"] == [mount]
    # A container that mounts something there already keeps its own.
    assert spec["containers"][1]["volumeMounts"] == [{"name": "own", "mountPath": MOUNT}]
    # Read back, it is exactly what was stored.
    assert (await admin.get("pods", "p", "default", raw=True))["spec"] == spec


async def test_automount_false_on_the_pod_or_its_service_account(cp: ControlPlane) -> None:
    admin = connect(cp, cp.admin_token)
    await create(admin, sa("default"))
    await create(admin, sa("quiet", automountServiceAccountToken=False,
                           imagePullSecrets=[{"name": "registry"}]))
    off = (await create(admin, pod("off", automountServiceAccountToken=False)))["spec"]
    assert "volumes" not in off and "volumeMounts" not in off["containers"][0]
    assert off["serviceAccountName"] == "default"
    quiet = (await create(admin, pod("quiet", serviceAccountName="quiet")))["spec"]
    assert "volumes" not in quiet and "volumeMounts" not in quiet["containers"][0]
    assert quiet["imagePullSecrets"] == [{"name": "registry"}]
    # The pod's own choice wins over its service account's, as in Kubernetes.
    wants = (await create(admin, pod("wants", serviceAccountName="quiet", automountServiceAccountToken=True)))["spec"]
    assert [v["name"][:16] for v in wants["volumes"]] == ["kube-api-access-"]


async def test_a_pod_naming_a_missing_service_account_is_refused(cp: ControlPlane) -> None:
    admin = connect(cp, cp.admin_token)
    r = await send(admin, "POST", "/api/v1/namespaces/default/pods", pod("p", serviceAccountName="ghost"))
    assert r.status == 403
    assert body(r)["message"] == ('pods "p" is forbidden: error looking up service account default/ghost: '
                                  'serviceaccount "ghost" not found')
    generated = {**pod("x", serviceAccountName="ghost"), "metadata": {"generateName": "web-7c5d-"}}
    r = await send(admin, "POST", "/api/v1/namespaces/default/pods", generated)
    assert body(r)["message"].startswith('pods "web-7c5d-" is forbidden: error looking up service account')


# -- the node's share -----------------------------------------------------------------------


async def test_a_node_asks_tokens_only_for_its_own_pods(cp: ControlPlane, tmp_path: Path) -> None:
    admin = connect(cp, cp.admin_token)
    n1 = connect(cp, await node_token(lambda t: connect(cp, t), cp.join_token, "n1", tmp_path / "n1"))
    for name in ("n1", "n2"):
        await create(admin, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    await create(admin, sa("default"))
    await create(admin, sa("trainer"))
    await create(admin, sa("idle"))
    mine = await create(admin, pod("mine", serviceAccountName="trainer", nodeName="n1"))
    theirs = await create(admin, pod("theirs", serviceAccountName="trainer", nodeName="n2"))

    def bound(p: dict[str, Any], **ref: Any) -> dict[str, Any]:
        return {"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": p["metadata"]["name"],
                                   "uid": p["metadata"]["uid"], **ref}, "expirationSeconds": 3607}

    r = await request_token(n1, "trainer", **bound(mine))
    assert r.status == 201, r.body
    claims = jwt.decode(body(r)["status"]["token"], options={"verify_signature": False})
    node = await admin.get("nodes", "n1", raw=True)
    assert claims["kubernetes.io"]["node"] == {"name": "n1", "uid": node["metadata"]["uid"]}
    user = await whoami(connect(cp, body(r)["status"]["token"]))
    assert user["extra"]["authentication.kubernetes.io/node-name"] == ["n1"]

    refusals = [
        (await request_token(n1, "trainer"), 'serviceaccounts "trainer" is forbidden: node requested token not '
                                             "bound to a pod"),
        (await request_token(n1, "trainer", **bound(mine, uid="")),
         'serviceaccounts "trainer" is forbidden: node requested token with a pod binding without a uid'),
        (await request_token(n1, "trainer", **bound(theirs)),
         'serviceaccounts "trainer" is forbidden: node requested token bound to a pod scheduled on a different node'),
        (await request_token(n1, "trainer", **bound(mine, uid="stale")),
         'serviceaccounts "trainer" is forbidden: the UID in the bound object reference (stale) does not match the '
         "UID in record. The object might have been deleted and then recreated"),
        # No pod of n1 runs as "idle": the Node authorizer refuses before the body is read.
        (await request_token(n1, "idle", **bound(mine)),
         'serviceaccounts "idle" is forbidden: User "system:node:n1" cannot create resource "serviceaccounts/token" '
         'in API group "" in the namespace "default": no relationship found between node \'n1\' and this object'),
    ]
    for resp, message in refusals:
        assert (resp.status, body(resp)["message"]) == (403, message)
    r = await send(n1, "GET", "/api/v1/namespaces/default/serviceaccounts/trainer")
    assert r.status == 403


async def test_a_node_reads_the_root_ca_of_its_pods_volume(cp: ControlPlane, tmp_path: Path) -> None:
    admin = connect(cp, cp.admin_token)
    n1 = connect(cp, await node_token(lambda t: connect(cp, t), cp.join_token, "n1", tmp_path / "n1"))
    await create(admin, sa("default"))
    await create(admin, {"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": "kube-root-ca.crt", "namespace": "default"},
                         "data": {"ca.crt": cp.ca_pem.decode()}})
    path = "/api/v1/namespaces/default/configmaps/kube-root-ca.crt"
    assert (await send(n1, "GET", path)).status == 403
    await create(admin, pod("p", nodeName="n1"))
    r = await send(n1, "GET", path)
    assert r.status == 200 and body(r)["data"]["ca.crt"] == cp.ca_pem.decode()


# -- the serving certificate ----------------------------------------------------------------


async def test_the_serving_certificate_names_the_in_cluster_addresses(cp: ControlPlane) -> None:
    assert cp.tls_cert_file is not None
    leaf = x509.load_pem_x509_certificate(cp.tls_cert_file.read_bytes())
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(IN_CLUSTER_NAMES) <= set(san.get_values_for_type(x509.DNSName))
    assert "10.96.0.1" in {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}


def test_an_older_serving_certificate_is_made_again_from_the_same_ca(tmp_path: Path) -> None:
    before = ensure_pki(tmp_path / "pki", ["127.0.0.1", "localhost"])  # as made before in-cluster names
    ca, old = before.ca_cert.read_bytes(), before.cert.read_bytes()
    after = ensure_pki(tmp_path / "pki", serving_hosts("127.0.0.1"))
    assert after.ca_cert.read_bytes() == ca and after.cert.read_bytes() != old
    leaf = x509.load_pem_x509_certificate(after.cert.read_bytes())
    leaf.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kubernetes.default.svc" in names.get_values_for_type(x509.DNSName)


async def test_the_deprecated_service_account_field_names_the_account(cp: ControlPlane) -> None:
    admin = connect(cp, cp.admin_token)
    await create(admin, sa("trainer"))
    spec = (await create(admin, pod("old-style", serviceAccount="trainer")))["spec"]
    assert spec["serviceAccountName"] == spec["serviceAccount"] == "trainer"
    spec = (await create(admin, pod("both", serviceAccount="ghost", serviceAccountName="trainer")))["spec"]
    assert spec["serviceAccountName"] == spec["serviceAccount"] == "trainer"


async def test_plain_http_issues_no_tokens_and_mounts_none(tmp_path: Path) -> None:
    plane = ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path / "state",
                         run_controllers=False, secure=False)
    await plane.start()
    try:
        c = Client(HttpTransport(plane.url))
        await create(c, sa("default"))
        spec = (await create(c, pod("p")))["spec"]
        assert spec["serviceAccountName"] == "default" and "volumes" not in spec
        r = await request_token(c, "default")
        assert r.status == 404
    finally:
        await plane.stop()
