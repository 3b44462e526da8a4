"""Authentication, RBAC and NodeRestriction, over the real TLS listener of an in-process
control plane (no controllers): every request here goes through HTTPS with a bearer token,
as kubectl's and the agents' do."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent.bootstrap import node_token, request_node_token, whoami
from gpufleet.agent.httpserver import AgentHttpServer, LogAnswer, build_app
from gpufleet.agent.servingcert import ServingCredentials, ensure_serving
from gpufleet.api.registry import REGISTRY, ResourceType
from gpufleet.cli.commands.token import create_token
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client import Client, HttpTransport, LocalTransport
from gpufleet.client.errors import AlreadyExists, Forbidden, TransportError
from gpufleet.utils.clock import FakeClock
from gpufleet.utils.http import RawRequest, RawResponse

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
OPEN_PATHS = {"/healthz", "/readyz", "/livez", "/version"}


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    plane = ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path / "state",
                         run_controllers=False)
    await plane.start()
    yield plane
    await plane.stop()


def connect(cp: ControlPlane, token: str | None) -> Client:
    return Client(HttpTransport(cp.url, token=token, ca_data=cp.ca_pem), read_retries=1)


async def send(c: Client, method: str, path: str, body: Any = None, *, params: Any = None,
               content_type: str = "application/json") -> RawResponse:
    content = json.dumps(body) if body is not None else None
    headers = {"content-type": content_type} if content is not None else None
    return await c.raw_request(method, path, params=params, content=content, headers=headers,
                               raise_for_status=False)


def stub(rt: ResourceType, ns: str | None, name: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if ns:
        meta["namespace"] = ns
    return {"apiVersion": rt.api_version, "kind": rt.kind, "metadata": meta}


def request_for(rt: ResourceType, verb: str, ns: str, name: str = "x") -> tuple[str, str, Any, dict | None]:
    """(method, path, body, params) that asks for ``verb`` on ``rt`` in namespace ``ns``."""
    coll, obj = rt.path(ns), rt.path(ns, name)
    return {
        "get": ("GET", obj, None, None),
        "list": ("GET", coll, None, None),
        "watch": ("GET", coll, None, {"watch": "true", "timeoutSeconds": "1"}),
        "create": ("POST", coll, stub(rt, ns, name), None),
        "update": ("PUT", obj, stub(rt, ns, name), None),
        "patch": ("PATCH", obj, {"metadata": {"labels": {"a": "b"}}}, None),
        "delete": ("DELETE", obj, None, None),
        "deletecollection": ("DELETE", coll, None, None),
    }[verb]


async def namespaces(admin: Client, *names: str) -> None:
    for n in names:
        await admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}, raw=True)


# -- (a) a team's token: forbidden everywhere in another namespace, allowed in its own ----------------


async def test_team_token_is_forbidden_in_every_other_namespace(cp: ControlPlane) -> None:
    async with connect(cp, cp.admin_token) as admin:
        await namespaces(admin, "team-a", "team-b")
        made = await create_token(admin, role="edit", namespace="team-a", user="alice")
    denied = 0
    async with connect(cp, made["token"]) as alice:
        for rt in REGISTRY.all():
            if not rt.namespaced:
                continue
            for verb in VERBS:
                method, path, body, params = request_for(rt, verb, "team-b")
                content_type = "application/merge-patch+json" if verb == "patch" else "application/json"
                resp = await send(alice, method, path, body, params=params, content_type=content_type)
                status = json.loads(resp.body)
                group = f".{rt.group}" if rt.group else ""
                named = ' "x"' if verb in ("get", "update", "patch", "delete") else ""
                want = (f'{rt.plural}{group}{named} is forbidden: User "alice" cannot {verb} resource '
                        f'"{rt.plural}" in API group "{rt.group}" in the namespace "team-b"')
                assert (resp.status, status.get("reason"), status.get("message")) == (403, "Forbidden", want), \
                    f"{verb} {rt.key}: {resp.status} {status}"
                denied += 1
            for sub in rt.subresources:
                method = {"binding": "POST", "eviction": "POST"}.get(sub, "GET")
                resp = await send(alice, method, rt.path("team-b", "x", sub), {} if method == "POST" else None)
                assert resp.status == 403, f"{method} {rt.key}/{sub}: {resp.status} {resp.body!r}"
                assert f'resource "{rt.plural}/{sub}"' in json.loads(resp.body)["message"]
                denied += 1
    kinds = sum(1 for rt in REGISTRY.all() if rt.namespaced)
    print(f"\nteam-a token in team-b: {denied} requests ({kinds} namespaced kinds x {len(VERBS)} verbs "
          f"+ subresources), all 403")
    assert denied >= kinds * len(VERBS)


async def test_team_token_works_in_its_own_namespace(cp: ControlPlane) -> None:
    async with connect(cp, cp.admin_token) as admin:
        await namespaces(admin, "team-a", "team-b")
        made = await create_token(admin, role="edit", namespace="team-a", user="alice")
    async with connect(cp, made["token"]) as alice:
        # Every verb, for real, on a kind edit may write.
        cm = REGISTRY.by_key("configmaps")
        assert cm is not None
        for verb in ("create", "get", "list", "watch", "update", "patch", "delete"):
            method, path, body, params = request_for(cm, verb, "team-a", "cfg")
            if verb == "update":
                body = {**body, "data": {"k": "v"}}
            resp = await send(alice, method, path, body, params=params,
                              content_type="application/merge-patch+json" if verb == "patch" else "application/json")
            assert resp.status in (200, 201), f"{verb}: {resp.status} {resp.body!r}"
        resp = await send(alice, "DELETE", cm.path("team-a"))
        assert resp.status == 200, resp.body
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
               "spec": {"containers": [{"name": "c", "image": "python:3.12"}]}}
        await alice.create(pod, "team-a", raw=True)
        deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                  "spec": {"selector": {"matchLabels": {"app": "d"}},
                           "template": {"metadata": {"labels": {"app": "d"}},
                                        "spec": {"containers": [{"name": "c", "image": "python:3.12"}]}}}}
        await alice.create(deploy, "team-a", raw=True)
        # Reading what a namespace's users work with is allowed; editing policy is not.
        for key in ("pods", "services", "endpoints", "events", "configmaps", "secrets", "serviceaccounts",
                    "resourcequotas", "limitranges", "deployments.apps", "replicasets.apps", "jobs.batch",
                    "horizontalpodautoscalers.autoscaling", "poddisruptionbudgets.policy"):
            rt = REGISTRY.by_key(key)
            assert rt is not None
            resp = await send(alice, "GET", rt.path("team-a"))
            assert resp.status == 200, f"list {key}: {resp.status} {resp.body!r}"
        for key, verb in (("resourcequotas", "create"), ("rolebindings.rbac.authorization.k8s.io", "create"),
                          ("limitranges", "delete")):
            rt = REGISTRY.by_key(key)
            assert rt is not None
            method, path, body, params = request_for(rt, verb, "team-a")
            assert (await send(alice, method, path, body)).status == 403, f"{verb} {key}"
        # Cluster-scoped objects are out of reach of a namespaced binding.
        assert (await send(alice, "GET", "/api/v1/nodes")).status == 403
        assert (await send(alice, "GET", "/api/v1/namespaces/team-a")).status == 200
        assert (await send(alice, "GET", "/api/v1/namespaces/team-b")).status == 403


# -- (b) node agents: their own Node, Lease and pods, nobody else's ------------------------------


def node_body(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def lease_body(name: str) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 10}}


def pod_on(name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "python:3.12"}]}}


def mirror_on(name: str, node: str, owners: list[dict[str, Any]]) -> dict[str, Any]:
    body = pod_on(name, node)
    body["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "x"}
    if owners:
        body["metadata"]["ownerReferences"] = owners
    return body


MERGE = "application/merge-patch+json"


async def test_node_token_writes_only_its_own_node(cp: ControlPlane, tmp_path: Path) -> None:
    n1 = await node_token(lambda t: connect(cp, t), cp.join_token, "n1", tmp_path / "agent-n1")
    assert n1 and n1 != cp.join_token and (tmp_path / "agent-n1" / "node-token").read_text().strip() == n1
    async with connect(cp, cp.admin_token) as admin, connect(cp, n1) as agent:
        assert (await whoami(agent))["username"] == "system:node:n1"
        await admin.create(node_body("n2"), raw=True)
        await admin.create(lease_body("n2"), "kube-node-lease", raw=True)
        await admin.create(pod_on("mine", "n1"), raw=True)
        await admin.create(pod_on("theirs", "n2"), raw=True)

        # Its own: register, heartbeat, report, clean up.
        assert (await send(agent, "POST", "/api/v1/nodes", node_body("n1"))).status == 201
        assert (await send(agent, "PATCH", "/api/v1/nodes/n1", {"metadata": {"labels": {"a": "b"}}},
                           content_type=MERGE)).status == 200
        assert (await send(agent, "PATCH", "/api/v1/nodes/n1/status", {"status": {"phase": "Running"}},
                           content_type=MERGE)).status == 200
        leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        assert (await send(agent, "POST", leases, lease_body("n1"))).status == 201
        assert (await send(agent, "PATCH", f"{leases}/n1", {"spec": {"leaseDurationSeconds": 20}},
                           content_type=MERGE)).status == 200
        assert (await send(agent, "PATCH", "/api/v1/namespaces/default/pods/mine/status",
                           {"status": {"phase": "Running"}}, content_type=MERGE)).status == 200
        assert (await send(agent, "PATCH", "/api/v1/namespaces/default/pods/mine",
                           {"metadata": {"annotations": {"x": "y"}}}, content_type=MERGE)).status == 200
        assert (await send(agent, "GET", "/api/v1/namespaces/default/pods/theirs")).status == 200

        # Anyone else's: 403, with NodeRestriction's reason.
        n2 = await admin.get("nodes", "n2", raw=True)
        refused = [
            ("PUT", "/api/v1/nodes/n2", n2, "application/json"),
            ("PATCH", "/api/v1/nodes/n2", {"metadata": {"labels": {"a": "b"}}}, MERGE),
            ("PATCH", "/api/v1/nodes/n2/status", {"status": {"phase": "Running"}}, MERGE),
            ("DELETE", "/api/v1/nodes/n2", None, "application/json"),
            ("POST", "/api/v1/nodes", node_body("n3"), "application/json"),
            ("PATCH", f"{leases}/n2", {"spec": {"holderIdentity": "n1"}}, MERGE),
            ("DELETE", f"{leases}/n2", None, "application/json"),
            ("POST", leases, lease_body("n3"), "application/json"),
            ("PATCH", "/api/v1/namespaces/default/pods/theirs/status", {"status": {"phase": "Failed"}}, MERGE),
            ("PATCH", "/api/v1/namespaces/default/pods/theirs", {"metadata": {"labels": {"a": "b"}}}, MERGE),
            ("DELETE", "/api/v1/namespaces/default/pods/theirs", None, "application/json"),
            ("POST", "/api/v1/namespaces/default/pods", pod_on("new", "n1"), "application/json"),
            ("DELETE", "/api/v1/namespaces/default/pods", None, "application/json"),
            ("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": "mine"}}, "application/json"),
        ]
        for method, path, body, ctype in refused:
            resp = await send(agent, method, path, body, content_type=ctype)
            assert resp.status == 403, f"{method} {path}: {resp.status} {resp.body!r}"
        resp = await send(agent, "DELETE", "/api/v1/nodes/n2")
        assert json.loads(resp.body)["message"] == \
            'nodes "n2" is forbidden: node "n1" is not allowed to modify node "n2"'
        # Pods: mirror pods of itself only (its GPU validation pods), owned by nothing but its Node.
        pods = "/api/v1/namespaces/default/pods"
        resp = await send(agent, "POST", pods, pod_on("plain", "n1"))
        assert resp.status == 403 and 'node "n1" can only create mirror pods' in json.loads(resp.body)["message"]
        n1_uid = (await admin.get("nodes", "n1", raw=True))["metadata"]["uid"]
        mine_ref = {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": n1_uid}
        for body, why in [
            (mirror_on("m2", "n2", []), "can only create pods with spec.nodeName set to itself"),
            (mirror_on("m3", "n1", [{**mine_ref, "name": "n2"}]), "owner reference set to itself"),
            (mirror_on("m4", "n1", [mine_ref, {**mine_ref, "name": "n2"}]), "a single owner reference"),
            ({**mirror_on("m5", "n1", [mine_ref]), "spec": {**mirror_on("m5", "n1", [])["spec"],
                                                           "serviceAccountName": "default"}},
             "a mirror pod may not reference service accounts"),
        ]:
            resp = await send(agent, "POST", pods, body)
            assert resp.status == 403 and why in json.loads(resp.body)["message"], resp.body
        resp = await send(agent, "POST", pods, mirror_on("m1", "n1", [mine_ref]))
        assert resp.status == 201, resp.body
        assert (await send(agent, "DELETE", f"{pods}/m1", params={"gracePeriodSeconds": "0"})).status == 200
        assert (await admin.get("pods", "theirs", "default", raw=True))["metadata"].get("labels") is None
        assert (await send(agent, "DELETE", "/api/v1/namespaces/default/pods/mine",
                           params={"gracePeriodSeconds": "0"})).status == 200


async def test_node_lists_and_watches_only_its_own_pods(cp: ControlPlane, tmp_path: Path) -> None:
    n1 = await node_token(lambda t: connect(cp, t), cp.join_token, "n1", tmp_path / "agent-n1")
    async with connect(cp, cp.admin_token) as admin, connect(cp, n1) as agent:
        await admin.create(pod_on("mine", "n1"), raw=True)
        await admin.create(pod_on("theirs", "n2"), raw=True)
        for path in ("/api/v1/pods", "/api/v1/namespaces/default/pods"):
            for selector in ("spec.nodeName=n1", "spec.nodeName==n1", "status.phase!=Failed,spec.nodeName=n1"):
                resp = await send(agent, "GET", path, params={"fieldSelector": selector})
                assert resp.status == 200, (path, selector, resp.body)
                assert [p["metadata"]["name"] for p in json.loads(resp.body)["items"]] == ["mine"]
            watch = await send(agent, "GET", path, params={"fieldSelector": "spec.nodeName=n1", "watch": "true",
                                                           "timeoutSeconds": "1"})
            assert watch.status == 200
        # Without its own node name in the selector: Kubernetes' 403.
        resp = await send(agent, "GET", "/api/v1/pods")
        assert resp.status == 403
        assert message(resp) == ('pods is forbidden: User "system:node:n1" cannot list resource "pods" in API group'
                                 ' "" at the cluster scope: can only list/watch pods with spec.nodeName field '
                                 'selector')
        for params in ({"fieldSelector": "spec.nodeName=n2"}, {"fieldSelector": "spec.nodeName!=n1"},
                       {"fieldSelector": "metadata.name=mine"}, {"labelSelector": "spec.nodeName=n1"},
                       {"fieldSelector": "spec.nodeName=n", "watch": "true", "timeoutSeconds": "1"}):
            resp = await send(agent, "GET", "/api/v1/namespaces/default/pods", params=params)
            assert resp.status == 403, (params, resp.status)
            assert message(resp).endswith("can only list/watch pods with spec.nodeName field selector")
        resp = await send(agent, "GET", "/api/v1/namespaces/default/pods",
                          params={"watch": "true", "timeoutSeconds": "1"})
        assert (resp.status, message(resp)) == (403, 'pods is forbidden: User "system:node:n1" cannot watch '
                                                     'resource "pods" in API group "" in the namespace "default": '
                                                     'can only list/watch pods with spec.nodeName field selector')
        # kubectl auth can-i, with the selector (resourceAttributes.fieldSelector) and without.
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": {"verb": "list", "resource": "pods"}}}
        ssar = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
        assert json.loads((await send(agent, "POST", ssar, review)).body)["status"]["allowed"] is False
        review["spec"]["resourceAttributes"]["fieldSelector"] = {"rawSelector": "spec.nodeName=n1"}
        assert json.loads((await send(agent, "POST", ssar, review)).body)["status"]["allowed"] is True
        review["spec"]["resourceAttributes"]["fieldSelector"] = {
            "requirements": [{"key": "spec.nodeName", "operator": "In", "values": ["n1"]}]}
        assert json.loads((await send(agent, "POST", ssar, review)).body)["status"]["allowed"] is True
        # Its own pods, and any other one by name, as before.
        assert (await send(agent, "GET", "/api/v1/namespaces/default/pods/theirs")).status == 200
        # An administrator lists everything, selector or not.
        assert len(json.loads((await send(admin, "GET", "/api/v1/pods")).body)["items"]) == 2


async def joined(cp: ControlPlane, name: str, state: Path) -> ServingCredentials:
    """``name`` joins as an agent does: its node token, then its serving credentials."""
    async with connect(cp, await node_token(lambda t: connect(cp, t), cp.join_token, name, state)) as node:
        serving = await ensure_serving(node, name, state)
    assert serving is not None
    return serving


async def test_nodes_proxy_is_an_rbac_subresource(cp: ControlPlane, tmp_path: Path) -> None:
    """GET /api/v1/nodes/{name}/proxy/{path} reaches the node's agent with the API server's
    token for that node; RBAC resource nodes/proxy (cluster-admin, system:kubelet-api-admin)."""
    server = AgentHttpServer(LogStub(), "127.0.0.1", 0, serving=await joined(cp, "n1", tmp_path / "n1"))
    await server.start()
    async with connect(cp, cp.admin_token) as admin:
        await admin.create(node_body("n1"), raw=True)
        node = await admin.get("nodes", "n1", raw=True)
        node["status"] = {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                          "daemonEndpoints": {"kubeletEndpoint": {"Port": server.port}}}
        await admin.update_status(node, raw=True)
        bob_token = (await create_token(admin, user="bob", namespace="default", role="edit"))["token"]
        try:
            resp = await send(admin, "GET", "/api/v1/nodes/n1/proxy/stats/summary")
            assert (resp.status, json.loads(resp.body)) == (200, {"node": {}})
            assert (await send(admin, "GET", "/api/v1/nodes/n1/proxy/healthz")).body == b"ok"
            logs = await send(admin, "GET", "/api/v1/nodes/n1/proxy/containerLogs/default/p/c")
            assert (logs.status, logs.body) == (200, b"hello\n")
            assert (await send(admin, "GET", "/api/v1/nodes/n1/proxy/nothing/here")).status == 404
            assert (await send(admin, "POST", "/api/v1/nodes/n1/proxy/metrics", {})).status == 405
            assert (await send(admin, "GET", "/api/v1/nodes/n9/proxy/metrics")).status == 404
            async with connect(cp, bob_token) as bob:
                resp = await send(bob, "GET", "/api/v1/nodes/n1/proxy/metrics")
                assert (resp.status, message(resp)) == (403, 'nodes "n1" is forbidden: User "bob" cannot get '
                                                             'resource "nodes/proxy" in API group "" at the '
                                                             'cluster scope')
                await admin.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                                    "metadata": {"name": "bob-kubelet"},
                                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                "name": "system:kubelet-api-admin"},
                                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                                  "name": "bob"}]}, raw=True)
                assert (await send(bob, "GET", "/api/v1/nodes/n1/proxy/metrics")).status == 200
        finally:
            await server.stop()


def secret(name: str, ns: str = "default") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns},
            "data": {"token": "czNjcjN0"}}


def configmap(name: str, ns: str = "default") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns},
            "data": {"mode": "fast"}}


def pod_using(name: str, node: str | None, *, env_secret: str = "", pull_secret: str = "",
              projected_configmap: str = "", ns: str = "default") -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "python:3.12"}
    spec: dict[str, Any] = {"containers": [container]}
    if node:
        spec["nodeName"] = node
    if env_secret:
        container["env"] = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": env_secret, "key": "token"}}}]
    if pull_secret:
        spec["imagePullSecrets"] = [{"name": pull_secret}]
    if projected_configmap:
        spec["volumes"] = [{"name": "v", "projected": {"sources": [{"configMap": {"name": projected_configmap}}]}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec}


def message(resp: RawResponse) -> str:
    return json.loads(resp.body)["message"]


async def test_node_reads_only_the_secrets_and_configmaps_of_its_own_pods(cp: ControlPlane, tmp_path: Path) -> None:
    n1 = await node_token(lambda t: connect(cp, t), cp.join_token, "n1", tmp_path / "agent-n1")
    async with connect(cp, cp.admin_token) as admin, connect(cp, n1) as agent:
        await namespaces(admin, "team-a")
        for name in ("mine", "pulled", "theirs", "nobodys", "pending"):
            await admin.create(secret(name), raw=True)
        await admin.create(secret("mine", "team-a"), raw=True)
        for name in ("cfg", "other-cfg"):
            await admin.create(configmap(name), raw=True)
        await admin.create(pod_using("p1", "n1", env_secret="mine", pull_secret="pulled",
                                     projected_configmap="cfg"), raw=True)
        await admin.create(pod_using("p2", "n2", env_secret="theirs", projected_configmap="other-cfg"), raw=True)
        await admin.create(pod_using("p3", None, env_secret="pending"), raw=True)
        await admin.create(pod_using("p4", "n1", env_secret="missing"), raw=True)

        base = "/api/v1/namespaces/default"
        for path in (f"{base}/secrets/mine", f"{base}/secrets/pulled", f"{base}/configmaps/cfg"):
            resp = await send(agent, "GET", path)
            assert resp.status == 200, f"{path}: {resp.status} {resp.body!r}"
        assert json.loads((await send(agent, "GET", f"{base}/secrets/mine")).body)["data"] == {"token": "czNjcjN0"}
        # A referenced object that does not exist is a plain 404, so the agent can say so.
        assert (await send(agent, "GET", f"{base}/secrets/missing")).status == 404

        # Referenced only by a pod of another node, by a pod not yet bound, by nobody, or
        # by the same name in another namespace: 403 with the Node authorizer's reason.
        for path in (f"{base}/secrets/theirs", f"{base}/secrets/pending", f"{base}/secrets/nobodys",
                     f"{base}/configmaps/other-cfg", "/api/v1/namespaces/team-a/secrets/mine"):
            resp = await send(agent, "GET", path)
            assert resp.status == 403, f"{path}: {resp.status} {resp.body!r}"
        assert message(await send(agent, "GET", f"{base}/secrets/theirs")) == (
            'secrets "theirs" is forbidden: User "system:node:n1" cannot get resource "secrets" in API group "" '
            "in the namespace \"default\": no relationship found between node 'n1' and this object")

        # No listing or watching, which would show every one of them.
        for path in (f"{base}/secrets", "/api/v1/secrets", f"{base}/configmaps", "/api/v1/configmaps"):
            resp = await send(agent, "GET", path)
            assert resp.status == 403, f"{path}: {resp.status} {resp.body!r}"
            resp = await send(agent, "GET", path, params={"watch": "true", "timeoutSeconds": "1"})
            assert resp.status == 403, f"watch {path}: {resp.status} {resp.body!r}"
        assert message(await send(agent, "GET", f"{base}/secrets")) == (
            'secrets is forbidden: User "system:node:n1" cannot list resource "secrets" in API group "" '
            'in the namespace "default": can only get individual resources of this type')
        # Nor writing them.
        resp = await send(agent, "PATCH", f"{base}/secrets/mine", {"metadata": {"labels": {"a": "b"}}},
                          content_type=MERGE)
        assert resp.status == 403

        # Decided on the store at each request: once its pod is gone, so is the access.
        await admin.delete("pods", "p1", "default", raw=True, grace_period_seconds=0)
        assert (await send(agent, "GET", f"{base}/secrets/mine")).status == 403
        await admin.create(pod_using("p5", "n1", env_secret="theirs"), raw=True)
        assert (await send(agent, "GET", f"{base}/secrets/theirs")).status == 200
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p3", "namespace": "default"},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
        assert (await send(admin, "POST", f"{base}/pods/p3/binding", binding)).status == 201
        assert (await send(agent, "GET", f"{base}/secrets/pending")).status == 200
        # Also when the store's history has been compacted since the last decision.
        await admin.delete("pods", "p5", "default", raw=True, grace_period_seconds=0)
        assert cp.api is not None
        await cp.api.store.compact(await cp.api.store.revision())
        assert (await send(agent, "GET", f"{base}/secrets/theirs")).status == 403

        # RBAC can still grant a node more, as in Kubernetes (Node,RBAC).
        await admin.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                            "metadata": {"name": "n1-view", "namespace": "default"},
                            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                        "name": "view"},
                            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                          "name": "system:node:n1"}]}, raw=True)
        assert (await send(agent, "GET", f"{base}/configmaps")).status == 200
        assert (await send(agent, "GET", f"{base}/secrets")).status == 403

        # kubectl auth can-i as the node gives the same answers.
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": {"verb": "get", "resource": "secrets", "namespace": "default",
                                                  "name": "nobodys"}}}
        resp = await send(agent, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
        assert json.loads(resp.body)["status"] == {
            "allowed": False, "reason": "no relationship found between node 'n1' and this object"}
        # and `kubectl auth can-i --list` says its list of rules is not the whole story.
        rules = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
                 "spec": {"namespace": "default"}}
        resp = await send(agent, "POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", rules)
        status = json.loads(resp.body)["status"]
        assert status["incomplete"] is True
        assert not any("secrets" in r["resources"] for r in status["resourceRules"])


async def test_join_token_buys_one_node_identity_only(cp: ControlPlane, tmp_path: Path) -> None:
    async with connect(cp, cp.join_token) as joiner:
        who = await whoami(joiner)
        assert who["username"] == "system:bootstrap:join" and "system:bootstrappers" in who["groups"]
        # The join token itself reads nothing.
        assert (await send(joiner, "GET", "/api/v1/namespaces/default/pods")).status == 403
        first = await request_node_token(joiner, "n1")
        # A second join under a name already taken is refused: the join token never lets an
        # agent take over a node that joined.
        with pytest.raises(AlreadyExists, match="node n1 already joined"):
            await request_node_token(joiner, "n1")
    async with connect(cp, first) as agent:
        assert (await whoami(agent))["groups"] == ["system:nodes", "system:authenticated"]
        with pytest.raises(Forbidden):
            await request_node_token(agent, "n2")
    # The agent keeps its node token across restarts; a revoked one makes it join again.
    state = tmp_path / "agent"
    again = await node_token(lambda t: connect(cp, t), cp.join_token, "n9", state)
    assert await node_token(lambda t: connect(cp, t), cp.join_token, "n9", state) == again
    async with connect(cp, cp.admin_token) as admin:
        await admin.delete("secrets", "gpufleet-token-node-n9", "kube-system", raw=True)
    renewed = await node_token(lambda t: connect(cp, t), cp.join_token, "n9", state)
    assert renewed != again


async def test_an_agent_waits_for_the_api_before_joining(cp: ControlPlane, tmp_path: Path) -> None:
    class Unreachable:
        """The API server's handler, behind a network that fails the first two attempts."""
        failures = 2

        async def handle(self, req: RawRequest) -> RawResponse:
            if self.failures:
                self.failures -= 1
                raise TransportError("connection refused")
            assert cp.api is not None
            return await cp.api.handle(req)

    handler, clock = Unreachable(), FakeClock()
    token = await node_token(lambda t: Client(LocalTransport(handler, token=t)), cp.join_token, "late",
                             tmp_path, clock=clock)
    assert handler.failures == 0 and clock.monotonic() == pytest.approx(0.6)  # waited 0.2 s, then 0.4 s
    async with connect(cp, token) as agent:
        assert (await whoami(agent))["username"] == "system:node:late"


