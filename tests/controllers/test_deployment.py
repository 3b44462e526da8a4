from __future__ import annotations

from typing import Any

import pytest
from ctrl_helpers import NS, FakeAgent, deployment, events_for, eventually

from gpufleet.api.k8s import Deployment
from gpufleet.client.api import Client
from gpufleet.controllers.deployment import (
    POD_TEMPLATE_HASH,
    REVISION,
    REVISION_HISTORY,
    compute_hash,
    max_surge,
    max_unavailable,
)

DEPLOY = ("deployment", "replicaset")


def rollout_status(d: dict[str, Any]) -> tuple[str, bool]:
    """What `kubectl rollout status` decides from a Deployment (its DeploymentStatusViewer)."""
    meta, spec, status = d["metadata"], d["spec"], d.get("status") or {}
    if meta.get("generation", 0) > status.get("observedGeneration", 0):
        return "Waiting for deployment spec update to be observed...", False
    for c in status.get("conditions") or []:
        if c["type"] == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded":
            raise AssertionError(f'deployment "{meta["name"]}" exceeded its progress deadline')
    want, updated = spec.get("replicas", 1), status.get("updatedReplicas", 0)
    if updated < want:
        return f"{updated} out of {want} new replicas have been updated...", False
    if status.get("replicas", 0) > updated:
        return f"{status['replicas'] - updated} old replicas are pending termination...", False
    if status.get("availableReplicas", 0) < updated:
        return f"{status.get('availableReplicas', 0)} of {updated} updated replicas are available...", False
    return f'deployment "{meta["name"]}" successfully rolled out', True


async def rolled_out(client: Client, name: str, seen: list[str] | None = None) -> dict[str, Any] | None:
    d = await client.get("deployments", name, NS, raw=True)
    message, done = rollout_status(d)
    if seen is not None and (not seen or seen[-1] != message):
        seen.append(message)
    return d if done else None


async def replica_sets(client: Client, name: str) -> list[dict[str, Any]]:
    rss = await client.list("replicasets", NS, raw=True)
    return sorted(
        (rs for rs in rss if rs["metadata"]["name"].startswith(f"{name}-")),
        key=lambda rs: int(rs["metadata"]["annotations"][REVISION]),
    )


def image_of(p: dict[str, Any]) -> str:
    return p["spec"]["containers"][0]["image"]


async def test_rolling_update_keeps_availability(client: Client, controllers) -> None:
    await controllers(enabled=DEPLOY)
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    async with FakeAgent(client, delay=0.1) as agent:
        await client.create(deployment("web", 3, "web:v1", strategy=strategy))
        d = await eventually(lambda: rolled_out(client, "web"), what="first rollout")
        assert d["metadata"]["annotations"][REVISION] == "1"
        (rs1,) = await replica_sets(client, "web")
        h = rs1["metadata"]["labels"][POD_TEMPLATE_HASH]
        assert rs1["metadata"]["name"] == f"web-{h}"
        assert rs1["spec"]["selector"]["matchLabels"] == {"app": "web", POD_TEMPLATE_HASH: h}
        assert rs1["spec"]["template"]["metadata"]["labels"] == {"app": "web", POD_TEMPLATE_HASH: h}
        conds = {c["type"]: c for c in d["status"]["conditions"]}
        assert conds["Available"]["status"] == "True" and conds["Available"]["reason"] == "MinimumReplicasAvailable"
        assert conds["Progressing"]["reason"] == "NewReplicaSetAvailable"

        agent.samples.clear()
        await client.patch("deployments", "web", {"spec": {"template": {"spec": {"containers": [
            {"name": "main", "image": "web:v2"}]}}}}, NS, patch_type="strategic")
        seen: list[str] = []
        d = await eventually(lambda: rolled_out(client, "web", seen), timeout=20, what="rollout to v2")
        samples = list(agent.samples)

    assert d["metadata"]["annotations"][REVISION] == "2"
    assert d["status"]["updatedReplicas"] == d["status"]["availableReplicas"] == 3
    assert d["status"]["observedGeneration"] == d["metadata"]["generation"]
    assert any("new replicas have been updated" in m for m in seen), seen
    old, new = await replica_sets(client, "web")
    assert old["spec"]["replicas"] == 0 and new["spec"]["replicas"] == 3
    assert new["metadata"]["annotations"][REVISION] == "2"
    assert new["metadata"]["annotations"]["deployment.kubernetes.io/desired-replicas"] == "3"
    assert new["metadata"]["annotations"]["deployment.kubernetes.io/max-replicas"] == "4"

    saw_v2 = False
    for pods in samples:
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        ready = [p for p in live if _ready(p)]
        assert len(ready) >= 3, [(p["metadata"]["name"], image_of(p), _ready(p)) for p in live]
        assert len(live) <= 4
        saw_v2 = saw_v2 or any(image_of(p) == "web:v2" for p in live)
    assert saw_v2
    scaling = await events_for(client, "web", "ScalingReplicaSet")
    assert any("Scaled up replica set" in e["message"] for e in scaling)
    assert any("Scaled down replica set" in e["message"] for e in scaling)


