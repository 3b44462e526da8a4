"""A RayService's sync as a pure decision: ``decide_service(observed, now) -> Actions``.

As KubeRay's RayService controller (v1.3 and later), each sync:

1. RayClusters of the RayService that are neither active nor pending are deleted
   ``rayClusterDeletionDelaySeconds`` (default 60) after they were first seen so.
2. A pending cluster named in ``status.pendingServiceStatus`` is created from
   ``rayClusterConfig``; a cluster whose spec differs only by worker groups added at the end
   is updated in place (the active one only while no upgrade is under way).
3. The head pods of the active and pending clusters get ``ray.io/serve: "true"`` while their
   Serve proxy answers ``/-/healthz`` (``excludeHeadPodFromServeSvc``: always "false").
4. Serve: on the pending cluster if there is one, else on the active one (unless a new
   cluster is to be prepared), once its head is ready: ``serveConfigV2`` is deployed (PUT
   ``/api/serve/applications/`` on the head's dashboard, as ``ServeDeploy`` in
   ``memo["deploy"]``, which the controller sends) when it was never deployed there, differs
   from what was, or Serve lists no application (a head that restarted); the applications'
   statuses are read from GET of the same path. A cluster is ready when every application is
   RUNNING and, here, its head pod already carries ``ray.io/serve: "true"`` in the cache (so
   the switch never leaves the Serve Service without endpoints).
5. The Services ``<rayservice>-head-svc`` and ``<rayservice>-serve-svc`` point at the ready
   cluster, the pending one first; once they point at the pending cluster it becomes the
   active one (the old one is then cleaned up by 1).
6. A new pending cluster (``<rayservice>-<5 chars>``) is prepared when there is none yet, or
   when ``rayClusterConfig`` changed otherwise than by replicas, ``workersToDelete`` or
   worker groups added at the end, unless ``upgradeStrategy.type`` is None.
7. The status: activeServiceStatus / pendingServiceStatus (rayClusterName,
   applicationStatuses with serveDeploymentStatuses, rayClusterStatus), numServeEndpoints
   (the ready pods behind the Serve Service), conditions Ready and UpgradeInProgress,
   serviceStatus "Running" while Ready is True, observedGeneration.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from gpufleet.api import ray as api
from gpufleet.api import rayservice as rs_api
from gpufleet.api.k8s import Pod
from gpufleet.client import objects
from gpufleet.controllers._common import find_condition, is_being_deleted, owner_reference, status_dict
from gpufleet.controllers.actions import Actions, Create, Delete, Event, Instant, Patch, Update
from gpufleet.controllers.ray import pods as rp
from gpufleet.controllers.ray.job import ORIGIN_KIND_LABEL, ORIGIN_NAME_LABEL

SERVE_LABEL = "ray.io/serve"
HASH_ANNOTATION = "ray.io/hash-without-replicas-and-workers-to-delete"
NUM_GROUPS_ANNOTATION = "ray.io/num-worker-groups"
SERVE_PORT_NAME = "serve"
SERVE_PORT = 8000
PROXY_HEALTH_PATH = "/-/healthz"
SERVE_API_PATH = "/api/serve/applications/"
DEFAULT_APP_NAME = "default"
# How often the Serve applications are read (KubeRay requeues every 2 s).
POLL_SECONDS = 2.0
_SKIPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


@dataclass(frozen=True)
class ServeDeploy:
    """serveConfigV2 to PUT on a cluster's dashboard (``host:port``); ``config`` is the text
    remembered once it was accepted, ``body`` the JSON sent."""

    cluster: str
    dashboard: str
    config: str
    body: dict[str, Any]


@dataclass(frozen=True)
class Probe:
    """Where to read a cluster's Serve state: the head's dashboard and its Serve proxy."""

    dashboard: str
    proxy: str | None


@dataclass(frozen=True)
class ServiceObserved:
    service: rs_api.RayService
    clusters: dict[str, Any] = field(default_factory=dict)  # the RayService's RayClusters by name
    heads: dict[str, Any] = field(default_factory=dict)  # each cluster's live head pod
    serve: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # GET answer; None: unreadable
    proxy: dict[str, bool] = field(default_factory=dict)  # the head's proxy answered /-/healthz
    deployed: dict[str, str] = field(default_factory=dict)  # serveConfigV2 last accepted by each cluster
    head_service: Any = None  # <rayservice>-head-svc, when cached
    serve_service: Any = None  # <rayservice>-serve-svc, when cached
    endpoints: Any = None  # the Serve Service's Endpoints, when cached
    doomed: dict[str, float] = field(default_factory=dict)  # cluster -> when it is deleted
    suffix: str = "xxxxx"  # for the name of a new cluster


# -- names and bodies -------------------------------------------------------------------------


def head_service_name(service: Any) -> str:
    return f"{objects.name_of(service)}-head-svc"


def serve_service_name(service: Any) -> str:
    return f"{objects.name_of(service)}-serve-svc"


def _origin_labels(service: Any) -> dict[str, str]:
    return {ORIGIN_NAME_LABEL: objects.name_of(service), ORIGIN_KIND_LABEL: rs_api.KIND}


def _is_serve_port(name: str | None) -> bool:
    return name == SERVE_PORT_NAME or bool(name and name.startswith(SERVE_PORT_NAME + "-"))


def _hash_view(spec: dict[str, Any]) -> dict[str, Any]:
    """The cluster spec less what never makes a new cluster: replicas, workersToDelete and
    suspend."""
    view = copy.deepcopy(spec)
    view.pop("suspend", None)
    for g in view.get("workerGroupSpecs") or []:
        g.pop("replicas", None)
        strategy = g.get("scaleStrategy")
        if isinstance(strategy, dict):
            strategy.pop("workersToDelete", None)
            if not strategy:
                g.pop("scaleStrategy")
    return view


def spec_hash(spec: dict[str, Any]) -> str:
    digest = hashlib.sha1(json.dumps(_hash_view(spec), sort_keys=True, separators=(",", ":")).encode())
    return base64.b32encode(digest.digest()).decode().rstrip("=")


def _config(service: Any) -> dict[str, Any]:
    return service.spec.ray_cluster_config.to_dict()


def goal_spec(service: Any) -> dict[str, Any]:
    """The RayCluster spec made from rayClusterConfig: the head container declares the Serve
    port (``serve`` 8000) unless it names one, and the pods carry ``ray.io/serve`` as KubeRay
    sets it (the head "false" until its proxy is healthy, the workers "true")."""
    spec = _config(service)
    head = (spec.get("headGroupSpec") or {}).get("template") or {}
    meta = head.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), SERVE_LABEL: "false"}
    containers = (head.get("spec") or {}).get("containers") or []
    if containers:
        ports = containers[0].setdefault("ports", [])
        if not any(_is_serve_port(p.get("name")) for p in ports):
            ports.append({"name": SERVE_PORT_NAME, "containerPort": SERVE_PORT, "protocol": "TCP"})
    for g in spec.get("workerGroupSpecs") or []:
        tmeta = (g.setdefault("template", {})).setdefault("metadata", {})
        tmeta["labels"] = {**(tmeta.get("labels") or {}), SERVE_LABEL: "true"}
    return spec


def cluster_body(service: Any, name: str) -> dict[str, Any]:
    config = _config(service)
    annotations = {k: v for k, v in (objects.meta(service, "annotations") or {}).items()
                   if k not in _SKIPPED_ANNOTATIONS}
    annotations.update({HASH_ANNOTATION: spec_hash(config),
                        NUM_GROUPS_ANNOTATION: str(len(config.get("workerGroupSpecs") or []))})
    return {"apiVersion": api.API_VERSION, "kind": api.CLUSTER_KIND,
            "metadata": {"name": name, "namespace": objects.namespace_of(service),
                         "labels": {**(objects.labels_of(service) or {}), **_origin_labels(service)},
                         "annotations": annotations,
                         "ownerReferences": [owner_reference(service, api.API_VERSION, rs_api.KIND)]},
            "spec": goal_spec(service)}


def _cluster_dict(cluster: Any) -> dict[str, Any]:
    return cluster.to_dict() if hasattr(cluster, "to_dict") else dict(cluster)


def _hash_matches(service: Any, cluster: Any, partial: bool) -> bool:
    """Whether the cluster was made from this rayClusterConfig (``partial``: from it less the
    worker groups added at its end since)."""
    annotations = objects.meta(cluster, "annotations") or {}
    config = _config(service)
    if not partial:
        return annotations.get(HASH_ANNOTATION) == spec_hash(config)
    try:
        had = int(annotations.get(NUM_GROUPS_ANNOTATION, ""))
    except ValueError:
        return False
    groups = config.get("workerGroupSpecs") or []
    if len(groups) < had:
        return False
    return annotations.get(HASH_ANNOTATION) == spec_hash({**config, "workerGroupSpecs": groups[:had]})


def should_update_cluster(service: Any, cluster: Any, active: bool, upgrading: bool) -> bool:
    if cluster is None or (active and upgrading) or _hash_matches(service, cluster, False):
        return False
    return _hash_matches(service, cluster, True)


def should_prepare_cluster(service: Any, active: Any, pending: Any, pending_serving: bool) -> bool:
    if pending_serving:
        return False
    if active is None and pending is None:
        return True
    cluster = pending if pending is not None else active
    if _hash_matches(service, cluster, False) or _hash_matches(service, cluster, True):
        return False
    return rs_api.upgrade_type(service.spec) != rs_api.UPGRADE_NONE


def _updated_cluster(service: Any, cluster: Any) -> dict[str, Any]:
    body = _cluster_dict(cluster)
    goal = cluster_body(service, objects.name_of(cluster))
    suspend = (body.get("spec") or {}).get("suspend")
    body["spec"] = goal["spec"]
    if suspend is not None:
        body["spec"]["suspend"] = suspend
    meta = body.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), **goal["metadata"]["annotations"]}
    return body


def _serve_ports(cluster: Any) -> list[dict[str, Any]]:
    spec = _cluster_dict(cluster).get("spec") or {}
    head = ((spec.get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
    containers = head.get("containers") or []
    ports = (containers[0].get("ports") if containers else None) or []
    return [{"name": p["name"], "port": int(p.get("containerPort") or SERVE_PORT), "targetPort": p["name"],
             "protocol": p.get("protocol") or "TCP"} for p in ports if _is_serve_port(p.get("name"))] or \
        [{"name": SERVE_PORT_NAME, "port": SERVE_PORT, "targetPort": SERVE_PORT_NAME, "protocol": "TCP"}]


def _service_type(service: Any) -> str:
    head = service.spec.ray_cluster_config.head_group_spec
    return (head.service_type if head is not None else None) or "ClusterIP"


def serve_service_body(service: Any, cluster: Any) -> dict[str, Any]:
    """``<rayservice>-serve-svc``: the Serve port(s) of the cluster's pods labelled
    ``ray.io/serve: "true"``; ``spec.serveService`` when given, with its selector replaced."""
    name, ns = objects.name_of(service), objects.namespace_of(service)
    labels = {**_origin_labels(service), SERVE_LABEL: f"{name}-serve"}
    selector = {rp.CLUSTER_LABEL: objects.name_of(cluster), SERVE_LABEL: "true"}
    ports = _serve_ports(cluster)
    custom = service.spec.serve_service
    if custom is not None:
        body = custom.to_dict()
        meta = body.setdefault("metadata", {})
        meta.setdefault("name", serve_service_name(service))
        meta["namespace"] = ns
        meta["labels"] = {**(meta.get("labels") or {}), **labels}
        sspec = body.setdefault("spec", {})
        mine = {p.get("name"): p for p in sspec.get("ports") or []}
        sspec["ports"] = [mine.get(p["name"], p) for p in ports]
        sspec["selector"] = selector
        sspec.setdefault("type", _service_type(service))
    else:
        body = {"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": serve_service_name(service), "namespace": ns, "labels": labels},
                "spec": {"type": _service_type(service), "selector": selector, "ports": ports}}
    body["apiVersion"], body["kind"] = "v1", "Service"
    body["metadata"]["ownerReferences"] = [owner_reference(service, api.API_VERSION, rs_api.KIND)]
    return body


def head_service_body(service: Any, cluster: Any) -> dict[str, Any]:
    """``<rayservice>-head-svc``: the cluster's head ports, selecting its head."""
    model = cluster if isinstance(cluster, api.RayCluster) else api.RayCluster.from_dict(cluster)
    body = rp.head_service_body(model, model.spec)
    name = objects.name_of(service)
    body["metadata"] = {
        "name": head_service_name(service), "namespace": objects.namespace_of(service),
        "labels": {**_origin_labels(service), rp.NODE_TYPE_LABEL: rp.HEAD, rp.IDENTIFIER_LABEL: f"{name}-head"},
        "ownerReferences": [owner_reference(service, api.API_VERSION, rs_api.KIND)]}
    return body


