"""HorizontalPodAutoscaler served as autoscaling/v1 and autoscaling/v2 from one stored object."""

from __future__ import annotations

import json

import pytest
from apiserver_helpers import APPLY, JSON_PATCH, STRATEGIC, TABLE_ACCEPT, Api

from gpufleet.api.conversion import BEHAVIOR_ANNOTATION, METRICS_ANNOTATION

V1 = "/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers"
V2 = "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers"
REF = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}


@pytest.fixture
def store_url(sqlite_url: str) -> str:
    """One backend: the conversion sits above the store."""
    return sqlite_url


def hpa_v1(name: str = "web", cpu: int | None = 50, **spec: object) -> dict:
    s = {"scaleTargetRef": REF, "minReplicas": 1, "maxReplicas": 3, **spec}
    if cpu is not None:
        s["targetCPUUtilizationPercentage"] = cpu
    return {"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler", "metadata": {"name": name},
            "spec": s}


def cpu_metric(value: int) -> dict:
    return {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization",
                                                                       "averageUtilization": value}}}


async def test_create_v1_then_read_v2(api: Api) -> None:
    made = await api.create(V1, hpa_v1())
    assert made["apiVersion"] == "autoscaling/v1"
    assert made["spec"]["targetCPUUtilizationPercentage"] == 50
    assert "metrics" not in made["spec"]
    stored = await api.must_get(f"{V2}/web")
    assert stored["apiVersion"] == "autoscaling/v2"
    assert stored["spec"]["metrics"] == [cpu_metric(50)]
    assert stored["metadata"]["uid"] == made["metadata"]["uid"]
    assert BEHAVIOR_ANNOTATION not in (stored["metadata"].get("annotations") or {})
    # The defaulted behavior, which v1 cannot express, shows there as upstream's annotation.
    assert json.loads(made["metadata"]["annotations"][BEHAVIOR_ANNOTATION]) == stored["spec"]["behavior"]


async def test_create_v2_then_read_and_list_v1(api: Api) -> None:
    pods = {"type": "Pods", "pods": {"metric": {"name": "requests_per_second"},
                                     "target": {"type": "AverageValue", "averageValue": "10"}}}
    await api.create(V2, {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                          "metadata": {"name": "web"},
                          "spec": {"scaleTargetRef": REF, "maxReplicas": 4, "metrics": [pods, cpu_metric(60)]}})
    got = await api.must_get(f"{V1}/web")
    assert (got["apiVersion"], got["spec"]["targetCPUUtilizationPercentage"]) == ("autoscaling/v1", 60)
    assert json.loads(got["metadata"]["annotations"][METRICS_ANNOTATION]) == [pods]
    listed = await api.must_get(V1)
    assert (listed["kind"], listed["apiVersion"]) == ("HorizontalPodAutoscalerList", "autoscaling/v1")
    assert [i["spec"]["targetCPUUtilizationPercentage"] for i in listed["items"]] == [60]
    assert all(i["apiVersion"] == "autoscaling/v1" for i in listed["items"])

    # A v1 client writing back what it read keeps the metric v1 cannot show.
    got["spec"]["maxReplicas"] = 6
    r = await api.put(f"{V1}/web", got)
    assert r.status == 200, r
    stored = await api.must_get(f"{V2}/web")
    assert stored["spec"]["maxReplicas"] == 6
    assert stored["spec"]["metrics"] == [pods, cpu_metric(60)]


async def test_patches_apply_to_the_v1_fields(api: Api) -> None:
    await api.create(V1, hpa_v1())
    r = await api.patch(f"{V1}/web", {"spec": {"targetCPUUtilizationPercentage": 70}})
    assert r.status == 200, r
    assert r.json["spec"]["targetCPUUtilizationPercentage"] == 70
    r = await api.patch(f"{V1}/web", {"spec": {"maxReplicas": 9}}, content_type=STRATEGIC)
    assert (r.status, r.json["spec"]["maxReplicas"]) == (200, 9)
    r = await api.patch(f"{V1}/web", [{"op": "replace", "path": "/spec/minReplicas", "value": 2}],
                        content_type=JSON_PATCH)
    assert (r.status, r.json["spec"]["minReplicas"]) == (200, 2)
    stored = await api.must_get(f"{V2}/web")
    assert stored["spec"]["metrics"] == [cpu_metric(70)]
    assert (stored["spec"]["minReplicas"], stored["spec"]["maxReplicas"]) == (2, 9)


async def test_watch_on_v1_sends_v1_objects(api: Api) -> None:
    w = await api.watch(V1)
    try:
        await api.create(V2, {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                              "metadata": {"name": "web"},
                              "spec": {"scaleTargetRef": REF, "maxReplicas": 3, "metrics": [cpu_metric(40)]}})
        ev = await w.next()
        assert ev is not None and ev["type"] == "ADDED"
        assert ev["object"]["apiVersion"] == "autoscaling/v1"
        assert ev["object"]["spec"]["targetCPUUtilizationPercentage"] == 40
    finally:
        await w.close()


async def test_table_on_v1_prints_the_hpa_columns(api: Api) -> None:
    await api.create(V1, hpa_v1())
    table = (await api.get(V1, accept=TABLE_ACCEPT, query={"includeObject": "Object"})).json
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names[:6] == ["Name", "Reference", "Targets", "MinPods", "MaxPods", "Replicas"]
    row = table["rows"][0]
    assert row["cells"][1:5] == ["Deployment/web", "cpu: <unknown>/50%", "1", 3]
    assert row["object"]["apiVersion"] == "autoscaling/v1"