async def test_revision_history_limit_and_rollback(client: Client, controllers) -> None:
    await controllers(enabled=DEPLOY)
    async with FakeAgent(client, delay=0.05):
        await client.create(deployment("api", 1, "api:v1", revisionHistoryLimit=1))
        await eventually(lambda: rolled_out(client, "api"))
        for image in ("api:v2", "api:v3"):
            await _set_image(client, "api", image)
            await eventually(lambda: rolled_out(client, "api"), timeout=15)
        rss = await eventually(lambda: _n_replica_sets(client, "api", 2), what="old sets cleaned up")
        assert [rs["metadata"]["annotations"][REVISION] for rs in rss] == ["2", "3"]

        # `kubectl rollout undo` copies the previous set's template back (minus the hash label).
        v2 = rss[0]
        template = v2["spec"]["template"]
        del template["metadata"]["labels"][POD_TEMPLATE_HASH]
        d = await client.get("deployments", "api", NS, raw=True)
        d["spec"]["template"] = template
        await client.update(d)
        d = await eventually(lambda: rolled_out(client, "api"), timeout=15)
        rss = await eventually(lambda: _n_replica_sets(client, "api", 2))
    assert d["metadata"]["annotations"][REVISION] == "4"
    back = rss[-1]
    assert back["metadata"]["name"] == v2["metadata"]["name"]
    assert back["metadata"]["annotations"][REVISION] == "4"
    assert back["metadata"]["annotations"][REVISION_HISTORY] == "2"
    assert back["spec"]["replicas"] == 1


async def test_recreate_stops_old_pods_before_starting_new_ones(client: Client, controllers) -> None:
    await controllers(enabled=DEPLOY)
    async with FakeAgent(client, delay=0.05) as agent:
        await client.create(deployment("batch", 2, "b:v1", strategy={"type": "Recreate"}))
        await eventually(lambda: rolled_out(client, "batch"))
        agent.samples.clear()
        await _set_image(client, "batch", "b:v2")
        await eventually(lambda: rolled_out(client, "batch"), timeout=15)
        samples = list(agent.samples)
    for pods in samples:
        images = {image_of(p) for p in pods}
        assert images != {"b:v1", "b:v2"}, "old and new pods existed at once"


async def test_scaling_mid_rollout_is_proportional(client: Client, controllers) -> None:
    await controllers(enabled=DEPLOY)
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 3, "maxUnavailable": 2}}
    async with FakeAgent(client, delay=0.02, ready=lambda p: image_of(p) != "bad:v2"):
        await client.create(deployment("px", 10, "ok:v1", strategy=strategy))
        await eventually(lambda: rolled_out(client, "px"), timeout=15)
        await _set_image(client, "px", "bad:v2")
        # The new pods never become ready: old 8 (10 - maxUnavailable), new 5 (13 - 8).
        await eventually(lambda: _sizes(client, "px", [8, 5]), timeout=15)
        await client.patch("deployments", "px", {"spec": {"replicas": 15}}, NS)
        # 18 allowed now: the 5 extra split 8:5 -> old 11, new 7, as in Kubernetes' docs.
        await eventually(lambda: _sizes(client, "px", [11, 7]), timeout=15)


