"""Request limits against a real `gpufleet up` with a node agent joined over HTTPS: a 31 MB
body is refused at once with 413 (with a team's edit token or none), and while a tenant
floods the server with 200 concurrent lists and such bodies, /readyz keeps answering within
100 ms (95 in 100 probes) and the node's Lease keeps renewing (no node goes NotReady)."""

from __future__ import annotations

import asyncio
import json
import ssl
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from e2e_helpers import Fleet, running_fleet

pytestmark = pytest.mark.e2e

NODE = "limits-node"
BIG = 31 * 1000 * 1000
LIMIT = 3 * 1024 * 1024
FLOOD_SECONDS = 10.0
FLOOD = Path(__file__).with_name("flood_client.py")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("limits")
    with running_fleet(root, ["up", "--no-agent", "--gateway-port", "-1"], [NODE], gpus=1,
                       runtime="simulated") as f:
        yield f


@pytest.fixture(scope="module")
def ca(fleet: Fleet) -> str:
    return str(fleet.state / "pki" / "ca.crt")


@pytest.fixture(scope="module")
def admin(fleet: Fleet, ca: str) -> httpx.Client:
    import yaml

    token = yaml.safe_load(Path(fleet.kubeconfig).read_text())["users"][0]["user"]["token"]
    with httpx.Client(base_url=fleet.url, verify=ssl.create_default_context(cafile=ca),
                      headers={"authorization": f"Bearer {token}"}, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def edit_token(fleet: Fleet, admin: httpx.Client) -> str:
    r = admin.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": "team-a"}})
    assert r.status_code in (201, 409), r.text
    made = fleet.run_cli("token", "create", "--namespace", "team-a", "--role", "edit", "--user", "tenant")
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def _big_configmap() -> bytes:
    sys.path.insert(0, str(FLOOD.parent))
    from flood_client import big_configmap

    return big_configmap(BIG)


async def _raw_post(url: str, ca: str, path: str, headers: dict[str, str], body_prefix: bytes,
                    chunked: bool) -> tuple[int, dict]:
    """Sends the request head and only ``body_prefix`` of the body (as one chunk when
    ``chunked``), then reads the answer: it must come without the rest of the body."""
    parts = urlsplit(url)
    ctx = ssl.create_default_context(cafile=ca)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port, ssl=ctx)
    try:
        head = [f"POST {path} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json",
                *(f"{k}: {v}" for k, v in headers.items())]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        if body_prefix:
            writer.write(b"%x\r\n%s\r\n" % (len(body_prefix), body_prefix) if chunked else body_prefix)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 30)
        status = int(status_line.split()[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return status, json.loads(await reader.readexactly(length))
    finally:
        writer.close()


def test_a_31_mb_body_is_refused_at_once(fleet: Fleet, ca: str, edit_token: str, admin: httpx.Client) -> None:
    path = "/api/v1/namespaces/team-a/configmaps"
    auth = {"Authorization": f"Bearer {edit_token}"}
    # Content-Length over the limit: 413 from the head alone, with the token or without one.
    for headers in (auth, {}):
        status, st = asyncio.run(_raw_post(fleet.url, ca, path, {**headers, "Content-Length": str(BIG)}, b"", False))
        assert (status, st["kind"], st["reason"], st["code"]) == (413, "Status", "RequestEntityTooLarge", 413)
        assert st["message"] == f"Request entity too large: limit is {LIMIT}"
    # No length given: read as it comes and refused once past the limit; 4 MiB of 31 MB sent.
    body = _big_configmap()
    status, st = asyncio.run(_raw_post(fleet.url, ca, path, {**auth, "Transfer-Encoding": "chunked"},
                                       body[: 4 * 1024 * 1024], True))
    assert (status, st["reason"]) == (413, "RequestEntityTooLarge")
    # Without a token, nothing of it is read: the 401 comes on 16 KiB of the body.
    status, st = asyncio.run(_raw_post(fleet.url, ca, path, {"Transfer-Encoding": "chunked"},
                                       body[:16384], True))
    assert (status, st["reason"]) == (401, "Unauthorized")
    # An ordinary client sending the whole body gets the Status too: the server answers, then
    # closes the connection rather than read the rest; the client's next request opens another.
    with httpx.Client(base_url=fleet.url, verify=ssl.create_default_context(cafile=ca), timeout=60) as client:
        r = client.post(path, content=body, headers={**auth, "content-type": "application/json"})
        assert r.status_code == 413 and r.json()["reason"] == "RequestEntityTooLarge"
        r = client.get(path, headers=auth)
        assert r.status_code == 200
    assert admin.get(f"{path}/huge").status_code == 404  # nothing stored


def _lease(admin: httpx.Client) -> dict:
    r = admin.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}")
    assert r.status_code == 200, r.text
    return r.json()


def _ready(admin: httpx.Client) -> dict:
    node = admin.get(f"/api/v1/nodes/{NODE}").json()
    return next(c for c in node["status"]["conditions"] if c["type"] == "Ready")


def test_readyz_and_node_leases_hold_while_a_tenant_floods(fleet: Fleet, ca: str, edit_token: str,
                                                           admin: httpx.Client) -> None:
    asyncio.run(fleet.nodes_ready(_AdminNodes(admin)))
    ready_before = _ready(admin)
    renewals: set[str] = set()
    # The flood runs niced: on a cluster it comes from other machines, here it shares this
    # one's cores with the server, and its CPU must not be what the probe measures.
    flood = subprocess.Popen(
        ["nice", "-n", "10", sys.executable, str(FLOOD), "--url", fleet.url, "--token", edit_token, "--ca", ca, "--namespace", "team-a",
         "--concurrency", "200", "--seconds", str(FLOOD_SECONDS), "--big-bodies", "4", "--big-size", str(BIG)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    latencies: list[float] = []
    try:
        # /readyz probed as a kubelet does, a new connection each time, through the flood.
        ctx = ssl.create_default_context(cafile=ca)
        time.sleep(1.0)  # the flood's connections are up and its requests arriving
        start = time.monotonic()
        while flood.poll() is None and time.monotonic() - start < FLOOD_SECONDS:
            with httpx.Client(base_url=fleet.url, verify=ctx, timeout=10) as probe:
                t0 = time.perf_counter()
                r = probe.get("/readyz")
                latencies.append(time.perf_counter() - t0)
                assert r.status_code == 200 and r.text == "ok"
            if len(latencies) % 10 == 0:
                renewals.add(_lease(admin)["spec"]["renewTime"])
            time.sleep(0.05)
    finally:
        out, err = flood.communicate(timeout=120)
    assert flood.returncode == 0, err
    report = json.loads(out)
    latencies.sort()
    p95 = latencies[int(len(latencies) * 0.95)]
    print(f"\n/readyz under the flood: n={len(latencies)} p50={statistics.median(latencies) * 1000:.1f}ms "
          f"p95={p95 * 1000:.1f}ms max={latencies[-1] * 1000:.1f}ms; flood: {report}")
    # The tenant was served within its share and told to come back for the rest, never a 5xx.
    lists = report["counts"]["list"]
    assert lists.get("200", 0) > 0 and set(lists) <= {"200", "429"}, report
    assert set(report["counts"]["big-authenticated"]) == {"413"}, report
    assert set(report["counts"].get("big-unauthenticated", {})) <= {"401", "413"}, report
    assert set(report["errors"]) <= {"big-unauthenticated"}, report
    # The one timed assertion the issue asks for: /readyz within 100 ms. On a shared 2-core
    # machine the flood, the server and the probe contend for the CPU, and single probes
    # there take over 100 ms even idle now and then, so it holds for 95 in 100 probes.
    assert len(latencies) >= 20
    assert p95 < 0.1, f"/readyz p95 {p95 * 1000:.0f} ms under the flood (max {latencies[-1] * 1000:.0f} ms)"
    # The node renewed its Lease all along and never went NotReady.
    assert len(renewals) >= 3, renewals
    ready_after = _ready(admin)
    assert ready_after["status"] == "True"
    assert ready_after["lastTransitionTime"] == ready_before["lastTransitionTime"]
    events = admin.get("/api/v1/events").json()["items"]
    assert not [e for e in events if e.get("reason") == "NodeNotReady" and e["involvedObject"]["name"] == NODE]


class _AdminNodes:
    """Enough of the client for Fleet.nodes_ready."""

    def __init__(self, admin: httpx.Client) -> None:
        self.admin = admin

    async def list(self, kind: str, raw: bool = True) -> list[dict]:
        return self.admin.get("/api/v1/nodes").json()["items"]
