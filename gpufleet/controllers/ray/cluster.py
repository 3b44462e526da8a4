"""A RayCluster's sync as a pure decision: ``decide_cluster(observed, now) -> Actions``.

In order: the head Service, the PodGroup (the head and every group's minReplicas, placed
whole), the head pod (one; a head that ended is replaced), the head-address ConfigMap once
the head has an address, then each worker group: ``scaleStrategy.workersToDelete`` deleted
first (and the list cleared, as KubeRay does), ended workers replaced, then as many pods
created or deleted as the group's desired count says. ``suspend`` (the cluster's or a
group's) deletes the pods. The status is KubeRay's: state, the worker counts, desired
resources, endpoints and the head's addresses, conditions HeadPodReady and
RayClusterProvisioned; an Event carries the scheduler's reason while pods wait unplaced."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.api import ray as api
from gpufleet.api.k8s import Pod
from gpufleet.client import objects
from gpufleet.controllers._common import (
    find_condition,
    is_being_deleted,
    pod_is_ready,
    pod_phase,
    pods_to_delete,
    set_condition,
    status_dict,
)
from gpufleet.controllers.actions import Actions, Create, Delete, Instant, Patch
from gpufleet.controllers.pytorchjob.model import gang_wait_reason
from gpufleet.controllers.ray import pods as rp

UNSCHEDULABLE = "Unschedulable"
HELD_RECHECK_S = 3.0
# room(worker pod body, how many, this cluster's unbound pods) -> (how many fit, why not all)
Room = Callable[[dict[str, Any], int, list[Any]], tuple[int, "str | None"]]


@dataclass(frozen=True)
class ClusterObserved:
    cluster: api.RayCluster
    pods: list[Any]
    service: Any = None  # the head Service, when cached
    deleting: frozenset[str] = frozenset()  # uids of pods this controller is deleting
    last_wait: str | None = None  # the scheduler's reason last reported as an Event
    gang: bool = True  # whether to place the minimum through a PodGroup
    # With enableInTreeAutoscaling, how many new workers the scheduler could place now
    # (gpufleet.scheduler.placement.room over the nodes and their pods, handed in by the
    # controller manager); None: create them all.
    room: Room | None = None
    last_held: str | None = None  # the held-back workers' message last reported as an Event
    extra: dict[str, Any] = field(default_factory=dict)


def _role(pod: Any) -> str:
    return objects.labels_of(pod).get(rp.NODE_TYPE_LABEL, "")


def _group(pod: Any) -> str:
    return objects.labels_of(pod).get(rp.GROUP_LABEL, "")


def _alive(pod: Any, deleting: frozenset[str]) -> bool:
    return (not is_being_deleted(pod) and objects.uid_of(pod) not in deleting
            and pod_phase(pod) not in ("Succeeded", "Failed"))


def _running(pod: Any) -> bool:
    return pod_phase(pod) == "Running"


def _delete(a: Actions, pod: Any, reason: str = "Deleted") -> None:
    a.deletes.append(Delete(Pod, objects.name_of(pod), objects.namespace_of(pod), uid=objects.uid_of(pod),
                            expect=True, must=False, success_reason=reason))


def _unplaced_reason(pods: list[Any]) -> str | None:
    """The scheduler's message on a pod it could not place (PodScheduled=False)."""
    reason = gang_wait_reason(pods)
    if reason:
        return reason
    for p in pods:
        if p.spec is not None and p.spec.node_name or pod_phase(p) != "Pending":
            continue
        for c in (p.status.conditions if p.status is not None else None) or []:
            if c.type == "PodScheduled" and c.status == "False" and c.message:
                return c.message
    return None