async def test_v1_validation_errors_name_v1_fields(api: Api) -> None:
    r = await api.post(V1, hpa_v1(cpu=0, maxReplicas=0))
    assert r.status == 422, r
    fields = {c["field"] for c in r.json["details"]["causes"]}
    assert fields == {"spec.targetCPUUtilizationPercentage", "spec.maxReplicas"}
    assert "spec.targetCPUUtilizationPercentage: Invalid value: 0" in r.json["message"]

    r = await api.post(V1, {**hpa_v1(), "spec": {**hpa_v1()["spec"], "metrics": []}},
                       query={"fieldValidation": "Strict"})
    assert r.status == 400, r
    assert 'unknown field "spec.metrics"' in r.json["message"]
    assert 'version "v1"' in r.json["message"]

    bad = hpa_v1()
    bad["metadata"]["annotations"] = {METRICS_ANNOTATION: "[not json"}
    r = await api.post(V1, bad)
    assert r.status == 422, r
    assert r.json["details"]["causes"][0]["field"] == f"metadata.annotations[{METRICS_ANNOTATION}]"

    r = await api.post(V1, {**hpa_v1(), "apiVersion": "autoscaling/v2"})
    assert r.status == 400, r
    assert "does not match the expected API version (autoscaling/v1)" in r.json["message"]


async def test_discovery_lists_both_versions_v2_preferred(api: Api) -> None:
    group = (await api.get("/apis/autoscaling")).json
    assert [v["version"] for v in group["versions"]] == ["v2", "v1"]
    assert group["preferredVersion"]["version"] == "v2"
    resources = (await api.get("/apis/autoscaling/v1")).json["resources"]
    assert {"horizontalpodautoscalers", "horizontalpodautoscalers/status"} <= {r["name"] for r in resources}
    agg = (await api.get("/apis", accept="application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"))
    item = next(i for i in agg.json["items"] if i["metadata"]["name"] == "autoscaling")
    assert [v["version"] for v in item["versions"]] == ["v2", "v1"]
    index = (await api.get("/openapi/v3")).json["paths"]
    assert {"apis/autoscaling/v1", "apis/autoscaling/v2"} <= set(index)
    doc = (await api.get(index["apis/autoscaling/v1"]["serverRelativeURL"].split("?")[0])).json
    root = doc["components"]["schemas"]["io.k8s.api.autoscaling.v1.HorizontalPodAutoscaler"]
    assert root["x-kubernetes-group-version-kind"] == [
        {"group": "autoscaling", "version": "v1", "kind": "HorizontalPodAutoscaler"}]
    v2doc = (await api.get(index["apis/autoscaling/v2"]["serverRelativeURL"].split("?")[0])).json
    assert "io.k8s.api.autoscaling.v2.HorizontalPodAutoscaler" in v2doc["components"]["schemas"]


async def test_delete_through_v1(api: Api) -> None:
    await api.create(V1, hpa_v1())
    r = await api.delete(f"{V1}/web")
    assert r.status == 200, r
    assert (await api.get(f"{V2}/web")).status == 404


def _ld(num: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    assert len(data) < 128
    return bytes([num << 3 | 2, len(data)]) + data


async def test_a_v1_protobuf_body_as_kubectl_1_32_sends_it(api: Api) -> None:
    ref = _ld(1, "Deployment") + _ld(2, "web") + _ld(3, "apps/v1")
    spec = _ld(1, ref) + bytes([2 << 3, 1, 3 << 3, 3, 4 << 3, 55])  # min 1, max 3, cpu 55%
    raw = _ld(1, _ld(1, "pb")) + _ld(2, spec)
    body = b"k8s\x00" + _ld(1, _ld(1, "autoscaling/v1") + _ld(2, "HorizontalPodAutoscaler")) + _ld(2, raw)
    r = await api.post(V1, body, content_type="application/vnd.kubernetes.protobuf")
    assert r.status == 201, r
    assert r.json["spec"]["targetCPUUtilizationPercentage"] == 55
    stored = await api.must_get(f"{V2}/pb")
    assert stored["spec"]["metrics"] == [cpu_metric(55)]
    assert stored["spec"]["scaleTargetRef"] == REF


async def test_server_side_apply_and_status_through_v1(api: Api) -> None:
    applied = hpa_v1(cpu=45)
    r = await api.patch(f"{V1}/web", applied, content_type=APPLY, query={"fieldManager": "tool"})
    assert r.status == 201, r
    assert r.json["spec"]["targetCPUUtilizationPercentage"] == 45
    r = await api.patch(f"{V1}/web", hpa_v1(cpu=35), content_type=APPLY, query={"fieldManager": "tool"})
    assert (r.status, r.json["spec"]["targetCPUUtilizationPercentage"]) == (200, 35)
    assert (await api.must_get(f"{V2}/web"))["spec"]["metrics"] == [cpu_metric(35)]

    got = await api.must_get(f"{V1}/web")
    got["status"] = {"currentReplicas": 2, "desiredReplicas": 3, "currentCPUUtilizationPercentage": 80}
    r = await api.put(f"{V1}/web/status", got)
    assert r.status == 200, r
    assert r.json["status"]["currentCPUUtilizationPercentage"] == 80
    status = (await api.must_get(f"{V2}/web"))["status"]
    assert status["currentMetrics"] == [
        {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 80}}}]
    assert (status["currentReplicas"], status["desiredReplicas"]) == (2, 3)
