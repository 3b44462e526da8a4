"""Prometheus (Debian's package, a real server on loopback) scrapes the API server's /metrics
over HTTPS with a service account token bound to the system:monitoring ClusterRole; a token
without the role is refused (403). What Prometheus saw is read back through its own HTTP API."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpufleet.cli.controlplane import ControlPlane

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (apt-get install prometheus)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    plane = ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path / "state",
                         run_controllers=False)
    await plane.start()
    yield plane
    await plane.stop()


async def service_account_token(admin: httpx.AsyncClient, name: str, cluster_role: str | None) -> str:
    ns = "monitoring"
    r = await admin.post(f"/api/v1/namespaces/{ns}/serviceaccounts",
                         json={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    assert r.status_code == 201, r.text
    if cluster_role is not None:
        r = await admin.post("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", json={
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]})
        assert r.status_code == 201, r.text
    r = await admin.post(f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token",
                         json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}})
    assert r.status_code == 201, r.text
    return r.json()["status"]["token"]


def scrape_job(name: str, port: int, ca: Path, token_file: Path) -> dict[str, Any]:
    return {"job_name": name, "scheme": "https", "metrics_path": "/metrics",
            "scrape_interval": "2s", "scrape_timeout": "2s",
            "tls_config": {"ca_file": str(ca)},
            "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}


async def wait_for(what: str, check: Any, within: float = 90.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: Any = None
    while loop.time() < deadline:
        # Until Prometheus is ready its API answers 503 in plain text.
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            ok, last = await check()
            if ok:
                return last
        await asyncio.sleep(0.5)
    raise AssertionError(f"{what}: not seen in {within:.0f}s; last: {last}")


async def test_prometheus_scrapes_the_api_server_with_a_monitoring_token(cp: ControlPlane, tmp_path: Path) -> None:
    ctx = ssl.create_default_context(cadata=cp.ca_pem.decode())
    async with httpx.AsyncClient(base_url=cp.url, verify=ctx, timeout=30,
                                 headers={"authorization": f"Bearer {cp.admin_token}"}) as admin:
        r = await admin.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": "monitoring"}})
        assert r.status_code == 201, r.text
        allowed = await service_account_token(admin, "prometheus", "system:monitoring")
        refused = await service_account_token(admin, "no-role", None)
        await admin.get("/api/v1/namespaces/default/configmaps")  # a request for the scrape to count
    async with httpx.AsyncClient(base_url=cp.url, verify=ctx, timeout=30,
                                 headers={"authorization": f"Bearer {refused}"}) as other:
        r = await other.get("/metrics")
    assert r.status_code == 403 and r.json()["reason"] == "Forbidden"
    assert r.json()["message"] == 'forbidden: User "system:serviceaccount:monitoring:no-role" cannot get path "/metrics"'

    tokens = tmp_path / "prometheus"
    tokens.mkdir()
    (tokens / "allowed").write_text(allowed)
    (tokens / "refused").write_text(refused)
    assert cp.tls_ca_file is not None and cp.http is not None
    config = {"global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
              "scrape_configs": [scrape_job("apiserver", cp.http.port, cp.tls_ca_file, tokens / "allowed"),
                                 scrape_job("apiserver-no-role", cp.http.port, cp.tls_ca_file, tokens / "refused")]}
    (tokens / "prometheus.yml").write_text(yaml.safe_dump(config))
    web = free_port()
    assert PROMETHEUS is not None
    log = (tmp_path / "prometheus.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        PROMETHEUS, f"--config.file={tokens / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{web}", "--log.level=warn", stdout=log, stderr=subprocess.STDOUT)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{web}", timeout=10) as prom:
            async def targets() -> tuple[bool, Any]:
                if proc.returncode is not None:
                    raise AssertionError(f"prometheus exited: {(tmp_path / 'prometheus.log').read_text()}")
                active = (await prom.get("/api/v1/targets")).json()["data"]["activeTargets"]
                by_job = {t["labels"]["job"]: t for t in active}
                done = (by_job.get("apiserver", {}).get("health") == "up"
                        and by_job.get("apiserver-no-role", {}).get("health") == "down")
                return done, by_job

            by_job = await wait_for("the API server target up, the one without the role down", targets)
            assert by_job["apiserver"]["scrapeUrl"] == f"https://127.0.0.1:{cp.http.port}/metrics"
            assert by_job["apiserver"]["lastError"] == ""
            assert "403" in by_job["apiserver-no-role"]["lastError"]

            async def series() -> tuple[bool, Any]:
                r = await prom.get("/api/v1/query", params={
                    "query": 'apiserver_request_total{job="apiserver",resource="configmaps",verb="LIST"}'})
                result = r.json()["data"]["result"]
                return bool(result), result

            result = await wait_for("apiserver_request_total in Prometheus", series)
            labels = result[0]["metric"]  # Prometheus stores no empty label
            assert {k: labels.get(k, "") for k in ("component", "group", "version", "scope", "code")} == {
                "component": "apiserver", "group": "", "version": "v1", "scope": "namespace", "code": "200"}
            assert float(result[0]["value"][1]) >= 1
            r = await prom.get("/api/v1/query", params={"query": 'up{job="apiserver-no-role"}'})
            assert r.json()["data"]["result"][0]["value"][1] == "0"
            # Prometheus' own scrapes are counted too, under the non-resource path.
            r = await prom.get("/api/v1/query", params={
                "query": 'apiserver_request_total{job="apiserver",subresource="/metrics",code="403"}'})
            assert r.json()["data"]["result"], "the refused scrapes are not counted"
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()
