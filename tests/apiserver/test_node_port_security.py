"""The agent's port and the join, against a secured in-process control plane over its real
TLS listener: the agent's real HTTP server (uvicorn, TLS with the certificate the API server
signed), real tokens minted by the API server's node proxy, real joins."""

from __future__ import annotations

import base64
import ipaddress
import json
import ssl
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpufleet.agent.bootstrap import node_token
from gpufleet.agent.httpserver import AgentHttpServer, LogAnswer
from gpufleet.agent.servingcert import ServingCredentials, ensure_serving
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client import Client, HttpTransport
from gpufleet.utils.nodeauth import TOKEN_ALGORITHM, TOKEN_ISSUER, serving_name


@pytest.fixture
async def cp(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[ControlPlane]:
    options = getattr(request, "param", {})
    plane = ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path / "state",
                         run_controllers=False, **options)
    await plane.start()
    yield plane
    await plane.stop()


def connect(cp: ControlPlane, token: str | None) -> Client:
    return Client(HttpTransport(cp.url, token=token, ca_data=cp.ca_pem), read_retries=1)


async def join(cp: ControlPlane, name: str, state: Path) -> tuple[str, ServingCredentials]:
    token = await node_token(lambda t: connect(cp, t), cp.join_token, name, state)
    assert token is not None
    async with connect(cp, token) as node:
        serving = await ensure_serving(node, name, state)
    assert serving is not None
    return token, serving


class Stub:
    async def container_logs(self, namespace: str, pod: str, container: str, params: Any) -> LogAnswer:
        return LogAnswer(body=b"hello\n")

    async def stats_summary(self) -> dict[str, Any]:
        return {"node": {"nodeName": "n1"}}

    async def metrics_text(self) -> bytes:
        return b""

    async def workload_metrics(self, namespace: str | None = None) -> dict[str, Any]:
        return {"pods": []}


@pytest.fixture
async def agent(cp: ControlPlane, tmp_path: Path) -> AsyncIterator[tuple[AgentHttpServer, ServingCredentials]]:
    _, serving = await join(cp, "n1", tmp_path / "n1")
    server = AgentHttpServer(Stub(), "127.0.0.1", 0, serving=serving)
    await server.start()
    yield server, serving
    await server.stop()


async def test_the_agent_port_speaks_tls_with_a_certificate_for_its_node_only(
        cp: ControlPlane, agent: tuple[AgentHttpServer, ServingCredentials], tmp_path: Path) -> None:
    server, serving = agent
    # The private key was made here and is private; the certificate is the node CA's.
    assert stat.S_IMODE((tmp_path / "n1" / "serving.key").stat().st_mode) == 0o600
    async with connect(cp, cp.admin_token) as admin:
        secret = await admin.get("secrets", "gpufleet-node-proxy-key", "kube-system", raw=True)
    ca_pem = base64.b64decode(secret["data"]["ca.crt"]).decode()
    assert ca_pem.encode() != cp.ca_pem  # not the CA kubectl and pods trust
    ctx = ssl.create_default_context(cadata=ca_pem)
    url = f"https://127.0.0.1:{server.port}/healthz"
    async with httpx.AsyncClient(verify=ctx) as http:
        resp = await http.get(url, extensions={"sni_hostname": serving_name("n1")})
        assert resp.text == "ok"
    # The certificate names n1 and nothing else: not its IP, not another node.
    for name in (None, serving_name("n2")):
        async with httpx.AsyncClient(verify=ctx) as http:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await http.get(url, extensions={"sni_hostname": name} if name else {})
    # Plain HTTP to the port is refused (the TLS server cannot speak it).
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.TransportError):
            await http.get(f"http://127.0.0.1:{server.port}/stats/summary", headers=cp.node_proxy.node_headers("n1"))