def _selected_cluster(svc: Any) -> str | None:
    if svc is None or svc.spec is None:
        return None
    return (svc.spec.selector or {}).get(rp.CLUSTER_LABEL)


def _point(a: Actions, svc: Any, body: dict[str, Any], what: str) -> None:
    """Create the Service, or switch a cached one to the body's cluster (its clusterIP kept)."""
    target = body["spec"]["selector"][rp.CLUSTER_LABEL]
    if svc is None:
        a.creates.append(Create(body, on_exists="ignore", success_reason="CreatedService"))
        return
    if _selected_cluster(svc) == target:
        return
    current = svc.to_dict()
    for key in ("selector", "ports", "type"):
        current["spec"][key] = body["spec"][key]
    a.updates.append(Update(current, event=Event(
        "Normal", "UpdatedService", f"Switched the {what} Service {objects.name_of(svc)} to the RayCluster {target}")))


# -- probes and Serve -------------------------------------------------------------------------


def head_ready(cluster: Any) -> bool:
    conds = (_cluster_dict(cluster).get("status") or {}).get("conditions") or []
    return any(c.get("type") == api.HEAD_POD_READY and c.get("status") == "True" for c in conds)


def probes(service: Any, clusters: dict[str, Any], heads: dict[str, Any]) -> dict[str, Probe]:
    """Where to read Serve for the active and pending clusters whose head is ready."""
    st = status_dict(service)
    out: dict[str, Probe] = {}
    for key in ("activeServiceStatus", "pendingServiceStatus"):
        name = (st.get(key) or {}).get("rayClusterName")
        cluster, head = clusters.get(name or ""), heads.get(name or "")
        if cluster is None or head is None or not head_ready(cluster):
            continue
        ip = head.status.pod_ip if head.status is not None else None
        ports = rp.head_ports(head)
        if not ip or rp.DASHBOARD_PORT_NAME not in ports:
            continue
        serve = ports.get(SERVE_PORT_NAME)
        out[name] = Probe(f"{ip}:{ports[rp.DASHBOARD_PORT_NAME]}", f"{ip}:{serve}" if serve else None)
    return out