class LogStub:
    """The agent's endpoints, answering a fixed log line."""

    async def container_logs(self, namespace: str, pod: str, container: str, params: Any) -> LogAnswer:
        return LogAnswer(body=b"hello\n")

    async def stats_summary(self) -> dict[str, Any]:
        return {"node": {}}

    async def metrics_text(self) -> bytes:
        return b""

    async def workload_metrics(self, namespace: str | None = None) -> dict[str, Any]:
        return {"pods": []}


async def test_agent_answers_only_the_api_server(cp: ControlPlane, tmp_path: Path) -> None:
    mine = await joined(cp, "n1", tmp_path / "n1")
    assert cp.node_proxy is not None
    # A fresh token per request: never the same twice.
    assert cp.node_proxy.node_headers("n1") != cp.node_proxy.node_headers("n1")
    app = build_app(LogStub(), mine.verifier().verify)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
        for path in ("/containerLogs/default/p/c", "/stats/summary", "/stats/workload", "/metrics"):
            theirs = cp.node_proxy.node_headers("n2")
            assert (await http.get(path)).status_code == 401
            assert (await http.get(path, headers=theirs)).status_code == 401
            good = cp.node_proxy.node_headers("n1")
            assert (await http.get(path, headers={"authorization": good["authorization"] + "x"})).status_code == 401
            assert (await http.get(path, headers=good)).status_code == 200
            assert (await http.get(path, headers=good)).status_code == 401  # used once
        ok = await http.get("/containerLogs/default/p/c", headers=cp.node_proxy.node_headers("n1"))
        assert (ok.status_code, ok.text) == (200, "hello\n")
        assert (await http.get("/healthz")).text == "ok"