async def test_the_agent_refuses_replayed_forged_expired_and_foreign_tokens(
        cp: ControlPlane, agent: tuple[AgentHttpServer, ServingCredentials]) -> None:
    server, _ = agent
    assert cp.node_proxy is not None
    url = f"https://127.0.0.1:{server.port}/stats/summary"
    now = int(time.time())
    other_key = ec.generate_private_key(ec.SECP256R1())

    def claims(**changes: Any) -> dict[str, Any]:
        base = {"iss": TOKEN_ISSUER, "sub": "system:apiserver", "aud": "n1", "iat": now, "nbf": now,
                "exp": now + 60, "jti": f"j{time.monotonic_ns()}"}
        return {**base, **changes}

    async with httpx.AsyncClient(verify=False) as http:
        async def code(token: str | None) -> int:
            headers = {"authorization": f"Bearer {token}"} if token is not None else {}
            resp = await http.get(url, headers=headers)
            if resp.status_code == 401:
                assert resp.json()["reason"] == "Unauthorized"
            return resp.status_code

        fresh = cp.node_proxy.node_headers("n1")["authorization"].removeprefix("Bearer ")
        assert await code(fresh) == 200
        assert await code(fresh) == 401, "a replayed token"
        assert await code(None) == 401
        forged = jwt.encode(claims(), other_key, algorithm=TOKEN_ALGORITHM)
        assert await code(forged) == 401, "signed by another key"
        head, payload, sig = cp.node_proxy.node_headers("n1")["authorization"].removeprefix("Bearer ").split(".")
        tampered_payload = jwt.utils.base64url_encode(json.dumps(claims(aud="n1", exp=now + 3600)).encode()).decode()
        assert await code(f"{head}.{tampered_payload}.{sig}") == 401, "payload changed under the signature"
        unsigned = jwt.encode(claims(), None, algorithm="none")
        assert await code(unsigned) == 401, "alg none"
        creds = _server_credentials(cp)
        assert await code(creds.token("n1", now=now - 200)) == 401, "expired"
        assert await code(creds.token("n1", lifetime=3600)) == 401, "too long-lived"
        assert await code(creds.token("n2")) == 401, "for another node"
        assert await code(creds.token("n1")) == 200


def _server_credentials(cp: ControlPlane) -> Any:
    """The API server's node credentials (what signs the proxy tokens)."""
    headers = cp.node_proxy.node_headers  # a bound method of Security
    return headers.__self__.node_credentials  # type: ignore[attr-defined]


async def test_the_api_server_checks_which_node_answers(
        cp: ControlPlane, agent: tuple[AgentHttpServer, ServingCredentials]) -> None:
    """Through nodes/{name}/proxy the API server verifies the agent's certificate: n1's agent
    answers for n1; a Node n2 that points at n1's port gets 503, not n1's answer."""
    server, _ = agent
    async with connect(cp, cp.admin_token) as admin:
        for name in ("n1", "n2"):
            await admin.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}, raw=True)
            node = await admin.get("nodes", name, raw=True)
            node["status"] = {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                              "daemonEndpoints": {"kubeletEndpoint": {"Port": server.port}}}
            await admin.update_status(node, raw=True)
        ok = await admin.raw_request("GET", "/api/v1/nodes/n1/proxy/stats/summary")
        assert json.loads(ok.body) == {"node": {"nodeName": "n1"}}
        logs = await admin.raw_request("GET", "/api/v1/nodes/n1/proxy/containerLogs/default/p/c")
        assert logs.body == b"hello\n"
        wrong = await admin.raw_request("GET", "/api/v1/nodes/n2/proxy/stats/summary", raise_for_status=False)
        assert wrong.status == 503, wrong.body
        assert "CERTIFICATE_VERIFY_FAILED" in json.loads(wrong.body)["message"]


