"""A Service's EndpointSlices as a plain decision: the Service, its pods, the node zones and
the stored slices in; the creates, updates and deletes out."""

from __future__ import annotations

from typing import Any

from gpufleet.api.k8s import EndpointSlice, Pod, Service
from gpufleet.controllers.endpointslice import (
    CONTROLLER_NAME,
    MANAGED_BY_LABEL,
    SERVICE_NAME_LABEL,
    decide_endpoint_slices,
)

KEY = "default/web"


def svc(*, selector: dict | None = None, publish_not_ready: bool = False, headless: bool = False) -> Service:
    spec: dict[str, Any] = {"ports": [{"name": "http", "port": 80, "targetPort": "web"},
                                      {"port": 9100, "targetPort": 9090, "appProtocol": "http"}],
                            "selector": selector if selector is not None else {"app": "web"},
                            "publishNotReadyAddresses": publish_not_ready}
    if headless:
        spec["clusterIP"] = "None"
    return Service.from_dict({"metadata": {"name": "web", "namespace": "default", "uid": "svc-uid",
                                           "labels": {"tier": "fe"}}, "spec": spec})


def pod(name: str, ip: str | None, *, ready: bool = True, node: str = "n1", deleting: bool = False,
        phase: str = "Running", port_name: str = "web") -> Pod:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": {"app": "web"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return Pod.from_dict({
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i", "ports": [
            {"name": port_name, "containerPort": 8080}, {"containerPort": 9090}]}]},
        "status": {"phase": phase, **({"podIP": ip} if ip else {}),
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})


def stored(body: dict[str, Any], name: str, rv: str = "5") -> EndpointSlice:
    meta = dict(body["metadata"], name=name, resourceVersion=rv, uid=f"uid-{name}")
    meta.pop("generateName", None)
    return EndpointSlice.from_dict(dict(body, metadata=meta))


def conditions(body: dict[str, Any]) -> dict[str, dict]:
    return {ep["targetRef"]["name"]: ep["conditions"] for ep in body["endpoints"]}


def test_a_new_service_gets_one_slice_with_its_endpoints_ports_labels_and_owner():
    pods = [pod("a", "10.0.0.2", node="n1"), pod("b", "10.0.0.3", ready=False, node="n2"),
            pod("gone", "10.0.0.4", deleting=True), pod("done", "10.0.0.5", phase="Succeeded"),
            pod("no-ip", None)]
    actions = decide_endpoint_slices(KEY, svc(), pods, [], zones={"n1": "zone-a"})
    (create,) = actions.creates
    body = create.body
    assert body["addressType"] == "IPv4" and body["metadata"]["generateName"] == "web-"
    assert body["metadata"]["labels"] == {"tier": "fe", SERVICE_NAME_LABEL: "web", MANAGED_BY_LABEL: CONTROLLER_NAME}
    assert body["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Service", "name": "web",
                                                   "uid": "svc-uid", "controller": True, "blockOwnerDeletion": True}]
    assert body["ports"] == [{"name": "", "port": 9090, "protocol": "TCP", "appProtocol": "http"},
                             {"name": "http", "port": 8080, "protocol": "TCP"}]
    a = next(ep for ep in body["endpoints"] if ep["targetRef"]["name"] == "a")
    assert a == {"addresses": ["10.0.0.2"], "conditions": {"ready": True, "serving": True, "terminating": False},
                 "nodeName": "n1", "zone": "zone-a",
                 "targetRef": {"kind": "Pod", "namespace": "default", "name": "a", "uid": "uid-a"}}
    assert conditions(body) == {
        "a": {"ready": True, "serving": True, "terminating": False},
        "b": {"ready": False, "serving": False, "terminating": False},
        "gone": {"ready": False, "serving": True, "terminating": True},  # terminating pods stay, not ready
    }
    assert "zone" not in next(ep for ep in body["endpoints"] if ep["targetRef"]["name"] == "b")


def test_publish_not_ready_addresses_makes_every_endpoint_ready():
    body = decide_endpoint_slices(KEY, svc(publish_not_ready=True), [pod("b", "10.0.0.3", ready=False)], []).creates[0].body
    assert conditions(body) == {"b": {"ready": True, "serving": False, "terminating": False}}


def test_stored_slices_are_updated_only_when_they_differ_and_keep_their_endpoints():
    s, pods = svc(), [pod("a", "10.0.0.2"), pod("b", "10.0.0.3")]
    current = [stored(decide_endpoint_slices(KEY, s, pods, []).creates[0].body, "web-x")]
    assert decide_endpoint_slices(KEY, s, pods, current).reason == "InSync"
    # b goes unready: the one slice is rewritten, on its stored resourceVersion.
    (update,) = decide_endpoint_slices(KEY, s, [pods[0], pod("b", "10.0.0.3", ready=False)], current).updates
    assert update.body["metadata"]["name"] == "web-x" and update.body["metadata"]["resourceVersion"] == "5"
    assert conditions(update.body)["b"]["ready"] is False
    # Every pod gone: the slice stays as the placeholder, without endpoints or ports.
    actions = decide_endpoint_slices(KEY, s, [], current)
    assert not actions.creates and not actions.deletes
    (update,) = actions.updates
    assert update.body["endpoints"] == [] and update.body["ports"] == []


def test_a_service_without_pods_gets_a_placeholder_slice():
    (create,) = decide_endpoint_slices(KEY, svc(), [], []).creates
    assert create.body["endpoints"] == [] and create.body["ports"] == []


def test_more_than_the_maximum_spreads_over_slices_and_new_endpoints_fill_free_room():
    s = svc()
    pods = [pod(f"p{i}", f"10.0.1.{i}") for i in range(5)]
    creates = decide_endpoint_slices(KEY, s, pods, [], max_endpoints=2).creates
    assert [len(c.body["endpoints"]) for c in creates] == [2, 2, 1]
    current = [stored(c.body, f"web-{i}") for i, c in enumerate(creates)]
    # p0 leaves, p9 arrives: p9 takes the room p0 left; nothing else moves.
    pods = pods[1:] + [pod("p9", "10.0.1.9")]
    actions = decide_endpoint_slices(KEY, s, pods, current, max_endpoints=2)
    assert not actions.creates and not actions.deletes
    (update,) = actions.updates
    assert update.body["metadata"]["name"] == "web-0"
    assert [ep["targetRef"]["name"] for ep in update.body["endpoints"]] == ["p1", "p9"]


def test_pods_with_other_ports_get_their_own_slice_and_slices_of_ports_no_longer_wanted_go():
    s = svc()
    pods = [pod("a", "10.0.0.2"), pod("other", "10.0.0.9", port_name="nope")]
    creates = decide_endpoint_slices(KEY, s, pods, []).creates
    assert sorted(len(c.body["ports"]) for c in creates) == [1, 2]
    current = [stored(c.body, f"web-{i}") for i, c in enumerate(creates)]
    actions = decide_endpoint_slices(KEY, s, pods[:1], current)
    (delete,) = actions.deletes
    kept = next(c for c in current if c.metadata.name != delete.name)
    assert len(kept.ports) == 2 and not actions.updates and not actions.creates


def test_headless_and_selectorless_services():
    body = decide_endpoint_slices(KEY, svc(headless=True), [], []).creates[0].body
    assert body["metadata"]["labels"]["service.kubernetes.io/headless"] == ""
    assert decide_endpoint_slices(KEY, svc(selector={}), [pod("a", "10.0.0.2")], []).reason == "NoSelector"
    assert decide_endpoint_slices(KEY, None, [], []).reason == "Gone"