def decide_cluster(o: ClusterObserved, now: Instant) -> Actions:
    a = Actions()
    cluster = o.cluster
    spec = cluster.spec
    if spec is None or spec.head_group_spec is None or is_being_deleted(cluster):
        return a
    ns, name, uid = objects.namespace_of(cluster), objects.name_of(cluster), objects.uid_of(cluster)
    suspended = bool(spec.suspend)
    autoscaled = rp.autoscaling(spec)
    if autoscaled:
        # The autoscaler's identity and rights, before the head that runs it.
        for body in rp.autoscaler_rbac_bodies(cluster, spec):
            a.creates.append(Create(body, on_exists="ignore", memo=((body["kind"], ns, name), uid)))
    a.creates.append(Create(rp.head_service_body(cluster, spec), on_exists="ignore",
                            memo=(("svc", ns, name), uid)))
    if o.gang:
        pg = rp.podgroup_body(cluster, spec)
        a.creates.append(Create(pg, on_exists="update", fields=("spec",), optional=True,
                                memo=(("pg", ns, name), (uid, json.dumps(pg["spec"], sort_keys=True)))))

    heads = [p for p in o.pods if _role(p) == rp.HEAD]
    alive_heads = [p for p in heads if _alive(p, o.deleting)]
    for p in heads:
        if not is_being_deleted(p) and objects.uid_of(p) not in o.deleting and p not in alive_heads:
            _delete(a, p, "DeletedHeadPod")  # a head that ended is replaced
    head = alive_heads[0] if alive_heads else None
    if suspended:
        for p in alive_heads:
            _delete(a, p, "DeletedHeadPod")
        head = None
    else:
        for p in alive_heads[1:]:
            _delete(a, p, "DeletedHeadPod")
        if head is None:
            a.creates.append(Create(rp.head_pod_body(cluster, spec, o.gang), expect=True,
                                    success_reason="CreatedHeadPod", failure_reason="FailedToCreateHeadPod"))
        else:
            cm = rp.head_config_body(cluster, head)
            if cm is not None:
                a.creates.append(Create(cm, on_exists="update", fields=("data",),
                                        memo=(("cm", ns, rp.head_config_name(cluster)), cm["data"])))

    # -- worker groups ----------------------------------------------------------------
    ready = available = desired = lo_sum = hi_sum = 0
    cleared = False
    held: list[str] = []  # workers not created because the scheduler could not place them
    groups_out: list[dict[str, Any]] = []
    all_workers_ready = True
    for group in api.worker_groups(spec):
        gname = group.group_name or ""
        want = api.desired_replicas(group, suspended)
        desired += want
        lo, hi = api.group_bounds(group)
        hosts = group.num_of_hosts or 1
        lo_sum += lo * hosts
        hi_sum = min(api.MAX_REPLICAS, hi_sum + hi * hosts)
        mine = [p for p in o.pods if _role(p) == rp.WORKER and _group(p) == gname]
        alive = [p for p in mine if _alive(p, o.deleting)]
        for p in mine:
            if not is_being_deleted(p) and objects.uid_of(p) not in o.deleting and p not in alive:
                _delete(a, p, "DeletedWorkerPod")  # a worker that ended is replaced
        doomed = set((group.scale_strategy.workers_to_delete if group.scale_strategy else None) or [])
        dropped = False
        if doomed:
            cleared = True
            for p in alive:
                if objects.name_of(p) in doomed:
                    _delete(a, p, "DeletedWorkerPod")
            alive = [p for p in alive if objects.name_of(p) not in doomed]
            if autoscaled and want > max(len(alive), lo * hosts):
                # The autoscaler lets idle workers go: nothing needs the workers of the same
                # group that were never created for want of room (it counts from replicas,
                # which still holds them), so they are dropped rather than made later, idle.
                desired -= want - max(len(alive), lo * hosts)
                want = max(len(alive), lo * hosts)
                dropped = True
        diff = want - len(alive)
        if diff > 0 and head is not None:
            body = rp.worker_pod_body(cluster, spec, group, o.gang)
            fit, why = diff, None
            if autoscaled and o.room is not None:
                unbound = [p for p in o.pods if _alive(p, o.deleting) and not (p.spec is not None and p.spec.node_name)]
                fit, why = o.room(body, diff, unbound)
            for i in range(fit):
                a.creates.append(Create(body if i == 0 else json.loads(json.dumps(body)), expect=True,
                                        success_reason="CreatedWorkerPod", failure_reason="FailedToCreateWorkerPod"))
            if fit < diff:
                held.append(f"{diff - fit} of {want} workers of group {gname} cannot be placed"
                            f"{': ' + why if why else ''}")
        elif diff < 0:
            for p in pods_to_delete(alive, -diff):
                _delete(a, p, "DeletedWorkerPod")
            gone = {objects.uid_of(p) for p in pods_to_delete(alive, -diff)}
            alive = [p for p in alive if objects.uid_of(p) not in gone]
        ready += sum(1 for p in alive if _running(p) and pod_is_ready(p))
        available += sum(1 for p in alive if _running(p))
        if diff > 0 or not all(_running(p) and pod_is_ready(p) for p in alive):
            all_workers_ready = False
        g = group.to_dict()
        if doomed:
            g["scaleStrategy"] = {**(g.get("scaleStrategy") or {}), "workersToDelete": []}
        if dropped:
            g["replicas"] = want // hosts
        groups_out.append(g)
    if cleared:
        a.patches.append(Patch(api.RayCluster, name, ns, {"spec": {"workerGroupSpecs": groups_out}}, owner=True))

    # -- scheduling: the scheduler's reason, once per distinct reason ----------------------
    waiting = [p for p in o.pods if _alive(p, o.deleting)]
    reason = _unplaced_reason(waiting)
    if reason and reason != o.last_wait:
        a.event("Warning", UNSCHEDULABLE, f"Ray pods wait to be placed: {reason}")
    a.memo["last_wait"] = reason
    # Autoscaled groups: workers the fleet cannot place are not created (no pod stuck
    # Pending); they are reported instead, and looked at again as the fleet changes.
    held_text = "; ".join(held) or None
    if held_text and held_text != o.last_held:
        a.event("Warning", UNSCHEDULABLE, f"Workers not created: {held_text}")
    a.memo["last_held"] = held_text
    if held:
        a.requeue(HELD_RECHECK_S)

    # -- status -------------------------------------------------------------------------
    old = dict(status_dict(cluster))
    status: dict[str, Any] = {k: v for k, v in old.items() if k not in ("lastUpdateTime",)}
    conditions = [dict(c) for c in old.get("conditions") or []]
    head_ready = head is not None and _running(head) and pod_is_ready(head)
    set_condition(conditions, api.HEAD_POD_READY, "True" if head_ready else "False",
                  "HeadPodRunningAndReady" if head_ready else "HeadPodNotFound" if head is None else "HeadPodNotReady",
                  "", now.text)
    if head_ready and all_workers_ready and not suspended:
        set_condition(conditions, api.PROVISIONED, "True", "AllPodRunningAndReadyFirstTime",
                      "All Ray Pods are ready for the first time", now.text)
    elif find_condition(conditions, api.PROVISIONED) is None:
        set_condition(conditions, api.PROVISIONED, "False", "RayClusterPodsProvisioning",
                      "RayCluster Pods are being provisioned for first time", now.text)
    if suspended:
        done = not any(_alive(p, o.deleting) for p in o.pods)
        set_condition(conditions, api.CLUSTER_SUSPENDED, "True" if done else "False",
                      "Suspended" if done else "Suspending", "", now.text)
    elif find_condition(conditions, api.CLUSTER_SUSPENDED) is not None:
        set_condition(conditions, api.CLUSTER_SUSPENDED, "False", "Resumed", "", now.text)
    if held_text:
        set_condition(conditions, api.REPLICA_FAILURE, "True", UNSCHEDULABLE, held_text, now.text)
    elif (find_condition(conditions, api.REPLICA_FAILURE) or {}).get("reason") == UNSCHEDULABLE:
        set_condition(conditions, api.REPLICA_FAILURE, "False", "AllWorkersPlaced", "", now.text)
    status["conditions"] = conditions
    status.update(readyWorkerReplicas=ready, availableWorkerReplicas=available, desiredWorkerReplicas=desired,
                  minWorkerReplicas=lo_sum, maxWorkerReplicas=hi_sum, **rp.desired_resources(spec))
    state = old.get("state")
    if suspended and not any(_alive(p, o.deleting) for p in o.pods):
        state = api.SUSPENDED
    elif head_ready and all_workers_ready and not suspended:
        state = api.READY
    elif state == api.SUSPENDED:
        state = None
    if state:
        if state != old.get("state"):
            status["stateTransitionTimes"] = {**(old.get("stateTransitionTimes") or {}), state: now.text}
        status["state"] = state
    else:
        status.pop("state", None)
    if reason or held_text:
        status["reason"] = reason or held_text
    else:
        status.pop("reason", None)
    head_info: dict[str, Any] = {"serviceName": rp.head_service_name(cluster)}
    if head is not None:
        head_info["podName"] = objects.name_of(head)
        ip = head.status.pod_ip if head.status is not None else None
        if ip:
            head_info["podIP"] = ip
            svc_ip = o.service.spec.cluster_ip if o.service is not None and o.service.spec is not None else None
            head_info["serviceIP"] = svc_ip if svc_ip and svc_ip != "None" else ip
        ports = rp.head_ports(head)
        if ports:
            status["endpoints"] = {k: str(v) for k, v in sorted(ports.items())
                                   if k not in (rp.AGENT_PORT_NAME, rp.AUTOSCALER_METRICS_PORT_NAME)}
    status["head"] = head_info
    gen = objects.meta(cluster, "generation")
    if gen is not None:
        status["observedGeneration"] = gen
    if status != {k: v for k, v in old.items() if k != "lastUpdateTime"}:
        status["lastUpdateTime"] = now.text
        a.status = status
    return a