async def test_progress_deadline_exceeded(client: Client, controllers) -> None:
    await controllers(enabled=DEPLOY)
    async with FakeAgent(client, delay=0.02, ready=False):
        await client.create(deployment("stuck", 1, "x:v1", progressDeadlineSeconds=1))
        cond = await eventually(lambda: _progressing(client, "stuck", "ProgressDeadlineExceeded"), timeout=10)
    assert cond["status"] == "False"
    assert cond["message"].endswith("has timed out progressing.")
    d = await client.get("deployments", "stuck", NS, raw=True)
    with pytest.raises(AssertionError, match="exceeded its progress deadline"):
        rollout_status(d)


def test_fenceposts_round_like_kubernetes() -> None:
    def d(replicas: int, surge: Any, unavailable: Any) -> Deployment:
        return Deployment.from_dict({"metadata": {"name": "x"}, "spec": {
            "replicas": replicas, "selector": {"matchLabels": {"a": "b"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}})

    assert (max_surge(d(10, "25%", "25%")), max_unavailable(d(10, "25%", "25%"))) == (3, 2)
    assert (max_surge(d(3, "10%", "10%")), max_unavailable(d(3, "10%", "10%"))) == (1, 0)
    assert (max_surge(d(3, 0, 0)), max_unavailable(d(3, 0, 0))) == (0, 1)
    assert max_unavailable(d(2, 1, 5)) == 2


def test_template_hash_is_stable_and_collision_aware() -> None:
    t = {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    same = {"spec": {"containers": [{"image": "i", "name": "c"}]}, "metadata": {"labels": {"app": "x"}}}
    assert compute_hash(t) == compute_hash(same)
    assert compute_hash(t) != compute_hash(t, 1)
    assert set(compute_hash(t)) <= set("bcdfghjklmnpqrstvwxz2456789")


# -- helpers -----------------------------------------------------------------------------------


def _ready(p: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or [])


async def _set_image(client: Client, name: str, image: str) -> None:
    await client.patch("deployments", name, {"spec": {"template": {"spec": {"containers": [
        {"name": "main", "image": image}]}}}}, NS, patch_type="strategic")


async def _n_replica_sets(client: Client, name: str, n: int) -> list[dict[str, Any]] | None:
    rss = await replica_sets(client, name)
    return rss if len(rss) == n else None


async def _sizes(client: Client, name: str, want: list[int]) -> bool:
    return [rs["spec"]["replicas"] for rs in await replica_sets(client, name)] == want


async def _progressing(client: Client, name: str, reason: str) -> dict[str, Any] | None:
    d = await client.get("deployments", name, NS, raw=True)
    for c in (d.get("status") or {}).get("conditions") or []:
        if c["type"] == "Progressing" and c.get("reason") == reason:
            return c
    return None


async def test_paused_deployment_only_scales(client: Client, controllers) -> None:
    await controllers(enabled=DEPLOY)
    async with FakeAgent(client, delay=0.02):
        await client.create(deployment("held", 1, "h:v1"))
        await eventually(lambda: rolled_out(client, "held"))
        await client.patch("deployments", "held", {"spec": {"paused": True}}, NS)
        await _set_image(client, "held", "h:v2")
        await client.patch("deployments", "held", {"spec": {"replicas": 2}}, NS)
        cond = await eventually(lambda: _progressing(client, "held", "DeploymentPaused"))
        assert cond["status"] == "Unknown" and cond["message"] == "Deployment is paused"
        await eventually(lambda: _sizes(client, "held", [2]))
        await client.patch("deployments", "held", {"spec": {"paused": False}}, NS)
        d = await eventually(lambda: rolled_out(client, "held"), timeout=15)
    assert d["metadata"]["annotations"][REVISION] == "2"
    assert [rs["spec"]["replicas"] for rs in await replica_sets(client, "held")] == [0, 2]