def deploy_body(text: str, head: Any) -> dict[str, Any]:
    """serveConfigV2 as the JSON PUT to the dashboard. Serve's HTTP proxy listens on the
    head's ``serve`` port as reachable (the node port the agent gave it where pods share the
    node's network), on every address unless the config names a host."""
    body = rs_api.serve_config(text)
    port = rp.head_ports(head).get(SERVE_PORT_NAME) if head is not None else None
    if port:
        http = dict(body.get("http_options") or {})
        http["port"] = port
        http.setdefault("host", "0.0.0.0")
        body["http_options"] = http
    return body


def app_statuses(answer: dict[str, Any]) -> dict[str, Any]:
    """Serve's applications as KubeRay reports them: status, message, serveDeploymentStatuses."""
    out: dict[str, Any] = {}
    for name, app in (answer.get("applications") or {}).items():
        if not isinstance(app, dict):
            continue
        deployments = {}
        for dname, dep in (app.get("deployments") or {}).items():
            if isinstance(dep, dict):
                deployments[dname] = {k: v for k, v in (("status", dep.get("status")), ("message", dep.get("message")))
                                      if v}
        entry = {k: v for k, v in (("status", app.get("status")), ("message", app.get("message"))) if v}
        if deployments:
            entry["serveDeploymentStatuses"] = deployments
        out[name or DEFAULT_APP_NAME] = entry
    return out


