"""Impersonation (``kubectl --as``): the Impersonate-* headers over the real TLS listener of
an in-process control plane, and the parsing of those headers on its own."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.apiserver.auth.impersonation import Wanted, split_service_account
from gpufleet.apiserver.auth.rbac import Attributes
from gpufleet.apiserver.errors import ApiException
from gpufleet.cli.commands.token import create_token
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client import Client, HttpTransport
from gpufleet.utils.http import RawResponse

RBAC = "rbac.authorization.k8s.io"
SSR = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    plane = ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path / "state",
                         run_controllers=False)
    await plane.start()
    yield plane
    await plane.stop()


def connect(cp: ControlPlane, token: str | None) -> Client:
    return Client(HttpTransport(cp.url, token=token, ca_data=cp.ca_pem), read_retries=1)


async def send(c: Client, method: str, path: str, body: Any = None, *, as_: dict[str, str] | None = None,
               content_type: str = "application/json") -> RawResponse:
    headers = dict(as_ or {})
    if body is not None:
        headers["content-type"] = content_type
    return await c.raw_request(method, path, content=json.dumps(body) if body is not None else None,
                               headers=headers, raise_for_status=False)


def status_of(resp: RawResponse) -> tuple[int, str, str]:
    body = json.loads(resp.body)
    return resp.status, body.get("reason", ""), body.get("message", "")


async def setup_teams(admin: Client) -> dict[str, Any]:
    for ns in ("team-a", "team-b"):
        await admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, raw=True)
    await create_token(admin, role="edit", namespace="team-a", user="alice")
    return await create_token(admin, role="edit", namespace="team-a", user="bob")


async def whoami(c: Client, as_: dict[str, str]) -> dict[str, Any]:
    resp = await send(c, "POST", SSR, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
                      as_=as_)
    assert resp.status == 201, resp.body
    return json.loads(resp.body)["status"]["userInfo"]


async def can_i(c: Client, as_: dict[str, str], verb: str, resource: str, namespace: str) -> bool:
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": verb, "resource": resource, "namespace": namespace}}}
    resp = await send(c, "POST", SSAR, body, as_=as_)
    assert resp.status == 201, resp.body
    return json.loads(resp.body)["status"]["allowed"]


async def test_admin_acts_as_a_team_user(cp: ControlPlane) -> None:
    alice = {"Impersonate-User": "alice"}
    async with connect(cp, cp.admin_token) as admin:
        await setup_teams(admin)
        # What alice may do, not what the admin may.
        assert status_of(await send(admin, "GET", "/api/v1/namespaces/team-b/pods", as_=alice)) == (
            403, "Forbidden", 'pods is forbidden: User "alice" cannot list resource "pods" in API group "" '
                              'in the namespace "team-b"')
        assert (await send(admin, "GET", "/api/v1/namespaces/team-a/pods", as_=alice)).status == 200
        assert not await can_i(admin, alice, "list", "pods", "team-b")
        assert await can_i(admin, alice, "list", "pods", "team-a")
        assert await can_i(admin, {}, "list", "pods", "team-b")
        assert await whoami(admin, alice) == {"username": "alice", "groups": ["system:authenticated"]}
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "by-alice"}}
        assert (await send(admin, "POST", "/api/v1/namespaces/team-a/configmaps", cm, as_=alice)).status == 201
        assert (await send(admin, "POST", "/api/v1/namespaces/team-b/configmaps", cm, as_=alice)).status == 403
        # Everything can be set by a member of system:masters, groups included.
        full = {"Impersonate-User": "alice", "Impersonate-Group": "ml", "Impersonate-Uid": "uid-7",
                "Impersonate-Extra-Scopes": "read", "Impersonate-Extra-Example.com%2Fteam": "a"}
        assert await whoami(admin, full) == {
            "username": "alice", "uid": "uid-7", "groups": ["ml", "system:authenticated"],
            "extra": {"scopes": ["read"], "example.com/team": ["a"]}}
        as_master = {"Impersonate-User": "alice", "Impersonate-Group": "system:masters"}
        assert (await send(admin, "GET", "/api/v1/namespaces/team-b/pods", as_=as_master)).status == 200
        # A service account gets its fixed groups; system:anonymous is unauthenticated.
        assert await whoami(admin, {"Impersonate-User": "system:serviceaccount:team-a:builder"}) == {
            "username": "system:serviceaccount:team-a:builder",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated"]}
        anonymous = {"Impersonate-User": "system:anonymous"}
        assert (await send(admin, "POST", SSR, {"kind": "SelfSubjectReview"}, as_=anonymous)).status == 403


async def test_impersonating_takes_the_impersonate_verb_for_each_thing_asked(cp: ControlPlane) -> None:
    async with connect(cp, cp.admin_token) as admin:
        bob_token = (await setup_teams(admin))["token"]
    async with connect(cp, bob_token) as bob:
        assert status_of(await send(bob, "GET", "/api/v1/namespaces/team-a/pods",
                                    as_={"Impersonate-User": "alice"})) == (
            403, "Forbidden", 'users "alice" is forbidden: User "bob" cannot impersonate resource "users" '
                              'in API group "" at the cluster scope')
    # bob may act as alice (and only her), and as the service accounts of team-a.
    async with connect(cp, cp.admin_token) as admin:
        await admin.create({"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": {"name": "as-alice"},
                            "rules": [{"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"],
                                       "resourceNames": ["alice"]}]}, raw=True)
        await admin.create({"apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding",
                            "metadata": {"name": "bob-as-alice"},
                            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "as-alice"},
                            "subjects": [{"apiGroup": RBAC, "kind": "User", "name": "bob"}]}, raw=True)
        await admin.create({"apiVersion": f"{RBAC}/v1", "kind": "Role",
                            "metadata": {"name": "as-sa", "namespace": "team-a"},
                            "rules": [{"apiGroups": [""], "resources": ["serviceaccounts"],
                                       "verbs": ["impersonate"]}]}, "team-a", raw=True)
        await admin.create({"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
                            "metadata": {"name": "bob-as-sa", "namespace": "team-a"},
                            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "as-sa"},
                            "subjects": [{"apiGroup": RBAC, "kind": "User", "name": "bob"}]}, "team-a", raw=True)
    async with connect(cp, bob_token) as bob:
        assert await whoami(bob, {"Impersonate-User": "alice"}) == {
            "username": "alice", "groups": ["system:authenticated"]}
        assert status_of(await send(bob, "GET", "/api/v1/namespaces", as_={"Impersonate-User": "carol"}))[2] == (
            'users "carol" is forbidden: User "bob" cannot impersonate resource "users" in API group "" '
            "at the cluster scope")
        refused = {
            "Impersonate-Group": ('groups "system:masters" is forbidden: User "bob" cannot impersonate resource '
                                  '"groups" in API group "" at the cluster scope', "system:masters"),
            "Impersonate-Uid": ('uids.authentication.k8s.io "42" is forbidden: User "bob" cannot impersonate '
                                'resource "uids" in API group "authentication.k8s.io" at the cluster scope', "42"),
            "Impersonate-Extra-Scopes": (
                'userextras.authentication.k8s.io "all" is forbidden: User "bob" cannot impersonate resource '
                '"userextras/scopes" in API group "authentication.k8s.io" at the cluster scope', "all"),
        }
        for header, (message, value) in refused.items():
            resp = await send(bob, "GET", "/api/v1/namespaces/team-b/pods",
                              as_={"Impersonate-User": "alice", header: value})
            assert status_of(resp) == (403, "Forbidden", message), header
        sa = {"Impersonate-User": "system:serviceaccount:team-a:builder"}
        assert (await whoami(bob, sa))["username"] == "system:serviceaccount:team-a:builder"
        resp = await send(bob, "GET", "/api/v1/namespaces/team-a/pods",
                          as_={"Impersonate-User": "system:serviceaccount:team-b:builder"})
        assert status_of(resp)[2] == (
            'serviceaccounts "builder" is forbidden: User "bob" cannot impersonate resource "serviceaccounts" '
            'in API group "" in the namespace "team-b"')
        # The service account itself has no binding: bob gains nothing by becoming it.
        resp = await send(bob, "GET", "/api/v1/namespaces/team-a/pods", as_=sa)
        assert status_of(resp)[2].startswith('pods is forbidden: User "system:serviceaccount:team-a:builder"')
    # Credentials come first: no token, no impersonation.
    async with connect(cp, None) as nobody:
        assert (await send(nobody, "GET", "/api/v1/namespaces", as_={"Impersonate-User": "alice"})).status == 401


async def test_groups_without_a_user_are_a_bad_request(cp: ControlPlane) -> None:
    async with connect(cp, cp.admin_token) as admin:
        resp = await send(admin, "GET", "/api/v1/namespaces", as_={"Impersonate-Group": "system:masters"})
        assert status_of(resp) == (
            400, "BadRequest", "requested impersonation of group 'system:masters' without impersonating a user: "
                               "Impersonate-Group, Impersonate-Uid and Impersonate-Extra-* need Impersonate-User "
                               "(kubectl --as) in the same request")


async def test_an_impersonated_node_is_held_to_its_own_objects(cp: ControlPlane) -> None:
    node = {"Impersonate-User": "system:node:n1", "Impersonate-Group": "system:nodes"}
    async with connect(cp, cp.admin_token) as admin:
        for name in ("n1", "n2"):
            await admin.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}, raw=True)
        await admin.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "default"},
                            "data": {}}, "default", raw=True)
        label = {"metadata": {"labels": {"seen": "yes"}}}
        merge = "application/merge-patch+json"
        resp = await send(admin, "PATCH", "/api/v1/nodes/n1", label, as_=node, content_type=merge)
        assert resp.status == 200, resp.body
        # NodeRestriction: not another node's object.
        resp = await send(admin, "PATCH", "/api/v1/nodes/n2", label, as_=node, content_type=merge)
        assert status_of(resp) == (403, "Forbidden", 'nodes "n2" is forbidden: node "n1" is not allowed to '
                                                     'modify node "n2"')
        # The Node authorizer: not a secret none of its pods uses.
        resp = await send(admin, "GET", "/api/v1/namespaces/default/secrets/s", as_=node)
        assert status_of(resp) == (
            403, "Forbidden", 'secrets "s" is forbidden: User "system:node:n1" cannot get resource "secrets" in '
                              "API group \"\" in the namespace \"default\": no relationship found between node "
                              "'n1' and this object")
        # Without system:nodes the name alone makes no node: plain RBAC, which grants it nothing.
        resp = await send(admin, "GET", "/api/v1/nodes/n1", as_={"Impersonate-User": "system:node:n1"})
        assert status_of(resp)[0] == 403


async def test_repeated_group_headers_all_count(cp: ControlPlane) -> None:
    assert cp.ca_pem is not None and cp.admin_token is not None
    context = ssl.create_default_context(cadata=cp.ca_pem.decode())
    headers = [("authorization", f"Bearer {cp.admin_token}"), ("impersonate-user", "alice"),
               ("impersonate-group", "a"), ("impersonate-group", "b"), ("content-type", "application/json")]
    async with httpx.AsyncClient(verify=context) as raw:
        resp = await raw.post(f"{cp.url}{SSR}", content=b'{"kind":"SelfSubjectReview"}', headers=headers)
    assert resp.json()["status"]["userInfo"]["groups"] == ["a", "b", "system:authenticated"]


# -- the headers on their own ------------------------------------------------------------------


def test_headers_become_one_check_each() -> None:
    wanted = Wanted.from_headers({"impersonate-user": "alice", "impersonate-group": "ml, ops",
                                  "impersonate-uid": "u1", "impersonate-extra-scopes": "a,b",
                                  "authorization": "Bearer x"})
    assert wanted.checks() == [
        Attributes(verb="impersonate", resource="users", name="alice"),
        Attributes(verb="impersonate", resource="groups", name="ml"),
        Attributes(verb="impersonate", resource="groups", name="ops"),
        Attributes(verb="impersonate", group="authentication.k8s.io", resource="userextras", subresource="scopes",
                   name="a"),
        Attributes(verb="impersonate", group="authentication.k8s.io", resource="userextras", subresource="scopes",
                   name="b"),
        Attributes(verb="impersonate", group="authentication.k8s.io", resource="uids", name="u1"),
    ]
    user = wanted.user_info()
    assert (user.name, user.groups, user.uid, user.extra) == (
        "alice", ["ml", "ops", "system:authenticated"], "u1", {"scopes": ["a", "b"]})
    assert not Wanted.from_headers({"authorization": "Bearer x"})
    explicit = Wanted.from_headers({"impersonate-user": "system:anonymous", "impersonate-group": "x"})
    assert explicit.user_info().groups == ["x", "system:unauthenticated"]
    for headers in ({"impersonate-uid": "1"}, {"impersonate-extra-k": "v"}, {"impersonate-group": "g"}):
        with pytest.raises(ApiException) as e:
            Wanted.from_headers(headers)
        assert e.value.code == 400 and "without impersonating a user" in e.value.message


@pytest.mark.parametrize(("name", "split"), [
    ("system:serviceaccount:team-a:builder", ("team-a", "builder")),
    ("system:serviceaccount:team-a:my.sa", ("team-a", "my.sa")),
    ("system:serviceaccount:team-a", None),
    ("system:serviceaccount:team-a:b:c", None),
    ("system:serviceaccount:Team:b", None),
    ("system:serviceaccount::b", None),
    ("alice", None),
])
def test_service_account_names(name: str, split: tuple[str, str] | None) -> None:
    assert split_service_account(name) == split