async def test_only_a_node_gets_a_serving_certificate_and_only_its_own(cp: ControlPlane, tmp_path: Path) -> None:
    token, _ = await join(cp, "n1", tmp_path / "n1")
    path = "/apis/bootstrap.gpufleet.io/v1/nodecertificaterequests"
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes.default.svc")]))
           .add_extension(x509.SubjectAlternativeName([x509.DNSName("kubernetes.default.svc"),
                                                       x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
           .sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    body = {"apiVersion": "bootstrap.gpufleet.io/v1", "kind": "NodeCertificateRequest", "metadata": {"name": "n1"},
            "spec": {"request": base64.b64encode(csr).decode()}}
    async with connect(cp, token) as node:
        resp = await node.raw_request("POST", path, json=body)
        cert = x509.load_pem_x509_certificate(base64.b64decode(json.loads(resp.body)["status"]["certificate"]))
        # Whatever the request asks for, the certificate is for n1's serving name only.
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert list(san) == [x509.DNSName(serving_name("n1"))]
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:n1"
        other = await node.raw_request("POST", path, json={**body, "metadata": {"name": "n2"}}, raise_for_status=False)
        assert other.status == 403 and 'may only ask for its own' in json.loads(other.body)["message"]
        bad = await node.raw_request("POST", path, json={**body, "spec": {"request": "bm90IGEgY3Ny"}},
                                     raise_for_status=False)
        assert bad.status == 422 and json.loads(bad.body)["details"]["causes"][0]["field"] == "spec.request"
    # An administrator's credentials (an agent run with them) get the named node's.
    async with connect(cp, cp.admin_token) as admin:
        resp = await admin.raw_request("POST", path, json=body, raise_for_status=False)
        assert resp.status == 201
    token = (await create_token_for(cp, "view"))
    for who in (cp.join_token, token):
        async with connect(cp, who) as other:
            resp = await other.raw_request("POST", path, json=body, raise_for_status=False)
            assert resp.status == 403, resp.body


async def create_token_for(cp: ControlPlane, role: str) -> str:
    from gpufleet.cli.commands.token import create_token

    async with connect(cp, cp.admin_token) as admin:
        return (await create_token(admin, user="viewer", namespace=None, role=role))["token"]


def gpu_node(name: str, gpus: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"capacity": {"nvidia.com/gpu": gpus, "cpu": "8"},
                       "allocatable": {"nvidia.com/gpu": gpus, "cpu": "8"}}}


@pytest.mark.parametrize("cp", [{"max_node_gpus": 8, "node_name_allowed": ["gpu-*"]}], indirect=True)
async def test_join_bounds_names_and_claimed_gpus(cp: ControlPlane, tmp_path: Path) -> None:
    async with connect(cp, cp.join_token) as joiner:
        resp = await joiner.raw_request("POST", "/apis/bootstrap.gpufleet.io/v1/nodetokenrequests",
                                        json={"metadata": {"name": "cpu-1"}}, raise_for_status=False)
        status = json.loads(resp.body)
        assert (resp.status, status["reason"]) == (403, "Forbidden")
        assert "is not in the server's --node-name-allowed list (gpu-*)" in status["message"]
    token = await node_token(lambda t: connect(cp, t), cp.join_token, "gpu-1", tmp_path / "gpu-1")
    async with connect(cp, token) as node:
        resp = await node.raw_request("POST", "/api/v1/nodes", json=gpu_node("gpu-1", "64"), raise_for_status=False)
        status = json.loads(resp.body)
        assert (resp.status, status["reason"]) == (422, "Invalid"), status
        assert [c["field"] for c in status["details"]["causes"]] == ["status.capacity[nvidia.com/gpu]",
                                                                    "status.allocatable[nvidia.com/gpu]"]
        assert "at most 8 GPUs per node (--max-node-gpus)" in status["message"]
        made = await node.create(gpu_node("gpu-1", "8"), raw=True)
        assert made["metadata"]["annotations"]["gpufleet.io/registered-by"] == "system:node:gpu-1"
        made["status"]["capacity"]["nvidia.com/gpu"] = "9"
        resp = await node.raw_request("PUT", "/api/v1/nodes/gpu-1/status", json=made, raise_for_status=False)
        assert resp.status == 422
        # The node cannot rewrite who registered it.
        fresh = await node.get("nodes", "gpu-1", raw=True)
        fresh["metadata"]["annotations"]["gpufleet.io/registered-by"] = "system:node:someone-else"
        kept = await node.update(fresh, raw=True)
        assert kept["metadata"]["annotations"]["gpufleet.io/registered-by"] == "system:node:gpu-1"


async def test_the_join_token_cannot_take_over_a_node_registered_by_another_identity(
        cp: ControlPlane, tmp_path: Path) -> None:
    async with connect(cp, cp.admin_token) as admin:
        await admin.create({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": "big-box", "annotations": {"gpufleet.io/registered-by": "system:node:provisioner"}}}, raw=True)
        await admin.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "pre-made"}}, raw=True)
    async with connect(cp, cp.join_token) as joiner:
        resp = await joiner.raw_request("POST", "/apis/bootstrap.gpufleet.io/v1/nodetokenrequests",
                                        json={"metadata": {"name": "big-box"}}, raise_for_status=False)
        status = json.loads(resp.body)
        assert (resp.status, status["reason"]) == (409, "AlreadyExists")
        assert "was registered by another identity (gpufleet.io/registered-by: system:node:provisioner)" \
            in status["message"]
        # A pre-made Node with no registration of its own is joined, as a kubelet registers over it.
        resp = await joiner.raw_request("POST", "/apis/bootstrap.gpufleet.io/v1/nodetokenrequests",
                                        json={"metadata": {"name": "pre-made"}}, raise_for_status=False)
        assert resp.status == 201
        # ... once: the name is taken now.
        resp = await joiner.raw_request("POST", "/apis/bootstrap.gpufleet.io/v1/nodetokenrequests",
                                        json={"metadata": {"name": "pre-made"}}, raise_for_status=False)
        assert resp.status == 409
    # A node that registered itself joins again once an admin revokes its token.
    token = await node_token(lambda t: connect(cp, t), cp.join_token, "n7", tmp_path / "n7")
    async with connect(cp, token) as node:
        await node.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n7"}}, raw=True)
    async with connect(cp, cp.admin_token) as admin:
        await admin.delete("secrets", "gpufleet-token-node-n7", "kube-system")
    (tmp_path / "n7" / "node-token").unlink()
    assert await node_token(lambda t: connect(cp, t), cp.join_token, "n7", tmp_path / "n7")


class StreamStub(Stub):
    async def open_exec(self, namespace: str, pod: str, container: str, command: list[str], tty: bool) -> Any:
        from gpufleet.agent.streamserver import StreamRefused

        raise StreamRefused(f"no {container} in {namespace}/{pod} to run {command}", "NotFound", 404)


async def test_the_agents_stream_websockets_answer_only_the_api_server(cp: ControlPlane, tmp_path: Path) -> None:
    from websockets.asyncio.client import connect as ws_connect
    from websockets.exceptions import InvalidStatus

    _, serving = await join(cp, "n1", tmp_path / "n1")
    server = AgentHttpServer(StreamStub(), "127.0.0.1", 0, serving=serving)
    await server.start()
    try:
        url = f"wss://127.0.0.1:{server.port}/exec/ns/p/main?command=id&stdout=true"
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        with pytest.raises(InvalidStatus) as refused:
            await ws_connect(url, ssl=ctx, subprotocols=["v5.channel.k8s.io"])  # type: ignore[list-item]
        assert refused.value.response.status_code == 401
        async with ws_connect(url, ssl=ctx, subprotocols=["v5.channel.k8s.io"],  # type: ignore[list-item]
                              additional_headers=cp.node_proxy.node_headers("n1")) as ws:
            message = await ws.recv()
        assert isinstance(message, bytes) and message[0] == 3  # the error channel
        status = json.loads(message[1:])
        assert (status["status"], status["reason"]) == ("Failure", "NotFound")
        assert status["message"] == "no main in ns/p to run ['id']"
    finally:
        await server.stop()