# -- (c) without a valid token nothing but the health and version endpoints answer -----------------


def every_path() -> list[str]:
    paths = ["/", "/api", "/apis", "/api/v1", "/openapi/v2", "/openapi/v3", "/openapi/v3/api/v1", "/metrics",
             "/healthz", "/readyz", "/livez", "/version", "/logs", "/debug/pprof"]
    for group, versions in REGISTRY.groups().items():
        for v in versions:
            if group:
                paths += [f"/apis/{group}", f"/apis/{group}/{v}", f"/openapi/v3/apis/{group}/{v}"]
    for rt in REGISTRY.all():
        ns = "default" if rt.namespaced else None
        paths += [rt.path(None), rt.path(ns), rt.path(ns, "x")]
        paths += [rt.path(ns, "x", sub) for sub in rt.subresources]
    for extra in ("/apis/metrics.k8s.io/v1beta1/nodes", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods",
                  "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                  "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                  "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                  "/apis/bootstrap.gpufleet.io/v1/nodetokenrequests"):
        paths.append(extra)
    return list(dict.fromkeys(paths))


@pytest.mark.parametrize("auth", [None, "Bearer node-n1.forged"])
async def test_no_valid_token_no_answer(cp: ControlPlane, auth: str | None) -> None:
    async with connect(cp, cp.join_token) as joiner:
        await request_node_token(joiner, "n1")  # so that "node-n1.forged" names a real token id
    checked = 0
    async with Client(HttpTransport(cp.url, ca_data=cp.ca_pem), read_retries=1) as anon:
        for path in every_path():
            for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
                headers = {"authorization": auth} if auth else None
                resp = await anon.raw_request(method, path, content="{}" if method != "GET" else None,
                                              headers=headers, raise_for_status=False)
                if path in OPEN_PATHS:
                    # Open to anyone (probes, kubectl's version check), whatever the method.
                    assert method != "GET" or resp.status == 200, f"{method} {path}: {resp.status}"
                    continue
                assert resp.status == 401, f"{method} {path} with {auth!r}: {resp.status} {resp.body[:200]!r}"
                assert json.loads(resp.body) == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                                 "status": "Failure", "message": "Unauthorized",
                                                 "reason": "Unauthorized", "code": 401}
                checked += 1
    print(f"\n{checked} unauthenticated requests ({auth!r}) over {len(every_path())} paths: none answered")


