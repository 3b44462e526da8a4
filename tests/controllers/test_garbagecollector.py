from __future__ import annotations

from typing import Any

from ctrl_helpers import NS, eventually, pod, replicaset, stays

from gpufleet.client.api import Client
from gpufleet.client.errors import NotFound

GC = ("garbagecollector",)


def configmap(name: str, *owners: dict[str, Any], block: bool = False) -> dict[str, Any]:
    refs = [{"apiVersion": o["apiVersion"], "kind": o["kind"], "name": o["metadata"]["name"],
             "uid": o["metadata"]["uid"], **({"blockOwnerDeletion": True} if block else {})} for o in owners]
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if refs:
        meta["ownerReferences"] = refs
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v"}}


async def exists(client: Client, kind: str, name: str) -> dict[str, Any] | None:
    try:
        return await client.get(kind, name, NS, raw=True)
    except NotFound:
        return None


async def gone(client: Client, kind: str, name: str) -> bool:
    return await exists(client, kind, name) is None


async def test_background_deletion_of_dependents(client: Client, controllers) -> None:
    await controllers(enabled=("replicaset", *GC))
    rs = await client.create(replicaset("web", 2), raw=True)
    uid = rs["metadata"]["uid"]
    pods = await eventually(lambda: _pods_of(client, uid, 2))
    await client.delete("replicasets", "web", NS, propagation_policy="Background")
    for p in pods:
        await eventually(lambda p=p: gone(client, "pods", p["metadata"]["name"]), what="pod collected")


async def test_dangling_references_found_at_start_are_collected(client: Client, controllers) -> None:
    owner = await client.create(configmap("owner"), raw=True)
    await client.create(configmap("child", owner))
    await client.delete("configmaps", "owner", NS)
    # A second owner that lives keeps its dependent; only the dead reference goes.
    other = await client.create(configmap("other"), raw=True)
    await client.create(configmap("shared", owner, other))
    await controllers(enabled=GC)
    await eventually(lambda: gone(client, "configmaps", "child"))
    shared = await eventually(lambda: _refs_are(client, "shared", [other["metadata"]["uid"]]))
    assert shared["metadata"]["name"] == "shared"


async def test_foreground_deletion_waits_for_blocking_dependents(client: Client, controllers) -> None:
    await controllers(enabled=GC)
    owner = await client.create(configmap("owner"), raw=True)
    held = configmap("held", owner, block=True)
    held["metadata"]["finalizers"] = ["test/hold"]
    await client.create(held)
    await client.create(configmap("free", owner, block=True))
    await client.create(configmap("loose", owner))
    await client.delete("configmaps", "owner", NS, propagation_policy="Foreground")

    await eventually(lambda: gone(client, "configmaps", "free"))
    await eventually(lambda: gone(client, "configmaps", "loose"))
    # "held" is being deleted but its finalizer keeps it, so the owner waits.
    h = await exists(client, "configmaps", "held")
    assert h is not None and h["metadata"].get("deletionTimestamp")
    o = await exists(client, "configmaps", "owner")
    assert o is not None and "foregroundDeletion" in o["metadata"]["finalizers"]
    await stays(lambda: exists(client, "configmaps", "owner"), 0.3)

    h["metadata"]["finalizers"] = []
    await client.update(h)
    await eventually(lambda: gone(client, "configmaps", "owner"))


async def test_orphan_deletion_keeps_dependents(client: Client, controllers) -> None:
    await controllers(enabled=GC)
    owner = await client.create(configmap("owner"), raw=True)
    other = await client.create(configmap("other"), raw=True)
    await client.create(configmap("a", owner))
    await client.create(configmap("b", owner, other))
    await client.delete("configmaps", "owner", NS, propagation_policy="Orphan")
    await eventually(lambda: gone(client, "configmaps", "owner"))
    a = await exists(client, "configmaps", "a")
    assert a is not None and not a["metadata"].get("ownerReferences")
    b = await exists(client, "configmaps", "b")
    assert [r["uid"] for r in b["metadata"]["ownerReferences"]] == [other["metadata"]["uid"]]
    await stays(lambda: exists(client, "configmaps", "a"), 0.3)


async def test_pod_owned_by_deleted_node_lease_chain(client: Client, controllers) -> None:
    # Cluster-scoped owners work too: a node's Lease is collected with the node.
    await controllers(enabled=GC)
    node = await client.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}, raw=True)
    await client.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {
        "name": "n1", "namespace": "kube-node-lease", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": node["metadata"]["uid"]}]},
        "spec": {"holderIdentity": "n1"}})
    await client.create(pod("p", {"app": "x"}))
    await client.delete("nodes", "n1")

    async def lease_gone() -> bool:
        try:
            await client.get("leases", "n1", "kube-node-lease", raw=True)
        except NotFound:
            return True
        return False

    await eventually(lease_gone)
    assert await exists(client, "pods", "p")


async def _pods_of(client: Client, uid: str, n: int) -> list[dict[str, Any]] | None:
    pods = [p for p in await client.list("pods", NS, raw=True)
            if any(r["uid"] == uid for r in p["metadata"].get("ownerReferences") or [])]
    return pods if len(pods) == n else None


async def _refs_are(client: Client, name: str, uids: list[str]) -> dict[str, Any] | None:
    obj = await exists(client, "configmaps", name)
    if obj is None:
        return None
    return obj if [r["uid"] for r in obj["metadata"].get("ownerReferences") or []] == uids else None