def _reconcile_serve(o: ServiceObserved, name: str, deploys: list[ServeDeploy]) -> tuple[bool, dict[str, Any] | None]:
    """(ready, applicationStatuses) of one cluster; what to deploy on it goes to ``deploys``."""
    cluster = o.clusters.get(name)
    if cluster is None or not head_ready(cluster) or name not in o.serve:
        return False, None
    answer = o.serve[name]
    if answer is None:
        return False, None
    apps = app_statuses(answer)
    text = o.service.spec.serve_config_v2 or ""
    if text and (not o.deployed.get(name) or not apps or o.deployed[name] != text):
        head = o.heads.get(name)
        ip = head.status.pod_ip if head is not None and head.status is not None else None
        ports = rp.head_ports(head) if head is not None else {}
        if ip and rp.DASHBOARD_PORT_NAME in ports:
            deploys.append(ServeDeploy(name, f"{ip}:{ports[rp.DASHBOARD_PORT_NAME]}", text, deploy_body(text, head)))
    ready = bool(apps) and all(app.get("status") == rs_api.APP_RUNNING for app in apps.values())
    return ready, apps


def serve_endpoints(endpoints: Any) -> int:
    """The ready pods behind the Serve Service (by targetRef uid, else address)."""
    seen: set[str] = set()
    for subset in (endpoints.subsets if endpoints is not None else None) or []:
        for addr in subset.addresses or []:
            ref = addr.target_ref.uid if addr.target_ref is not None else None
            seen.add(ref or addr.ip or "")
    return len(seen)