@pytest.mark.parametrize("auth", ["Bearer nope", "Basic YWRtaW46YWRtaW4=", "Bearer", "bearer", "Token x"])
async def test_malformed_credentials_are_unauthorized(cp: ControlPlane, auth: str) -> None:
    async with Client(HttpTransport(cp.url, ca_data=cp.ca_pem), read_retries=1) as anon:
        for path in ("/api", "/apis", "/api/v1/namespaces/default/pods", "/api/v1/nodes/x",
                     "/apis/authentication.k8s.io/v1/selfsubjectreviews"):
            resp = await anon.raw_request("GET", path, headers={"authorization": auth}, raise_for_status=False)
            assert resp.status == 401, f"{path} with {auth!r}: {resp.status}"


# -- reviews, restarts, and the pieces on their own ----------------------------------------------


async def test_access_reviews_answer_like_kubectl_auth_can_i(cp: ControlPlane) -> None:
    async with connect(cp, cp.admin_token) as admin:
        await namespaces(admin, "team-a")
        made = await create_token(admin, role="view", namespace="team-a", user="bob", groups=["ml"])

        async def review(c: Client, attrs: dict[str, Any], kind: str = "selfsubjectaccessreviews",
                         **spec: Any) -> dict[str, Any]:
            body = {"apiVersion": "authorization.k8s.io/v1", "spec": {"resourceAttributes": attrs, **spec}}
            resp = await send(c, "POST", f"/apis/authorization.k8s.io/v1/{kind}", body)
            assert resp.status == 201, resp.body
            return json.loads(resp.body)["status"]

        async with connect(cp, made["token"]) as bob:
            assert (await review(bob, {"verb": "list", "resource": "pods", "namespace": "team-a"}))["allowed"]
            assert (await review(bob, {"verb": "get", "resource": "pods", "subresource": "log",
                                       "namespace": "team-a"}))["allowed"]
            assert not (await review(bob, {"verb": "create", "resource": "pods", "namespace": "team-a"}))["allowed"]
            assert not (await review(bob, {"verb": "list", "resource": "secrets", "namespace": "team-a"}))["allowed"]
            assert not (await review(bob, {"verb": "list", "resource": "pods", "namespace": "team-b"}))["allowed"]
            me = await whoami(bob)
            assert me == {"username": "bob", "groups": ["ml", "system:authenticated"]}
            # Asking about someone else is for those allowed to (admins).
            resp = await send(bob, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                              {"spec": {"user": "alice", "resourceAttributes": {"verb": "list", "resource": "pods"}}})
            assert resp.status == 403
        status = await review(admin, {"verb": "list", "resource": "pods", "namespace": "team-a"},
                              kind="subjectaccessreviews", user="bob")
        assert status == {"allowed": True, "reason": f'RBAC: allowed by RoleBinding "{made["binding"]["metadata"]["name"]}'
                                                      f'/team-a" of ClusterRole "view" to User "bob"'}


