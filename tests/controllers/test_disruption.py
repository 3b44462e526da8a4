"""PodDisruptionBudget status from the disruption controller, and the eviction API spending
it: 429 with Kubernetes' message once no disruption is allowed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ctrl_helpers import NS, eventually, pod, set_pod_status

from gpufleet.api.k8s import Pod
from gpufleet.client.api import Client
from gpufleet.controllers.disruption import pdb_status, scaled

PDBS = "poddisruptionbudgets.policy"


def pdb(name: str, selector: dict[str, str] | None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                            "metadata": {"name": name, "namespace": NS}, "spec": dict(spec)}
    if selector is not None:
        body["spec"]["selector"] = {"matchLabels": selector}
    return body


def replicaset_body(name: str, replicas: int, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}}}}


async def owned_pods(client: Client, owner: dict[str, Any], count: int, labels: dict[str, str]) -> list[str]:
    names = []
    for i in range(count):
        body = pod(f"{owner['metadata']['name']}-{i}", labels)
        body["metadata"]["ownerReferences"] = [{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": True}]
        created = await client.create(body, raw=True)
        await set_pod_status(client, created["metadata"]["name"])
        names.append(created["metadata"]["name"])
    return names


async def status_of(client: Client, name: str) -> dict[str, Any]:
    return (await client.get(PDBS, name, NS, raw=True)).get("status") or {}


async def evict(client: Client, name: str) -> Any:
    return await client.raw_request(
        "POST", f"/api/v1/namespaces/{NS}/pods/{name}/eviction",
        json={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": NS}},
        raise_for_status=False)


def test_percentages_round_up() -> None:
    assert scaled("50%", 3) == 2
    assert scaled("34%", 3) == 2
    assert scaled(1, 10) == 1


def test_recently_evicted_pods_do_not_count_as_healthy() -> None:
    budget = {"metadata": {"generation": 2}, "spec": {"minAvailable": 1},
              "status": {"disruptedPods": {"a": "2026-01-01T00:00:00Z"}}}
    ready = {"type": "Ready", "status": "True"}
    pods = [{"metadata": {"name": n}, "status": {"conditions": [ready]}} for n in ("a", "b")]
    typed = [Pod.from_dict({"apiVersion": "v1", "kind": "Pod", **p}) for p in pods]
    now = 1767225600.0 + 30  # 30 s after the eviction
    status, recheck = pdb_status(budget, typed, None, None, now)
    assert (status["currentHealthy"], status["disruptionsAllowed"]) == (1, 0)
    assert recheck == 1767225600.0 + 120
    later, _ = pdb_status(budget, typed, None, None, now + 200)
    assert (later["currentHealthy"], later["disruptionsAllowed"]) == (2, 1)
    assert "disruptedPods" not in later


async def test_min_available_budget_and_eviction(client: Client, controllers: Any) -> None:
    await controllers(enabled=("disruption",))
    labels = {"app": "serve"}
    rs = await client.create(replicaset_body("serve", 3, labels), raw=True)
    names = await owned_pods(client, rs, 3, labels)
    await client.create(pdb("serve", labels, minAvailable=2), raw=True)

    async def ready_status() -> dict[str, Any] | None:
        st = await status_of(client, "serve")
        return st if st.get("currentHealthy") == 3 else None

    st = await eventually(ready_status, what="pdb status")
    assert {k: st[k] for k in ("observedGeneration", "expectedPods", "currentHealthy", "desiredHealthy",
                               "disruptionsAllowed")} == {
        "observedGeneration": 1, "expectedPods": 3, "currentHealthy": 3, "desiredHealthy": 2,
        "disruptionsAllowed": 1}
    cond = st["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == ("DisruptionAllowed", "True", "SufficientPods")

    first = await evict(client, names[0])
    assert first.status == 201, first.body

    async def settled() -> dict[str, Any] | None:
        st = await status_of(client, "serve")
        return st if st.get("currentHealthy") == 2 and "disruptedPods" not in st else None

    st = await eventually(settled, what="pdb after eviction")
    assert (st["disruptionsAllowed"], st["conditions"][0]["reason"]) == (0, "InsufficientPods")

    second = await evict(client, names[1])
    assert second.status == 429
    body = json.loads(second.body)
    assert body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [{"reason": "DisruptionBudget",
                                          "message": "The disruption budget serve needs 2 healthy pods and has 2 "
                                                     "currently"}]
    assert (await client.get("pods", names[1], NS, raw=True))["metadata"]["name"] == names[1]


async def test_concurrent_evictions_spend_the_budget_once(client: Client, controllers: Any) -> None:
    await controllers(enabled=("disruption",))
    labels = {"app": "gang"}
    rs = await client.create(replicaset_body("gang", 4, labels), raw=True)
    names = await owned_pods(client, rs, 4, labels)
    await client.create(pdb("gang", labels, maxUnavailable=1), raw=True)

    async def ready_status() -> dict[str, Any] | None:
        st = await status_of(client, "gang")
        return st if st.get("disruptionsAllowed") == 1 else None

    await eventually(ready_status, what="pdb status")
    replies = await asyncio.gather(*(evict(client, n) for n in names))
    assert sorted(r.status for r in replies) == [201, 429, 429, 429]


async def test_max_unavailable_uses_the_controllers_scale(client: Client, controllers: Any) -> None:
    await controllers(enabled=("disruption",))
    labels = {"app": "train"}
    rs = await client.create(replicaset_body("train", 4, labels), raw=True)
    await owned_pods(client, rs, 3, labels)  # one replica still missing
    await client.create(pdb("train", labels, maxUnavailable="50%"), raw=True)

    async def computed() -> dict[str, Any] | None:
        st = await status_of(client, "train")
        return st if st.get("currentHealthy") == 3 else None

    st = await eventually(computed, what="pdb status")
    assert (st["expectedPods"], st["desiredHealthy"], st["disruptionsAllowed"]) == (4, 2, 1)

    await client.create(pod("stray", labels), raw=True)
    await set_pod_status(client, "stray")

    async def failed_safe() -> dict[str, Any] | None:
        st = await status_of(client, "train")
        return st if st["conditions"][0]["reason"] == "SyncFailed" else None

    st = await eventually(failed_safe, what="SyncFailed")
    assert st["disruptionsAllowed"] == 0
    assert st["conditions"][0]["message"] == 'found no controller ref for pod "stray"'
