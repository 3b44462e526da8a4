"""pods/exec, attach and portforward over the API server's real TLS listener, before any node
is involved: what kube-apiserver refuses before it upgrades (with its Status), and the
authorization of a WebSocket handshake (a GET) as a create."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gpufleet.cli.controlplane import ControlPlane

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
       "spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "x"}]}}
WS = {"upgrade": "websocket"}  # a WebSocket handshake, made by a WebSocket client (websockets)
_TLS: dict[str, ssl.SSLContext] = {}  # the trust the WebSocket client dials with
SPDY = {"connection": "Upgrade", "upgrade": "SPDY/3.1", "x-stream-protocol-version": "v4.channel.k8s.io"}


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    plane = ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path / "state",
                         run_controllers=False)
    await plane.start()
    ctx = ssl.create_default_context(cadata=plane.ca_pem.decode())
    async with httpx.AsyncClient(base_url=plane.url, verify=ctx,
                                 headers={"authorization": f"Bearer {plane.admin_token}"}) as client:
        resp = await client.post("/api/v1/namespaces/default/pods", json=POD)
        assert resp.status_code == 201, resp.text
        _TLS["ctx"] = ctx
        yield client
    await plane.stop()


EXEC = "/api/v1/namespaces/default/pods/p/exec"


async def _ws_refusal(http: httpx.AsyncClient, path: str, headers: dict[str, str]) -> tuple[int, dict]:
    url = str(http.base_url).rstrip("/").replace("https:", "wss:") + path
    with pytest.raises(InvalidStatus) as refused:
        await connect(url, ssl=_TLS["ctx"], subprotocols=["v5.channel.k8s.io"],  # type: ignore[list-item]
                      additional_headers={"authorization": http.headers["authorization"], **headers})
    return refused.value.response.status_code, json.loads(refused.value.response.body)


async def test_refusals_before_the_upgrade_are_statuses(http: httpx.AsyncClient):
    async def status(method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        if headers is WS:
            code, body = await _ws_refusal(http, path, {})
        else:
            resp = await http.request(method, path, headers=headers)
            code, body = resp.status_code, resp.json()
        assert body["kind"] == "Status" and body["code"] == code, body
        return code, body["message"]

    assert await status("GET", f"{EXEC}?command=id&container=a&stdout=1", {}) == (400, "Upgrade request required")
    assert await status("POST", f"{EXEC}?command=id&stdout=1", SPDY) == (
        400, "a container name must be specified for pod p, choose one of: [a b]")
    assert await status("POST", f"{EXEC}?command=id&container=c&stdout=1", SPDY) == (
        400, "container c is not valid for pod p")
    assert await status("POST", f"{EXEC}?container=a&stdout=1", SPDY) == (400, "you must specify at least 1 command")
    assert await status("GET", f"{EXEC}?command=id&container=a&stdout=1", WS) == (
        400, "pod p does not have a host assigned")
    assert await status("POST", "/api/v1/namespaces/default/pods/p/portforward?ports=99999", SPDY) == (
        400, 'ports: Invalid value: "99999": port must be between 1 and 65535, inclusive')
    assert await status("GET", "/api/v1/namespaces/default/pods/nope/attach?stdout=1", WS) == (
        404, 'pods "nope" not found')


async def test_a_websocket_handshake_needs_create_as_spdy_does(http: httpx.AsyncClient):
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "exec-get", "namespace": "default"},
            "rules": [{"apiGroups": [""], "resources": ["pods", "pods/exec"], "verbs": ["get"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "exec-get", "namespace": "default"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "exec-get"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}
    for obj, plural in ((role, "roles"), (binding, "rolebindings")):
        resp = await http.post(f"/apis/rbac.authorization.k8s.io/v1/namespaces/default/{plural}", json=obj)
        assert resp.status_code == 201, resp.text
    as_alice = {"impersonate-user": "alice"}
    code, body = await _ws_refusal(http, f"{EXEC}?command=id&container=a&stdout=1", as_alice)
    assert code == 403, body
    assert body["message"] == ('pods "p" is forbidden: User "alice" cannot create resource "pods/exec" '
                                      'in API group "" in the namespace "default"')
    resp = await http.post(f"{EXEC}?command=id&container=a&stdout=1", headers={**SPDY, **as_alice})
    assert resp.status_code == 403 and 'cannot create resource "pods/exec"' in resp.json()["message"]