# -- status -----------------------------------------------------------------------------------


def _set(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str, now: str,
         generation: int | None) -> None:
    """metav1.Condition as meta.SetStatusCondition sets it: lastTransitionTime moves only
    when the status does."""
    current = find_condition(conditions, type_)
    new: dict[str, Any] = {"type": type_, "status": status, "reason": reason, "message": message,
                           "lastTransitionTime": now}
    if generation is not None:
        new["observedGeneration"] = generation
    if current is not None:
        if current.get("status") == status:
            new["lastTransitionTime"] = current.get("lastTransitionTime", now)
        conditions[conditions.index(current)] = new
    else:
        conditions.append(new)


def _is_true(conditions: list[dict[str, Any]], type_: str) -> bool:
    c = find_condition(conditions, type_)
    return c is not None and c.get("status") == "True"


def _service_status(name: str, cluster: Any, apps: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if apps:
        out["applicationStatuses"] = apps
    if name:
        out["rayClusterName"] = name
    if cluster is not None and _cluster_dict(cluster).get("status"):
        out["rayClusterStatus"] = _cluster_dict(cluster)["status"]
    return out


def _conditions(st: dict[str, Any], now: Instant, generation: int | None) -> None:
    conditions = [dict(c) for c in st.get("conditions") or []]
    if not conditions:
        msg = "RayService is initializing"
        _set(conditions, rs_api.READY, "False", rs_api.REASON_INITIALIZING, msg, now.text, generation)
        _set(conditions, rs_api.UPGRADE_IN_PROGRESS, "False", rs_api.REASON_INITIALIZING, msg, now.text, generation)
    if st.get("numServeEndpoints", 0) > 0:
        _set(conditions, rs_api.READY, "True", rs_api.REASON_NONZERO_ENDPOINTS,
             "Number of serve endpoints is greater than 0", now.text, generation)
    elif _is_true(conditions, rs_api.READY):
        _set(conditions, rs_api.READY, "False", rs_api.REASON_ZERO_ENDPOINTS, "Number of serve endpoints dropped to 0",
             now.text, generation)
    active = (st.get("activeServiceStatus") or {}).get("rayClusterName")
    pending = (st.get("pendingServiceStatus") or {}).get("rayClusterName")
    if active and pending:
        _set(conditions, rs_api.UPGRADE_IN_PROGRESS, "True", rs_api.REASON_BOTH_CLUSTERS,
             "Both active and pending Ray clusters exist", now.text, generation)
    elif active:
        _set(conditions, rs_api.UPGRADE_IN_PROGRESS, "False", rs_api.REASON_NO_PENDING,
             "Active Ray cluster exists and no pending Ray cluster", now.text, generation)
    else:
        cond = find_condition(conditions, rs_api.UPGRADE_IN_PROGRESS)
        if cond is None or cond.get("reason") != rs_api.REASON_INITIALIZING:
            _set(conditions, rs_api.UPGRADE_IN_PROGRESS, "Unknown", rs_api.REASON_NO_ACTIVE,
                 "No active Ray cluster exists, and the RayService is not initializing", now.text, generation)
    st["conditions"] = conditions
    if _is_true(conditions, rs_api.READY):
        st["serviceStatus"] = rs_api.SERVICE_RUNNING
    else:
        st.pop("serviceStatus", None)


# -- the decision -----------------------------------------------------------------------------


def decide_service(o: ServiceObserved, now: Instant) -> Actions:
    a = Actions()
    service = o.service
    spec = service.spec
    if spec is None or spec.ray_cluster_config is None or is_being_deleted(service):
        return a
    ns, name = objects.namespace_of(service), objects.name_of(service)
    generation = objects.meta(service, "generation")
    old = dict(status_dict(service))
    st = {k: copy.deepcopy(v) for k, v in old.items() if k != "lastUpdateTime"}
    active_name = (st.get("activeServiceStatus") or {}).get("rayClusterName") or ""
    pending_name = (st.get("pendingServiceStatus") or {}).get("rayClusterName") or ""

    # 1. clusters no longer used go after the deletion delay
    doomed: dict[str, float] = {}
    for cname, cluster in sorted(o.clusters.items()):
        if cname in (active_name, pending_name) or is_being_deleted(cluster):
            continue
        due = o.doomed.get(cname, now.wall + rs_api.deletion_delay(spec))
        doomed[cname] = due
        if now.wall >= due:
            a.deletes.append(Delete(api.RayCluster, cname, ns, uid=objects.uid_of(cluster),
                                    propagation_policy="Background", must=False, success_reason="DeletedRayCluster"))
        else:
            a.requeue(due - now.wall)
    a.memo["doomed"] = doomed

    active = o.clusters.get(active_name) if active_name else None
    pending = o.clusters.get(pending_name) if pending_name else None

    # 2. the pending cluster made; a cluster with worker groups added updated in place
    if pending_name and pending is None:
        # Until the cache shows it, the cluster being made stands for the pending one.
        pending = cluster_body(service, pending_name)
        a.creates.append(Create(pending, on_exists="ignore", success_reason="CreatedRayCluster"))
    upgrading = _is_true(list(st.get("conditions") or []), rs_api.UPGRADE_IN_PROGRESS)
    for cluster, is_active in ((active, True), (pending, False)):
        if should_update_cluster(service, cluster, is_active, upgrading):
            a.updates.append(Update(_updated_cluster(service, cluster), event=Event(
                "Normal", "UpdatedRayCluster", f"Updated the RayCluster {objects.name_of(cluster)}")))

    # 3. the heads' ray.io/serve label, from their proxy's health
    serving: dict[str, bool] = {}
    for cname in (active_name, pending_name):
        head = o.heads.get(cname) if cname else None
        if head is None or cname not in o.clusters:
            continue
        want = "false" if spec.exclude_head_pod_from_serve_svc else ("true" if o.proxy.get(cname) else "false")
        have = objects.labels_of(head).get(SERVE_LABEL)
        serving[cname] = have == "true"
        if have != want:
            a.patches.append(Patch(Pod, objects.name_of(head), ns, {"metadata": {"labels": {SERVE_LABEL: want}}}))

    # 4. Serve on the pending cluster, else on the active one
    deploys: list[ServeDeploy] = []
    pending_ready = active_ready = False
    active_apps = pending_apps = None
    if pending is not None:
        pending_ready, pending_apps = _reconcile_serve(o, pending_name, deploys)
        # The switch waits for the head to be in the Serve Service's selection already.
        pending_ready = pending_ready and (serving.get(pending_name, False) or bool(spec.exclude_head_pod_from_serve_svc))
    if active is not None and pending is None and not should_prepare_cluster(service, active, None, False):
        active_ready, active_apps = _reconcile_serve(o, active_name, deploys)
    a.memo["deploy"] = deploys

    st["activeServiceStatus"] = _service_status(active_name, active, active_apps)
    st["pendingServiceStatus"] = _service_status(pending_name, pending, pending_apps)

    # 5. the Services to the ready cluster; promotion once they point at the pending one
    pending_serving = False
    target = pending if pending_ready else active if active_ready else None
    if target is not None:
        _point(a, o.head_service, head_service_body(service, target), "head")
        _point(a, o.serve_service, serve_service_body(service, target), "Serve")
        points_to = objects.name_of(target)
        pending_serving = points_to == pending_name
        if active_name != points_to:
            if active_name:
                a.event("Normal", "Promoted", f"The RayCluster {points_to} serves; {active_name} is retired")
            st["activeServiceStatus"] = st["pendingServiceStatus"]
            st["pendingServiceStatus"] = {}
            active_name, pending_name = points_to, ""

    # 6. a new pending cluster when there is none or rayClusterConfig changed
    if should_prepare_cluster(service, active, pending, pending_serving):
        pending_name = f"{name}-{o.suffix}"
        st["pendingServiceStatus"] = {"rayClusterName": pending_name}
        a.creates.append(Create(cluster_body(service, pending_name), on_exists="ignore",
                                success_reason="CreatedRayCluster"))

    # 7. status
    for key in ("activeServiceStatus", "pendingServiceStatus"):
        if not st.get(key):
            st.pop(key, None)
    n = serve_endpoints(o.endpoints) if o.serve_service is not None else 0
    if n:
        st["numServeEndpoints"] = n
    else:
        st.pop("numServeEndpoints", None)
    if generation is not None:
        st["observedGeneration"] = generation
    _conditions(st, now, generation)
    if st != {k: v for k, v in old.items() if k != "lastUpdateTime"}:
        st["lastUpdateTime"] = now.text
        a.status = st
    a.requeue(POLL_SECONDS)
    return a
