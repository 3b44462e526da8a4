"""Several API servers on one PostgreSQL: what one accepts, the others serve and watch."""

from __future__ import annotations

import asyncio

import pytest

from gpufleet.api.k8s import ConfigMap
from gpufleet.apiserver.app import HttpServer
from gpufleet.apiserver.server import ApiServer
from gpufleet.client.api import Client
from gpufleet.client.errors import Conflict
from gpufleet.client.transport import HttpTransport
from gpufleet.store.base import open_store

pytestmark = pytest.mark.postgres


async def _server(url: str):
    store = open_store(url)
    await store.start()
    api = ApiServer(store)
    await api.start()
    http = HttpServer(api, port=0)
    await http.start()
    client = Client(HttpTransport(f"http://127.0.0.1:{http.port}"))
    return store, http, client


async def test_two_api_servers_share_one_database(postgres_url: str) -> None:
    (store_a, http_a, a), (store_b, http_b, b) = await _server(postgres_url), await _server(postgres_url)
    try:
        start = (await b.list(ConfigMap, "default")).resource_version
        seen: list[tuple[str, str]] = []

        async def watch_b() -> None:
            async for ev in b.watch(ConfigMap, "default", resource_version=start):
                seen.append((ev.type, ev.object.metadata.name))
                if len(seen) == 3:
                    return

        watcher = asyncio.create_task(watch_b())
        created = await a.create(ConfigMap(metadata={"name": "shared"}, data={"k": "1"}), "default")
        # Served by B at once, and a compare-and-swap through B with A's revision wins once.
        assert (await b.get(ConfigMap, "shared", "default")).data == {"k": "1"}
        created.data = {"k": "2"}
        await b.update(created)
        created.data = {"k": "3"}
        with pytest.raises(Conflict):
            await a.update(created)
        await a.delete(ConfigMap, "shared", "default")
        await asyncio.wait_for(watcher, 10)
        assert seen == [("ADDED", "shared"), ("MODIFIED", "shared"), ("DELETED", "shared")]
    finally:
        for client, http, store in ((a, http_a, store_a), (b, http_b, store_b)):
            await client.close()
            await http.stop()
            await store.close()


async def test_servers_sharing_the_service_account_key_accept_each_others_tokens(postgres_url: str,
                                                                                 tmp_path) -> None:
    """As the README says: copy pki/sa.key and pki/sa.pub (with the CA) to every server of a
    store, or tokens one issues are refused by the others. All of them are in the
    default/kubernetes Endpoints."""
    import json
    import shutil

    from gpufleet.cli.controlplane import ControlPlane

    def plane(name: str) -> ControlPlane:
        return ControlPlane(store_url=postgres_url, port=0, state_dir=tmp_path / name, run_controllers=False)

    a = plane("a")
    await a.start()
    (tmp_path / "b" / "pki").mkdir(parents=True)
    for f in ("ca.crt", "ca.key", "sa.key", "sa.pub"):
        shutil.copy(tmp_path / "a" / "pki" / f, tmp_path / "b" / "pki" / f)
    b, c = plane("b"), plane("c")
    await b.start()
    await c.start()
    try:
        admin = Client(HttpTransport(a.url, token=a.admin_token, ca_data=a.ca_pem))
        await admin.create({"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": "bot", "namespace": "default"}}, raw=True)
        resp = await admin.raw_request("POST", "/api/v1/namespaces/default/serviceaccounts/bot/token",
                                       content=json.dumps({"spec": {}}), headers={"content-type": "application/json"})
        token = json.loads(resp.body)["status"]["token"]
        review = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        for cp, status in ((a, 201), (b, 201), (c, 401)):
            bot = Client(HttpTransport(cp.url, token=token, ca_data=cp.ca_pem), read_retries=1)
            r = await bot.raw_request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", content=review,
                                      headers={"content-type": "application/json"}, raise_for_status=False)
            assert r.status == status, (cp.state_dir, r.body)
            await bot.close()
        ports = {cp.http.port for cp in (a, b, c) if cp.http is not None}
        ep = await admin.get("endpoints", "kubernetes", "default", raw=True)
        assert {s["ports"][0]["port"] for s in ep["subsets"]} == ports
        await admin.close()
    finally:
        for cp in (c, b, a):
            await cp.stop()