async def test_namespace_admin_cannot_grant_more_than_it_holds(cp: ControlPlane) -> None:
    async with connect(cp, cp.admin_token) as admin:
        await namespaces(admin, "team-a")
        made = await create_token(admin, role="admin", namespace="team-a", user="lead")
    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a"

    def binding(name: str, role: str, kind: str = "ClusterRole") -> dict[str, Any]:
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "intern"}]}

    def role(name: str, resources: list[str], verbs: list[str]) -> dict[str, Any]:
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name},
                "rules": [{"apiGroups": [""], "resources": resources, "verbs": verbs}]}

    async with connect(cp, made["token"]) as lead:
        assert (await send(lead, "POST", f"{rbac}/rolebindings", binding("intern-view", "view"))).status == 201
        assert (await send(lead, "POST", f"{rbac}/roles", role("pod-reader", ["pods"], ["get", "list"]))).status == 201
        assert (await send(lead, "POST", f"{rbac}/rolebindings",
                           binding("intern-pods", "pod-reader", "Role"))).status == 201
        # More than it holds: cluster-admin, or a quota writer (a team must not raise its own quota).
        resp = await send(lead, "POST", f"{rbac}/rolebindings", binding("intern-root", "cluster-admin"))
        assert resp.status == 403
        assert 'user "lead"' in json.loads(resp.body)["message"]
        assert "is attempting to grant RBAC permissions not currently held" in json.loads(resp.body)["message"]
        resp = await send(lead, "POST", f"{rbac}/roles", role("quota-writer", ["resourcequotas"], ["update"]))
        assert resp.status == 403, resp.body
        resp = await send(lead, "POST", f"{rbac}/rolebindings", binding("ghost", "no-such-role", "Role"))
        assert resp.status == 403 and 'Role "no-such-role" not found' in json.loads(resp.body)["message"]


async def test_tokens_and_certificates_survive_a_restart(tmp_path: Path) -> None:
    def plane() -> ControlPlane:
        return ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path / "state",
                            run_controllers=False)
    first = plane()
    await first.start()
    async with connect(first, first.admin_token) as admin:
        await namespaces(admin, "team-a")
        made = await create_token(admin, role="edit", namespace="team-a")
    await first.stop()
    second = plane()
    await second.start()
    try:
        assert (second.admin_token, second.join_token, second.ca_pem) == (first.admin_token, first.join_token,
                                                                          first.ca_pem)
        async with connect(second, made["token"]) as user:
            assert (await send(user, "GET", "/api/v1/namespaces/team-a/pods")).status == 200
    finally:
        await second.stop()


async def test_insecure_control_plane_serves_plain_http_to_anyone(tmp_path: Path) -> None:
    plane = ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path,
                         run_controllers=False, secure=False)
    await plane.start()
    try:
        assert plane.url.startswith("http://")
        async with Client(HttpTransport(plane.url)) as anyone:
            assert (await send(anyone, "GET", "/api/v1/nodes")).status == 200
    finally:
        await plane.stop()
