"""KubeRay's RayService as a plain decision: the first cluster made and Serve deployed on it,
the Services switched once Serve is healthy there (and its head in the Serve Service's
selection), a serveConfigV2 change applied in place, a rayClusterConfig change upgraded
through a new cluster with the old one deleted after the delay, the status and conditions
with KubeRay's names, validation naming the field. No API server, no informers, no Ray."""

from __future__ import annotations

import copy
import json
from typing import Any

from gpufleet.api import ray as ray_api
from gpufleet.api import rayservice as api
from gpufleet.api.defaults import apply_defaults
from gpufleet.api.k8s import Endpoints, Pod, Service
from gpufleet.api.validation import validate
from gpufleet.controllers.actions import Actions, Instant
from gpufleet.controllers.ray import ServiceObserved, decide_service
from gpufleet.controllers.ray import pods as rp
from gpufleet.controllers.ray import service as rs
from gpufleet.utils.clock import rfc3339

T0 = 1_700_000_000.0
NOW = Instant(T0, rfc3339(T0), 10.0)
CONFIG = "applications:\n- name: hello\n  route_prefix: /\n  import_path: hello:app\n"
PORTS = {"gcs-server": 31000, "dashboard": 31001, "client": 31002, "serve": 31003}


def at(seconds: float) -> Instant:
    return Instant(T0 + seconds, rfc3339(T0 + seconds), 10.0 + seconds)


def service_dict(status: dict[str, Any] | None = None, image: str = "rayproject/ray:2.60.0",
                 groups: int = 1, **spec: Any) -> dict[str, Any]:
    container = {"name": "ray-head", "image": image, "resources": {"limits": {"cpu": "1"}}}
    worker = {"groupName": "small", "replicas": 1, "minReplicas": 0, "maxReplicas": 2,
              "template": {"spec": {"containers": [{"name": "ray-worker", "image": image}]}}}
    body = {"apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": "hello", "namespace": "default", "uid": "rs-uid", "generation": 1},
            "spec": {"serveConfigV2": CONFIG,
                     "rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [container]}}},
                                          "workerGroupSpecs": [{**copy.deepcopy(worker), "groupName": f"g{i}"}
                                                               for i in range(groups)]},
                     **spec}}
    if status is not None:
        body["status"] = status
    return body


def service(status: dict[str, Any] | None = None, **kw: Any) -> api.RayService:
    model = api.RayService.from_dict(service_dict(status, **kw))
    apply_defaults(model)
    return model


def cluster_of(svc: api.RayService, name: str, ready: bool = True) -> ray_api.RayCluster:
    body = rs.cluster_body(svc, name)
    body["metadata"]["uid"] = f"uid-{name}"
    body["status"] = {"state": "ready" if ready else "",
                      "conditions": [{"type": "HeadPodReady", "status": "True" if ready else "False"}]}
    return ray_api.RayCluster.from_dict(body)


def head_of(cluster: ray_api.RayCluster, serve: str = "false") -> Pod:
    body = rp.head_pod_body(cluster, cluster.spec, True)
    body["metadata"].pop("generateName", None)
    body["metadata"].update(name=f"{cluster.metadata.name}-head-x", uid=f"head-{cluster.metadata.name}")
    body["metadata"]["labels"]["ray.io/serve"] = serve
    body["metadata"]["annotations"] = {"gpufleet.io/host-ports": json.dumps(PORTS)}
    body["status"] = {"phase": "Running", "podIP": "10.0.0.7", "conditions": [{"type": "Ready", "status": "True"}]}
    return Pod.from_dict(body)


def running(apps: str = "RUNNING") -> dict[str, Any]:
    return {"applications": {"hello": {"status": apps, "message": "",
                                       "deployments": {"Hello": {"status": "HEALTHY", "message": ""}}}}}


def observed(svc: api.RayService, clusters: list[ray_api.RayCluster], **kw: Any) -> ServiceObserved:
    return ServiceObserved(service=svc, clusters={c.metadata.name: c for c in clusters}, suffix="abcde", **kw)


def svc_of(body: dict[str, Any]) -> Service:
    body = copy.deepcopy(body)
    body["spec"]["clusterIP"] = "10.96.0.9"
    return Service.from_dict(body)


