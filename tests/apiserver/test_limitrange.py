"""LimitRanger admission: defaults filled into containers, min/max/ratio refused with
Kubernetes' messages, GPUs included, and defaults applied before quota charges the pod."""

from __future__ import annotations

from typing import Any

from apiserver_helpers import PODS, Api

from gpufleet.apiserver.admission.limitrange import violations

LIMITS = "/api/v1/namespaces/default/limitranges"
QUOTAS = "/api/v1/namespaces/default/resourcequotas"


def limit_range(name: str, *items: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": name}, "spec": {"limits": list(items)}}


def pod(name: str, *containers: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": list(containers) or [{"name": "main", "image": "trainer:1"}]}}


def container(name: str, requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict:
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return {"name": name, "image": "trainer:1", "resources": resources}


async def test_defaults_fill_missing_requests_and_limits(api: Api) -> None:
    await api.create(LIMITS, limit_range("defaults", {
        "type": "Container",
        "default": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
        "defaultRequest": {"cpu": "500m", "memory": "512Mi", "nvidia.com/gpu": "1"},
    }))
    created = await api.create(PODS, pod("p", container("main", requests={"cpu": "250m"}),
                                         container("side", limits={"memory": "2Gi"})))
    main, side = created["spec"]["containers"]
    assert main["resources"] == {
        "requests": {"cpu": "250m", "memory": "512Mi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
    }
    # The pod's own defaulting already made its limit its request before the LimitRange ran.
    assert side["resources"] == {
        "requests": {"cpu": "500m", "memory": "2Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"},
    }
    assert created["metadata"]["annotations"]["kubernetes.io/limit-ranger"] == (
        "LimitRanger plugin set: memory, nvidia.com/gpu request for container main; "
        "cpu, memory, nvidia.com/gpu limit for container main; "
        "cpu, nvidia.com/gpu request for container side; cpu, nvidia.com/gpu limit for container side")


async def test_max_min_and_ratio_are_refused_with_every_violation(api: Api) -> None:
    await api.create(LIMITS, limit_range("bounds", {
        "type": "Container",
        "max": {"cpu": "2", "nvidia.com/gpu": "4"},
        "min": {"memory": "128Mi"},
        "maxLimitRequestRatio": {"cpu": "2"},
    }))
    r = await api.post(PODS, pod("big", container("main", requests={"cpu": "1", "memory": "256Mi"},
                                                  limits={"cpu": "4", "nvidia.com/gpu": "8"})))
    assert r.status == 403
    assert r.json["reason"] == "Forbidden"
    assert r.json["message"] == (
        'pods "big" is forbidden: [maximum cpu usage per Container is 2, but limit is 4, '
        "maximum nvidia.com/gpu usage per Container is 4, but limit is 8, "
        "cpu max limit to request ratio per Container is 2, but provided ratio is 4.000000]")
    r = await api.post(PODS, pod("small", container("main", requests={"cpu": "1", "memory": "64Mi"},
                                                    limits={"cpu": "1", "nvidia.com/gpu": "1"})))
    assert r.status == 403
    assert r.json["message"] == 'pods "small" is forbidden: minimum memory usage per Container is 128Mi, ' \
                                "but request is 64Mi"
    ok = await api.post(PODS, pod("fits", container("main", requests={"cpu": "1", "memory": "128Mi"},
                                                    limits={"cpu": "2", "nvidia.com/gpu": "4"})))
    assert ok.status == 201, ok


async def test_pod_totals_are_bounded_by_a_pod_item(api: Api) -> None:
    await api.create(LIMITS, limit_range("per-pod", {"type": "Pod", "max": {"nvidia.com/gpu": "8"}}))
    r = await api.post(PODS, pod("gang", container("a", limits={"nvidia.com/gpu": "4"}),
                                 container("b", limits={"nvidia.com/gpu": "6"})))
    assert r.status == 403
    assert r.json["message"] == 'pods "gang" is forbidden: maximum nvidia.com/gpu usage per Pod is 8, but limit is 10'


async def test_quota_charges_the_defaulted_pod(api: Api) -> None:
    await api.create(LIMITS, limit_range("defaults", {"type": "Container", "defaultRequest": {"cpu": "1"},
                                                      "default": {"cpu": "2"}}))
    await api.create(QUOTAS, {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "cpu"},
                              "spec": {"hard": {"requests.cpu": "3", "limits.cpu": "4"}}})
    # Without the LimitRange's defaults this pod would fail quota's "must specify".
    await api.create(PODS, pod("one"))
    await api.create(PODS, pod("two"))
    r = await api.post(PODS, pod("three"))
    assert r.status == 403
    assert r.json["message"] == ('pods "three" is forbidden: exceeded quota: cpu, requested: limits.cpu=2, '
                                 "used: limits.cpu=4, limited: limits.cpu=4")


def test_a_pod_item_bounds_the_containers_and_sidecars_but_not_the_overhead() -> None:
    # Kubernetes' LimitRanger sums sidecars with the containers and leaves pod overhead out
    # (the quota's pod totals, used here before, added the overhead).
    lr = limit_range("per-pod", {"type": "Pod", "max": {"cpu": "2"}})
    p = pod("p", container("a", {"cpu": "1"}, {"cpu": "1"}))
    p["spec"]["overhead"] = {"cpu": "500m"}
    p["spec"]["initContainers"] = [{**container("log", {"cpu": "1"}, {"cpu": "1"}), "restartPolicy": "Always"}]
    assert violations([lr], p) == []
    p["spec"]["initContainers"][0]["resources"] = {"requests": {"cpu": "1500m"}, "limits": {"cpu": "1500m"}}
    assert violations([lr], p) == ["maximum cpu usage per Pod is 2, but limit is 2500m"]
