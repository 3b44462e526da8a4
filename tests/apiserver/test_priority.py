"""Priority admission: a pod's priority and preemption policy come from its PriorityClass,
the global default applies to pods without one, and the built-in classes exist."""

from __future__ import annotations

from typing import Any

from apiserver_helpers import PODS, Api

CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"


def priority_class(name: str, value: int, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value, **extra}


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "trainer:1"}], **spec}}


async def test_built_in_classes_exist(api: Api) -> None:
    cluster = await api.must_get(f"{CLASSES}/system-cluster-critical")
    node = await api.must_get(f"{CLASSES}/system-node-critical")
    assert (cluster["value"], node["value"]) == (2000000000, 2000001000)
    created = await api.create(PODS, pod("agent", priorityClassName="system-node-critical"))
    assert created["spec"]["priority"] == 2000001000


async def test_class_name_resolves_to_priority_and_preemption_policy(api: Api) -> None:
    await api.create(CLASSES, priority_class("batch", 100, preemptionPolicy="Never"))
    created = await api.create(PODS, pod("job", priorityClassName="batch"))
    assert created["spec"]["priority"] == 100
    assert created["spec"]["preemptionPolicy"] == "Never"
    plain = await api.create(PODS, pod("plain"))
    assert plain["spec"]["priority"] == 0
    assert plain["spec"]["preemptionPolicy"] == "PreemptLowerPriority"
    assert "priorityClassName" not in plain["spec"]


async def test_unknown_class_and_mismatched_priority_are_forbidden(api: Api) -> None:
    r = await api.post(PODS, pod("x", priorityClassName="nope"))
    assert r.status == 403
    assert r.json["message"] == 'pods "x" is forbidden: no PriorityClass with name nope was found'
    await api.create(CLASSES, priority_class("high", 1000))
    r = await api.post(PODS, pod("y", priorityClassName="high", priority=5))
    assert r.status == 403
    assert r.json["message"] == ('pods "y" is forbidden: the integer value of priority (5) must not be provided '
                                 "in pod spec; priority admission controller computed 1000 from the given "
                                 "PriorityClass name")
    same = await api.post(PODS, pod("z", priorityClassName="high", priority=1000))
    assert same.status == 201, same
    r = await api.post(PODS, pod("w", priorityClassName="high", preemptionPolicy="Never"))
    assert r.status == 403
    assert "the string value of PreemptionPolicy (Never) must not be provided" in r.json["message"]


async def test_global_default_applies_and_only_one_may_exist(api: Api) -> None:
    await api.create(CLASSES, priority_class("standard", 10, globalDefault=True))
    r = await api.post(CLASSES, priority_class("other", 20, globalDefault=True))
    assert r.status == 403
    assert r.json["message"] == ('priorityclasses.scheduling.k8s.io "other" is forbidden: PriorityClass standard '
                                 "is already marked as default. Only one default can exist")
    created = await api.create(PODS, pod("p"))
    assert (created["spec"]["priorityClassName"], created["spec"]["priority"]) == ("standard", 10)


async def test_user_classes_are_capped(api: Api) -> None:
    r = await api.post(CLASSES, priority_class("too-high", 1_000_000_001))
    assert r.status == 422
    assert "maximum allowed value of a user defined priority is 1000000000" in r.json["message"]


async def test_built_in_classes_cannot_be_deleted(api: Api) -> None:
    r = await api.delete(f"{CLASSES}/system-node-critical")
    assert r.status == 403
    assert r.json["message"] == ('priorityclasses.scheduling.k8s.io "system-node-critical" is forbidden: '
                                 "this is a system priority class and cannot be deleted")
    await api.create(CLASSES, priority_class("mine", 5))
    assert (await api.delete(f"{CLASSES}/mine")).status == 200