def endpoints_of(pod: Pod) -> Endpoints:
    return Endpoints.from_dict({"metadata": {"name": "hello-serve-svc", "namespace": "default"},
                                "subsets": [{"addresses": [{"ip": "10.0.0.7", "targetRef": {
                                    "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid}}],
                                             "ports": [{"name": "serve", "port": 31003}]}]})


def creates(a: Actions, kind: str) -> list[dict[str, Any]]:
    return [c.body for c in a.creates if c.body.get("kind") == kind]


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_a_new_rayservice_makes_its_first_cluster_with_the_serve_port_and_labels() -> None:
    a = decide_service(observed(service(), []), NOW)
    assert a.status["pendingServiceStatus"] == {"rayClusterName": "hello-abcde"}
    assert conditions(a.status) == {"Ready": ("False", "Initializing"), "UpgradeInProgress": ("False", "Initializing")}
    assert "serviceStatus" not in a.status and a.status["observedGeneration"] == 1
    [rc] = creates(a, "RayCluster")
    assert rc["metadata"]["name"] == "hello-abcde"
    assert rc["metadata"]["ownerReferences"][0]["kind"] == "RayService"
    assert rc["metadata"]["labels"] == {"ray.io/originated-from-cr-name": "hello",
                                        "ray.io/originated-from-crd": "RayService"}
    assert rc["metadata"]["annotations"][rs.NUM_GROUPS_ANNOTATION] == "1"
    head = rc["spec"]["headGroupSpec"]["template"]
    assert {"name": "serve", "containerPort": 8000, "protocol": "TCP"} in head["spec"]["containers"][0]["ports"]
    assert head["metadata"]["labels"]["ray.io/serve"] == "false"
    assert rc["spec"]["workerGroupSpecs"][0]["template"]["metadata"]["labels"]["ray.io/serve"] == "true"
    assert not creates(a, "Service") and a.requeue_after == rs.POLL_SECONDS


def test_serve_is_deployed_on_the_pending_cluster_once_its_head_is_ready() -> None:
    svc = service({"pendingServiceStatus": {"rayClusterName": "hello-abcde"}})
    rc = cluster_of(svc, "hello-abcde")
    head = head_of(rc)
    where = rs.probes(svc, {"hello-abcde": rc}, {"hello-abcde": head})
    assert where == {"hello-abcde": rs.Probe("10.0.0.7:31001", "10.0.0.7:31003")}
    a = decide_service(observed(svc, [rc], heads={"hello-abcde": head}, serve={"hello-abcde": {"applications": {}}},
                                proxy={"hello-abcde": False}), NOW)
    [d] = a.memo["deploy"]
    assert d.cluster == "hello-abcde" and d.dashboard == "10.0.0.7:31001" and d.config == CONFIG
    # Serve's proxy listens on the head's serve port as the agent published it.
    assert d.body["http_options"] == {"port": 31003, "host": "0.0.0.0"}
    assert d.body["applications"][0]["import_path"] == "hello:app"
    assert not creates(a, "Service") and not a.patches


def test_the_services_switch_once_serve_runs_and_the_head_is_labelled() -> None:
    svc = service({"pendingServiceStatus": {"rayClusterName": "hello-abcde"}})
    rc = cluster_of(svc, "hello-abcde")
    head = head_of(rc, serve="false")
    seen = dict(heads={"hello-abcde": head}, serve={"hello-abcde": running()}, proxy={"hello-abcde": True},
                deployed={"hello-abcde": CONFIG})
    a = decide_service(observed(svc, [rc], **seen), NOW)
    # The healthy proxy labels the head first; no switch yet, nothing redeployed.
    [p] = a.patches
    assert p.kind is Pod and p.patch == {"metadata": {"labels": {"ray.io/serve": "true"}}}
    assert not creates(a, "Service") and a.memo["deploy"] == []
    apps = a.status["pendingServiceStatus"]["applicationStatuses"]
    assert apps == {"hello": {"status": "RUNNING", "serveDeploymentStatuses": {"Hello": {"status": "HEALTHY"}}}}

    seen["heads"] = {"hello-abcde": head_of(rc, serve="true")}
    a = decide_service(observed(svc, [rc], **seen), NOW)
    head_svc, serve_svc = creates(a, "Service")
    assert head_svc["metadata"]["name"] == "hello-head-svc"
    assert head_svc["spec"]["selector"] == {"ray.io/cluster": "hello-abcde", "ray.io/node-type": "head"}
    assert serve_svc["metadata"]["name"] == "hello-serve-svc"
    assert serve_svc["spec"]["selector"] == {"ray.io/cluster": "hello-abcde", "ray.io/serve": "true"}
    assert serve_svc["spec"]["ports"] == [{"name": "serve", "port": 8000, "targetPort": "serve", "protocol": "TCP"}]
    # Promoted: the pending cluster is the active one.
    assert a.status["activeServiceStatus"]["rayClusterName"] == "hello-abcde"
    assert a.status["activeServiceStatus"]["rayClusterStatus"]["state"] == "ready"
    assert "pendingServiceStatus" not in a.status
    # Ready follows the endpoints, which the next sync sees.
    st = a.status
    svc = service(st)
    a = decide_service(observed(svc, [rc], head_service=svc_of(head_svc), serve_service=svc_of(serve_svc),
                                endpoints=endpoints_of(seen["heads"]["hello-abcde"]), **seen), at(2))
    assert a.status["numServeEndpoints"] == 1 and a.status["serviceStatus"] == "Running"
    assert conditions(a.status) == {"Ready": ("True", "NonZeroServeEndpoints"),
                                    "UpgradeInProgress": ("False", "NoPendingCluster")}
    assert not a.creates and not a.updates and a.memo["deploy"] == []


def steady(**kw: Any) -> tuple[api.RayService, ray_api.RayCluster, dict[str, Any]]:
    """A RayService serving from hello-old, with its Services and one endpoint."""
    first = service()
    rc = cluster_of(first, "hello-old")
    head = head_of(rc, serve="true")
    status = {"activeServiceStatus": {"rayClusterName": "hello-old"}, "numServeEndpoints": 1,
              "serviceStatus": "Running",
              "conditions": [{"type": "Ready", "status": "True", "reason": "NonZeroServeEndpoints"},
                             {"type": "UpgradeInProgress", "status": "False", "reason": "NoPendingCluster"}]}
    svc = service(status, **kw)
    seen = dict(heads={"hello-old": head}, serve={"hello-old": running()}, proxy={"hello-old": True},
                deployed={"hello-old": CONFIG}, head_service=svc_of(rs.head_service_body(svc, rc)),
                serve_service=svc_of(rs.serve_service_body(svc, rc)), endpoints=endpoints_of(head))
    return svc, rc, seen


def test_a_serve_config_change_is_deployed_in_place() -> None:
    svc, rc, seen = steady()
    svc.spec.serve_config_v2 = CONFIG.replace("hello:app", "hello:build")
    a = decide_service(observed(svc, [rc], **seen), NOW)
    [d] = a.memo["deploy"]
    assert d.cluster == "hello-old" and d.body["applications"][0]["import_path"] == "hello:build"
    assert not a.creates and not a.updates and "pendingServiceStatus" not in (a.status or {})


def test_a_cluster_change_upgrades_through_a_new_cluster_without_downtime() -> None:
    svc, old, seen = steady(image="rayproject/ray:2.60.0-py311")
    a = decide_service(observed(svc, [old], **seen), NOW)
    assert a.status["pendingServiceStatus"] == {"rayClusterName": "hello-abcde"}
    assert conditions(a.status)["UpgradeInProgress"] == ("True", "BothActivePendingClustersExist")
    assert conditions(a.status)["Ready"] == ("True", "NonZeroServeEndpoints")  # the old cluster still serves
    [rc] = creates(a, "RayCluster")
    assert rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == "rayproject/ray:2.60.0-py311"
    assert a.memo["deploy"] == [] and not a.updates  # the active cluster is left alone

    # The new cluster comes up: Serve deployed there, the Services stay on the old one.
    svc = service(a.status, image="rayproject/ray:2.60.0-py311")
    new = cluster_of(svc, "hello-abcde")
    new_head = head_of(new, serve="false")
    seen.update(heads={**seen["heads"], "hello-abcde": new_head}, serve={**seen["serve"], "hello-abcde": running()},
                proxy={**seen["proxy"], "hello-abcde": True})
    a = decide_service(observed(svc, [old, new], **seen), NOW)
    assert [d.cluster for d in a.memo["deploy"]] == ["hello-abcde"]
    assert not a.updates and a.status["activeServiceStatus"]["rayClusterName"] == "hello-old"

    # Serve runs there and its head is labelled: both Services switch, the clusterIP kept.
    seen["deployed"] = {**seen["deployed"], "hello-abcde": CONFIG}
    seen["heads"] = {**seen["heads"], "hello-abcde": head_of(new, serve="true")}
    a = decide_service(observed(svc, [old, new], **seen), NOW)
    switched = {u.body["metadata"]["name"]: u.body["spec"] for u in a.updates}
    assert switched["hello-serve-svc"]["selector"] == {"ray.io/cluster": "hello-abcde", "ray.io/serve": "true"}
    assert switched["hello-head-svc"]["selector"]["ray.io/cluster"] == "hello-abcde"
    assert switched["hello-serve-svc"]["clusterIP"] == "10.96.0.9"
    assert a.status["activeServiceStatus"]["rayClusterName"] == "hello-abcde"
    assert "pendingServiceStatus" not in a.status
    assert conditions(a.status)["UpgradeInProgress"] == ("False", "NoPendingCluster")
    assert not a.deletes

    # The old cluster goes once the deletion delay (60 s by default) has passed.
    svc = service(a.status, image="rayproject/ray:2.60.0-py311")
    seen["serve_service"] = svc_of(rs.serve_service_body(svc, new))
    seen["head_service"] = svc_of(rs.head_service_body(svc, new))
    a = decide_service(observed(svc, [old, new], **seen), at(1))
    assert not a.deletes and a.memo["doomed"] == {"hello-old": T0 + 61}
    a = decide_service(observed(svc, [old, new], doomed=a.memo["doomed"],
                                **{k: v for k, v in seen.items() if k != "doomed"}), at(61))
    assert [(d.name, d.success_reason) for d in a.deletes] == [("hello-old", "DeletedRayCluster")]


def test_no_new_cluster_with_upgrade_strategy_none_and_groups_added_update_in_place() -> None:
    svc, rc, seen = steady(image="other:1", upgradeStrategy={"type": "None"})
    a = decide_service(observed(svc, [rc], **seen), NOW)
    assert not a.creates and not a.updates and "pendingServiceStatus" not in (a.status or {})

    svc, rc, seen = steady(groups=2)
    a = decide_service(observed(svc, [rc], **seen), NOW)
    [u] = a.updates
    assert [g["groupName"] for g in u.body["spec"]["workerGroupSpecs"]] == ["g0", "g1"]
    assert u.body["metadata"]["annotations"][rs.NUM_GROUPS_ANNOTATION] == "2"
    assert not creates(a, "RayCluster")
    # Replicas alone change nothing.
    svc, rc, seen = steady()
    svc.spec.ray_cluster_config.worker_group_specs[0].replicas = 2
    a = decide_service(observed(svc, [rc], **seen), NOW)
    assert not a.creates and not a.updates


def test_a_head_whose_proxy_fails_leaves_the_serve_service() -> None:
    svc, rc, seen = steady()
    seen["proxy"] = {"hello-old": False}
    a = decide_service(observed(svc, [rc], **seen), NOW)
    [p] = a.patches
    assert p.patch == {"metadata": {"labels": {"ray.io/serve": "false"}}}
    seen["endpoints"] = None
    a = decide_service(observed(svc, [rc], **seen), NOW)
    assert conditions(a.status)["Ready"] == ("False", "ZeroServeEndpoints") and "serviceStatus" not in a.status


def test_validation_names_the_field() -> None:
    def errors(**kw: Any) -> list[str]:
        model = api.RayService.from_dict(service_dict(**kw))
        return [str(e) for e in validate(model)]

    assert errors() == []
    assert any("spec.serveConfigV2" in e for e in errors(serveConfigV2="- a\n- b\n"))
    assert any("spec.upgradeStrategy.type" in e and "NewClusterWithIncrementalUpgrade" in e
               for e in errors(upgradeStrategy={"type": "NewClusterWithIncrementalUpgrade"}))
    assert any("spec.rayClusterDeletionDelaySeconds" in e for e in errors(rayClusterDeletionDelaySeconds=-1))
    body = service_dict()
    body["metadata"]["name"] = "x" * 48
    assert any("metadata.name" in str(e) for e in validate(api.RayService.from_dict(body)))
    body = service_dict()
    del body["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert any("spec.rayClusterConfig.headGroupSpec" in str(e) for e in validate(api.RayService.from_dict(body)))


def test_printer_cells_are_kuberays() -> None:
    assert api.printer_cells({"status": {"serviceStatus": "Running", "numServeEndpoints": 2}}) == ["Running", "2"]
    assert api.printer_cells({}) == ["", ""]
