"""The StatefulSet controller against a real API server, with a stand-in for the node agents."""

from __future__ import annotations

from typing import Any

from ctrl_helpers import NS, FakeAgent, eventually, template

from gpufleet.client.api import Client

STS = ("statefulset", "garbagecollector")


def statefulset(name: str, replicas: int, image: str = "db:v1", **spec: Any) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": NS},
        "spec": {"replicas": replicas, "serviceName": name, "selector": {"matchLabels": labels},
                 "template": template(labels, image),
                 "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                     "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}],
                 **spec},
    }


async def pods_of(client: Client, name: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in await client.list("pods", NS, raw=True)
            if p["metadata"]["labels"].get("app") == name and not p["metadata"].get("deletionTimestamp")}


async def sts_status(client: Client, name: str) -> dict[str, Any]:
    return (await client.get("statefulsets", name, NS, raw=True)).get("status") or {}


async def test_pods_come_up_in_order_and_scale_down_from_the_top_keeping_claims(client: Client, controllers) -> None:
    await controllers(enabled=STS)
    async with FakeAgent(client, delay=0.1) as agent:
        await client.create(statefulset("db", 3), raw=True)

        async def ready():
            s = await sts_status(client, "db")
            return s if s.get("readyReplicas") == 3 else None

        status = await eventually(ready, what="3 ready replicas")
        assert status["currentRevision"] == status["updateRevision"] and status["updatedReplicas"] == 3
        pods = await pods_of(client, "db")
        assert sorted(pods) == ["db-0", "db-1", "db-2"]
        # Each pod appeared only once the one before it was Running: in no sample is a later
        # ordinal present while an earlier one is missing or not yet running.
        for sample in agent.samples:
            names = {p["metadata"]["name"]: (p.get("status") or {}).get("phase") for p in sample
                     if p["metadata"]["name"].startswith("db-")}
            for i in (1, 2):
                if f"db-{i}" in names:
                    assert names.get(f"db-{i - 1}") == "Running", names
        claims = {c["metadata"]["name"]: c for c in await client.list("persistentvolumeclaims", NS, raw=True)}
        assert sorted(claims) == ["data-db-0", "data-db-1", "data-db-2"]
        assert all(not c["metadata"].get("ownerReferences") for c in claims.values())

        await client.patch("statefulsets", "db", {"spec": {"replicas": 1}}, NS)
        await eventually(lambda: _names_are(client, "db", ["db-0"]), what="scaled to db-0")
        # Retain: the claims stay for when the set grows again.
        claims = [c["metadata"]["name"] for c in await client.list("persistentvolumeclaims", NS, raw=True)]
        assert sorted(claims) == ["data-db-0", "data-db-1", "data-db-2"]

        # Deleting the set takes its pods (garbage collection) and leaves the claims.
        await client.delete("statefulsets", "db", NS)
        await eventually(lambda: _names_are(client, "db", []), what="pods collected")
        claims = [c["metadata"]["name"] for c in await client.list("persistentvolumeclaims", NS, raw=True)]
        assert len(claims) == 3


async def test_rolling_update_with_partition_and_rollback_revisions(client: Client, controllers) -> None:
    await controllers(enabled=STS)
    async with FakeAgent(client, delay=0.05):
        await client.create(statefulset("web", 3, podManagementPolicy="Parallel",
                                        persistentVolumeClaimRetentionPolicy={"whenDeleted": "Delete"}), raw=True)
        await eventually(lambda: _ready(client, "web", 3), what="3 ready")
        first = (await sts_status(client, "web"))["updateRevision"]
        claims = await client.list("persistentvolumeclaims", NS, raw=True)
        assert all(c["metadata"]["ownerReferences"][0]["name"] == "web" for c in claims)

        await client.patch("statefulsets", "web", {"spec": {
            "updateStrategy": {"rollingUpdate": {"partition": 1}},
            "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1.37"}]}}}}, NS)

        async def partitioned():
            s = await sts_status(client, "web")
            return s if s.get("updatedReplicas") == 2 and s.get("readyReplicas") == 3 else None

        status = await eventually(partitioned, what="two pods updated")
        assert status["currentRevision"] == first != status["updateRevision"]
        pods = await pods_of(client, "web")
        revisions = {n: p["metadata"]["labels"]["controller-revision-hash"] for n, p in pods.items()}
        assert revisions == {"web-0": first, "web-1": status["updateRevision"], "web-2": status["updateRevision"]}
        assert pods["web-0"]["spec"]["containers"][0]["image"] == "db:v1"
        assert pods["web-2"]["spec"]["containers"][0]["image"] == "busybox:1.37"

        revs = [r for r in await client.list("controllerrevisions", NS, raw=True)
                if r["metadata"]["ownerReferences"][0]["name"] == "web"]
        assert sorted((r["metadata"]["name"], r["revision"]) for r in revs) == sorted(
            [(first, 1), (status["updateRevision"], 2)])

        # Partition 0 finishes the rollout; the new revision becomes current.
        await client.patch("statefulsets", "web", {"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}},
                           NS)

        async def complete():
            obj = await client.get("statefulsets", "web", NS, raw=True)
            s = obj.get("status") or {}
            return s if s.get("observedGeneration") == obj["metadata"]["generation"] \
                and s.get("currentRevision") == s.get("updateRevision") and s.get("updatedReplicas") == 3 \
                and s.get("readyReplicas") == 3 else None

        await eventually(complete, what="rollout complete")
        second = (await sts_status(client, "web"))["updateRevision"]

        # The first template back: its revision is renumbered, no third one is made.
        await client.patch("statefulsets", "web", {"spec": {"template": {"spec": {"containers": [
            {"name": "main", "image": "db:v1"}]}}}}, NS)
        await eventually(complete, what="rolled back")
        assert (await sts_status(client, "web"))["updateRevision"] == first

        async def renumbered():
            revs = {r["metadata"]["name"]: r["revision"] for r in await client.list("controllerrevisions", NS, raw=True)
                    if r["metadata"]["ownerReferences"][0]["name"] == "web"}
            return revs if revs == {first: 3, second: 2} else None

        await eventually(renumbered, what="the first revision renumbered")

        # Deleting the set with whenDeleted: Delete takes the claims too (they wait for
        # their protection finalizer, which no controller here lifts).
        await client.delete("statefulsets", "web", NS)

        async def claims_gone():
            return not [c for c in await client.list("persistentvolumeclaims", NS, raw=True)
                        if c["metadata"]["name"].endswith(("-web-0", "-web-1", "-web-2"))
                        and not c["metadata"].get("deletionTimestamp")]

        await eventually(claims_gone, what="claims collected")


async def _ready(client: Client, name: str, n: int) -> bool:
    s = await sts_status(client, name)
    return s.get("readyReplicas") == n and s.get("updatedReplicas") == n


async def _names_are(client: Client, name: str, want: list[str]) -> bool:
    return sorted(await pods_of(client, name)) == want
