"""A Service's Endpoints as a plain decision: the Service, its pods and the stored Endpoints
in; the create, update or delete out."""

from __future__ import annotations

from typing import Any

from gpufleet.api.k8s import Endpoints, Pod, Service
from gpufleet.controllers.endpoints import HEADLESS_LABEL, decide_endpoints


def svc(*, selector: dict | None = None, headless: bool = False) -> Service:
    spec: dict[str, Any] = {"ports": [{"name": "http", "port": 80, "targetPort": "web"}]}
    if selector is not None:
        spec["selector"] = selector
    if headless:
        spec["clusterIP"] = "None"
    return Service.from_dict({"metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
                              "spec": spec})


def pod(name: str, ip: str, *, ready: bool = True) -> Pod:
    return Pod.from_dict({
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": {"app": "web"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i",
                                                   "ports": [{"name": "web", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})


def stored(subsets: list | None, labels: dict | None = None) -> Endpoints:
    body: dict[str, Any] = {"metadata": {"name": "web", "namespace": "default", "resourceVersion": "3",
                                         "labels": labels or {"app": "web"}}}
    if subsets:
        body["subsets"] = subsets
    return Endpoints.from_dict(body)


def test_a_new_service_gets_its_endpoints_created_with_ready_and_not_ready_addresses():
    actions = decide_endpoints("default/web", svc(selector={"app": "web"}),
                               [pod("a", "10.0.0.2"), pod("b", "10.0.0.3", ready=False)], None)
    (create,) = actions.creates
    (subset,) = create.body["subsets"]
    assert [a["ip"] for a in subset["addresses"]] == ["10.0.0.2"]
    assert [a["ip"] for a in subset["notReadyAddresses"]] == ["10.0.0.3"]
    assert subset["ports"] == [{"port": 8080, "protocol": "TCP", "name": "http"}]
    assert create.body["metadata"]["labels"] == {"app": "web"}


def test_stored_endpoints_are_updated_only_when_they_differ():
    s, pods = svc(selector={"app": "web"}), [pod("a", "10.0.0.2")]
    first = decide_endpoints("default/web", s, pods, None).creates[0].body
    assert decide_endpoints("default/web", s, pods, stored(first["subsets"])).reason == "InSync"
    (update,) = decide_endpoints("default/web", s, [], stored(first["subsets"])).updates
    assert "subsets" not in update.body and update.body["metadata"]["resourceVersion"] == "3"


def test_a_headless_service_is_labelled_so():
    create = decide_endpoints("default/web", svc(selector={"app": "web"}, headless=True), [], None).creates[0]
    assert create.body["metadata"]["labels"][HEADLESS_LABEL] == ""


def test_a_deleted_service_takes_its_endpoints_and_one_without_selector_is_left_alone():
    (delete,) = decide_endpoints("default/web", None, [], stored(None)).deletes
    assert (delete.name, delete.namespace) == ("web", "default")
    assert decide_endpoints("default/web", None, [], None).empty
    assert decide_endpoints("default/web", svc(), [], stored(None)).reason == "NoSelector"
