"""ResourceQuota admission: messages as Kubernetes words them, scopes, dry-run, and the
charge being exact under many concurrent creates and deletes over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
from typing import Any

import pytest
from apiserver_helpers import PODS, Api

from gpufleet.apiserver.app import HttpServer
from gpufleet.apiserver.server import ApiServer
from gpufleet.client.api import Client
from gpufleet.client.errors import ApiError
from gpufleet.client.kubeconfig import write_kubeconfig
from gpufleet.client.transport import HttpTransport, LocalTransport
from gpufleet.controllers.manager import start_controllers
from gpufleet.store.base import open_store

QUOTAS = "/api/v1/namespaces/default/resourcequotas"


def quota(name: str, hard: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name},
            "spec": {"hard": hard, **spec}}


def pod(name: str, *, gpus: int = 0, cpu: str | None = None, memory: str | None = None,
        limits: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    requests: dict[str, str] = {}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    if cpu:
        requests["cpu"] = cpu
    if memory:
        requests["memory"] = memory
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    lim = dict(limits or {})
    if gpus:
        lim.setdefault("nvidia.com/gpu", str(gpus))
    if lim:
        resources["limits"] = lim
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "trainer:1", "resources": resources}], **spec}}


async def used(api: Api, name: str) -> dict[str, str]:
    return (await api.must_get(f"{QUOTAS}/{name}"))["status"]["used"]


async def test_exceeding_create_is_forbidden_with_the_kubernetes_message(api: Api) -> None:
    await api.create(QUOTAS, quota("team-a", {"requests.nvidia.com/gpu": "8", "pods": "10"}))
    await api.create(PODS, pod("a", gpus=6))
    r = await api.post(PODS, pod("x", gpus=4))
    assert r.status == 403
    body = r.json
    assert body["reason"] == "Forbidden"
    assert body["message"] == ('pods "x" is forbidden: exceeded quota: team-a, requested: '
                               "requests.nvidia.com/gpu=4, used: requests.nvidia.com/gpu=6, "
                               "limited: requests.nvidia.com/gpu=8")
    assert body["details"] == {"name": "x", "kind": "pods"}
    assert (await used(api, "team-a")) == {"pods": "1", "requests.nvidia.com/gpu": "6"}
    await api.create(PODS, pod("y", gpus=2))
    assert (await used(api, "team-a")) == {"pods": "2", "requests.nvidia.com/gpu": "8"}


async def test_missing_requests_under_a_cpu_quota_are_named(api: Api) -> None:
    await api.create(QUOTAS, quota("compute", {"requests.cpu": "4", "limits.memory": "8Gi"}))
    r = await api.post(PODS, pod("bare"))
    assert r.status == 403
    assert r.json["message"] == ('pods "bare" is forbidden: failed quota: compute: '
                                 "must specify limits.memory for: main; requests.cpu for: main")
    ok = await api.post(PODS, pod("sized", cpu="1500m", limits={"memory": "3Gi"}))
    assert ok.status == 201, ok
    assert (await used(api, "compute")) == {"limits.memory": "3Gi", "requests.cpu": "1500m"}
    r = await api.post(PODS, pod("big", cpu="3", limits={"memory": "6Gi"}))
    assert r.status == 403
    assert r.json["message"] == ('pods "big" is forbidden: exceeded quota: compute, requested: '
                                 "limits.memory=6Gi,requests.cpu=3, used: limits.memory=3Gi,requests.cpu=1500m, "
                                 "limited: limits.memory=8Gi,requests.cpu=4")


async def test_object_counts_and_dry_run(api: Api) -> None:
    await api.create(QUOTAS, quota("objects", {"count/deployments.apps": "1", "configmaps": "1"}))
    deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d1"},
              "spec": {"selector": {"matchLabels": {"a": "b"}},
                       "template": {"metadata": {"labels": {"a": "b"}},
                                    "spec": {"containers": [{"name": "c", "image": "i"}]}}}}
    path = "/apis/apps/v1/namespaces/default/deployments"
    dry = await api.call("POST", path, deploy, query={"dryRun": "All"})
    assert dry.status == 201, dry
    assert "status" not in await api.must_get(f"{QUOTAS}/objects")  # a dry run charges nothing
    await api.create(path, deploy)
    r = await api.post(path, {**deploy, "metadata": {"name": "d2"}})
    assert r.status == 403
    assert r.json["message"] == ('deployments.apps "d2" is forbidden: exceeded quota: objects, requested: '
                                 "count/deployments.apps=1, used: count/deployments.apps=1, "
                                 "limited: count/deployments.apps=1")
    assert r.json["details"] == {"name": "d2", "group": "apps", "kind": "deployments"}
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1"}}
    await api.create("/api/v1/namespaces/default/configmaps", cm)
    r = await api.post("/api/v1/namespaces/default/configmaps", {**cm, "metadata": {"name": "c2"}})
    assert r.status == 403 and "exceeded quota: objects, requested: configmaps=1" in r.json["message"]


async def test_scopes_select_which_pods_a_quota_covers(api: Api) -> None:
    await api.create(QUOTAS, quota("best-effort", {"pods": "1"}, scopes=["BestEffort"]))
    await api.create(QUOTAS, quota("high", {"requests.nvidia.com/gpu": "2"}, scopeSelector={
        "matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}))
    await api.create("/apis/scheduling.k8s.io/v1/priorityclasses",
                     {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                      "metadata": {"name": "high"}, "value": 1000})
    await api.create(PODS, pod("free-1"))
    assert (await api.post(PODS, pod("free-2"))).status == 403
    # Pods with requests are NotBestEffort: the BestEffort quota does not count them.
    await api.create(PODS, pod("sized", cpu="1"))
    # Only pods of the "high" class spend the GPU quota (QoS looks at cpu and memory only:
    # a pod asking for GPUs alone is BestEffort).
    await api.create(PODS, pod("low-gpu", gpus=4, cpu="1"))
    await api.create(PODS, pod("high-gpu", gpus=2, cpu="1", priorityClassName="high"))
    r = await api.post(PODS, pod("high-gpu-2", gpus=1, cpu="1", priorityClassName="high"))
    assert r.status == 403 and "exceeded quota: high," in r.json["message"]
    assert (await used(api, "best-effort")) == {"pods": "1"}
    assert (await used(api, "high")) == {"requests.nvidia.com/gpu": "2"}


async def test_a_new_quota_counts_what_already_exists(api: Api) -> None:
    await api.create(PODS, pod("before-1", gpus=3))
    await api.create(PODS, pod("before-2", gpus=3))
    await api.create(QUOTAS, quota("late", {"requests.nvidia.com/gpu": "8"}))
    r = await api.post(PODS, pod("after", gpus=3))
    assert r.status == 403
    assert "used: requests.nvidia.com/gpu=6," in r.json["message"]


async def test_extended_resource_quota_needs_the_requests_prefix(api: Api) -> None:
    r = await api.post(QUOTAS, quota("wrong", {"nvidia.com/gpu": "4"}))
    assert r.status == 422
    assert "requests.nvidia.com/gpu" in r.json["message"]


# ---------------------------------------------------------------------------- concurrency

HARD_PODS = 40


async def _quota_used(client: Client, name: str) -> dict[str, str]:
    rq = await client.get("resourcequotas", name, "default", raw=True)
    return (rq.get("status") or {}).get("used") or {}


@pytest.mark.parametrize("store_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
                         indirect=True)
async def test_concurrent_creates_and_deletes_never_exceed_the_quota(store_url: str) -> None:
    # Two API servers on one store, as in a highly available control plane: charges made
    # through one must hold against the other (compare-and-swap, not a lock in memory).
    stores, webs = [], []
    for _ in range(2):
        store = open_store(store_url)
        await store.start()
        server = ApiServer(store)
        await server.start()
        web = HttpServer(server, port=0)
        await web.start()
        stores.append(store)
        webs.append((server, web))
    manager = await start_controllers(Client(LocalTransport(webs[0][0])), enabled=("resourcequota",),
                                      quota_charge_grace=0.5, quota_resync_period=3600.0)
    clients = [Client(HttpTransport(f"http://127.0.0.1:{web.port}", max_connections=64)) for _, web in webs]
    http = clients[0]
    live: set[str] = set()
    peak = 0
    # Every pod event from before the first create on, whenever the watch gets going.
    start_rv = (await http.list("pods", "default", raw=True)).resource_version

    async def count_pods() -> None:
        nonlocal peak
        async for ev in http.watch("pods", "default", raw=True, resource_version=start_rv,
                                   allow_bookmarks=False):
            name = ev.object["metadata"]["name"]
            if ev.type == "ADDED":
                live.add(name)
            elif ev.type == "DELETED":
                live.discard(name)
            peak = max(peak, len(live))

    watcher = asyncio.create_task(count_pods())
    try:
        await http.create(quota("team-a", {"pods": str(HARD_PODS), "requests.nvidia.com/gpu": str(2 * HARD_PODS)}),
                          "default", raw=True)

        async def create(name: str) -> bool:
            try:
                await clients[sum(map(ord, name)) % 2].create(pod(name, gpus=2), "default", raw=True)
                return True
            except ApiError as e:
                assert e.code == 403, e
                assert "exceeded quota: team-a" in str(e)
                return False

        # 1: 200 creates at once against room for 40: exactly 40 get in.
        results = await asyncio.gather(*(create(f"p{i}") for i in range(200)))
        assert sum(results) == HARD_PODS
        assert await _quota_used(http, "team-a") == {"pods": str(HARD_PODS),
                                                     "requests.nvidia.com/gpu": str(2 * HARD_PODS)}

        # 2: 200 more operations at once: deletes of the admitted pods mixed with new creates.
        admitted = [f"p{i}" for i, ok in enumerate(results) if ok]
        rng = random.Random(7)
        ops: list[Any] = [clients[i % 2].delete("pods", n, "default") for i, n in enumerate(admitted[:30])]
        ops += [create(f"q{i}") for i in range(170)]
        rng.shuffle(ops)
        await asyncio.gather(*ops, return_exceptions=False)

        # After the controller's pass the usage is exactly what exists.
        async def settled() -> bool:
            pods = await http.list("pods", "default", raw=True)
            want = {"pods": str(len(pods)), "requests.nvidia.com/gpu": str(2 * len(pods))}
            return await _quota_used(http, "team-a") == want

        for _ in range(100):
            if await settled():
                break
            await asyncio.sleep(0.1)
        assert await settled()
        remaining = len(await http.list("pods", "default", raw=True))
        assert remaining <= HARD_PODS
        # Freed room is handed out again once the controller released it.
        assert remaining > HARD_PODS - 30 or await create("late")
        final = len(await http.list("pods", "default", raw=True))
        for _ in range(100):
            if len(live) == final:
                break
            await asyncio.sleep(0.05)
        assert len(live) == final
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
        for c in clients:
            await c.close()
        await manager.stop()
        for _, web in webs:
            await web.stop()
        for store in stores:
            await store.close()
    assert peak == HARD_PODS  # reached, never passed


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_kubectl_reports_the_quota_refusal(store_url: str, tmp_path: Any) -> None:
    store = open_store(store_url)
    await store.start()
    server = ApiServer(store)
    await server.start()
    web = HttpServer(server, port=0)
    await web.start()
    write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{web.port}")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "KUBECONFIG": str(tmp_path / "kubeconfig"), "TERM": "dumb"}

    async def kubectl(*args: str, stdin: str) -> tuple[int, str, str]:
        # The server runs on this event loop: kubectl must not block it.
        proc = await asyncio.create_subprocess_exec(
            "/usr/bin/kubectl", *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env)
        out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 60)
        return proc.returncode or 0, out.decode(), err.decode()

    try:
        manifests = [quota("team-a", {"requests.nvidia.com/gpu": "8"}), pod("a", gpus=6)]
        code, out, err = await kubectl("apply", "-f", "-", stdin="\n".join(json.dumps(m) for m in manifests))
        assert code == 0, err
        code, out, err = await kubectl("create", "-f", "-", stdin=json.dumps(pod("x", gpus=4)))
        assert code == 1
        assert err.strip() == (
            'Error from server (Forbidden): error when creating "STDIN": pods "x" is forbidden: exceeded quota: '
            "team-a, requested: requests.nvidia.com/gpu=4, used: requests.nvidia.com/gpu=6, "
            "limited: requests.nvidia.com/gpu=8")
    finally:
        await web.stop()
        await store.close()


def test_overhead_is_charged_to_requests_and_only_to_limits_a_pod_sets() -> None:
    # Kubernetes' PodLimits adds spec.overhead only to limits that are set; the quota's own
    # arithmetic used to make up limits.cpu/limits.memory from the overhead alone.
    from gpufleet.api.quota import object_usage

    p = pod("p", cpu="1", limits={"memory": "1Gi"}, overhead={"cpu": "250m", "memory": "64Mi"})
    usage = {k: str(v) for k, v in object_usage("pods", p).items()}
    assert usage["requests.cpu"] == "5/4"
    assert usage["requests.memory"] == str(64 * 2**20 + 2**30)  # the memory limit is its request
    assert usage["limits.memory"] == str(2**30 + 64 * 2**20)
    assert "limits.cpu" not in usage
