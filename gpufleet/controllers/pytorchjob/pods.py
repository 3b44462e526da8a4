"""What a PyTorchJob's controller writes around its gang, as wire dicts: the member pods
(labels, annotations, the leader's port, the environment torchrun and Kubeflow's scripts
read), the headless Service, the PodGroup, the rendezvous ConfigMap, and replicaStatuses.
Everything here is a function of the job, the nodes and the pods: nothing is sent."""

from __future__ import annotations

from typing import Any

from gpufleet.api.gpu import GPU_RESOURCE
from gpufleet.api.kubeflow import (
    DEFAULT_CONTAINER_NAME,
    DEFAULT_PORT_NAME,
    MASTER,
    RENDEZVOUS_PORT_ANNOTATION,
    WORKER,
    elastic_bounds,
    is_elastic,
    replica_specs,
    replicas_of,
    run_policy,
)
from gpufleet.api.podresources import pod_gpu_request
from gpufleet.api.quantity import parse_quantity
from gpufleet.api.taints import NO_EXECUTE, NO_SCHEDULE, taint_tuples
from gpufleet.client import objects
from gpufleet.controllers._common import is_being_deleted, owner_reference, pod_from_template, pod_phase
from gpufleet.controllers.pytorchjob.model import (
    API_VERSION,
    ATTEMPT_ANNOTATION,
    CHECKPOINT_ANNOTATION,
    CHECKPOINT_ENV,
    GANG_SIZE_ANNOTATION,
    JOB_NAME_LABEL,
    JOB_ROLE_LABEL,
    KIND,
    OPERATOR_NAME,
    OPERATOR_NAME_LABEL,
    POD_GROUP_LABEL,
    PODGROUP_API_VERSION,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
    _pods_share_host_network,
    checkpoint_dir,
    gang_members,
    job_port,
    leader,
    node_rank,
    nproc_per_node,
    pod_attempt,
    pod_member,
    pod_name,
    rendezvous_name,
    resize_in_place,
)


def fleet_address(nodes: list[Any]) -> str | None:
    """The one address every node has, if they all share one and their pods share it
    too (pods then reach the leader there wherever it lands)."""
    seen: set[str] = set()
    for node in nodes:
        status = getattr(node, "status", None)
        if not _pods_share_host_network(node):
            return None
        for a in (status.addresses if status is not None else None) or []:
            if a.type == "InternalIP" and a.address:
                seen.add(a.address)
    return seen.pop() if len(seen) == 1 else None


def pod_body(job: Any, rtype: str, index: int, attempt: int, *, checkpoint_root: str,
             shared_address: str | None) -> dict[str, Any]:
    name = objects.name_of(job)
    spec = replica_specs(job)[rtype]
    labels = {
        JOB_NAME_LABEL: name,
        REPLICA_TYPE_LABEL: rtype.lower(),
        REPLICA_INDEX_LABEL: str(index),
        OPERATOR_NAME_LABEL: OPERATOR_NAME,
        POD_GROUP_LABEL: name,
    }
    if rtype == MASTER:
        labels[JOB_ROLE_LABEL] = "master"
    body = pod_from_template(
        spec.template,
        namespace=objects.namespace_of(job),
        generate_name="",
        owner_ref=owner_reference(job, API_VERSION, KIND),
        labels=labels,
        annotations={ATTEMPT_ANNOTATION: str(attempt), GANG_SIZE_ANNOTATION: str(len(gang_members(job))),
                     # The node agent mounts it into the pod's containers (podman, sandbox).
                     CHECKPOINT_ANNOTATION: checkpoint_dir(job, checkpoint_root),
                     },
    )
    meta = body["metadata"]
    meta.pop("generateName", None)
    meta["name"] = pod_name(name, rtype, index)
    pspec = body["spec"]
    pspec["restartPolicy"] = "Never"
    pspec.setdefault("hostname", meta["name"])
    pspec.setdefault("subdomain", name)
    sp = run_policy(job).scheduling_policy
    if sp is not None and sp.priority_class and not pspec.get("priorityClassName"):
        pspec["priorityClassName"] = sp.priority_class
    # Only the controller says which pod is the leader and which port it holds.
    annotations = meta.setdefault("annotations", {})
    annotations.pop(RENDEZVOUS_PORT_ANNOTATION, None)
    containers = pspec.get("containers") or []
    if not containers:
        return body
    target = next((c for c in containers if c.get("name") == DEFAULT_CONTAINER_NAME), containers[0])
    port = job_port(job, attempt)
    is_leader = (rtype, index) == leader(job)
    if is_leader:
        ports = [p for p in target.get("ports") or [] if p.get("name") != DEFAULT_PORT_NAME]
        target["ports"] = [{"name": DEFAULT_PORT_NAME, "containerPort": port, "protocol": "TCP"}, *ports]
        annotations[RENDEZVOUS_PORT_ANNOTATION] = str(port)
    env = pod_env(job, target, rtype, index, attempt, is_leader, checkpoint_root=checkpoint_root,
                  shared_address=shared_address)
    if is_elastic(job) and shared_address is not None:
        # Pods sharing one address (process runtime on one server or a loopback fleet) are
        # told apart by name: each member's name leads to that address.
        lo, hi = elastic_bounds(job)
        names = [pod_name(name, MASTER, 0)] if MASTER in replica_specs(job) else []
        names += [pod_name(name, WORKER, i) for i in range(max(hi, replicas_of(job, WORKER)))]
        aliases = [a for a in pspec.get("hostAliases") or [] if a.get("ip") != shared_address]
        pspec["hostAliases"] = [*aliases, {"ip": shared_address, "hostnames": names}]
    own = {e.get("name") for e in target.get("env") or []}
    target["env"] = [*(e for e in env if e["name"] not in own), *(target.get("env") or [])]
    return body


def pod_env(job: Any, container: dict[str, Any], rtype: str, index: int, attempt: int, is_leader: bool, *,
            checkpoint_root: str, shared_address: str | None) -> list[dict[str, Any]]:
    port = str(job_port(job, attempt))
    if shared_address is not None:
        addr: dict[str, Any] = {"name": "MASTER_ADDR", "value": shared_address}
    elif is_leader:
        addr = {"name": "MASTER_ADDR", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    else:
        addr = {"name": "MASTER_ADDR", "valueFrom": {"configMapKeyRef": {
            "name": rendezvous_name(job), "key": "MASTER_ADDR"}}}
    nproc = nproc_per_node(job, container)
    env: list[dict[str, Any]] = [
        addr,
        {"name": "MASTER_PORT", "value": port},
        {"name": "PET_MASTER_ADDR", "value": "$(MASTER_ADDR)"},
        {"name": "PET_MASTER_PORT", "value": port},
        {"name": "PET_NPROC_PER_NODE", "value": nproc},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": CHECKPOINT_ENV, "value": checkpoint_dir(job, checkpoint_root)},
    ]
    rank = node_rank(job, rtype, index)
    if is_elastic(job):
        ep = job.spec.elastic_policy
        lo, hi = elastic_bounds(job)
        n = replicas_of(job, WORKER) + (1 if MASTER in replica_specs(job) else 0)
        host = ep.rdzv_host or "$(MASTER_ADDR)"
        conf = [f"{c.key}={c.value}" for c in ep.rdzv_conf or [] if c.key]
        if not ep.rdzv_host and not any((c.key or "") == "is_host" for c in ep.rdzv_conf or []):
            # Only the leader hosts the rendezvous store: on a shared host network every
            # member would otherwise match the endpoint's address and race to host it.
            conf.append(f"is_host={'true' if is_leader else 'false'}")
        env += [
            # Restarted at each resize, the group knows its size: torchrun then waits for
            # every member instead of starting with the first minReplicas.
            {"name": "PET_NNODES", "value": f"{lo}:{hi}" if resize_in_place(job) else f"{n}:{n}"},
            {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"},
            {"name": "PET_RDZV_BACKEND", "value": ep.rdzv_backend or "c10d"},
            {"name": "PET_RDZV_ENDPOINT", "value": f"{host}:{port}"},
            {"name": "PET_RDZV_ID", "value": ep.rdzv_id or objects.uid_of(job)},
            {"name": "PET_RDZV_CONF", "value": ",".join(conf)},
            # torchrun's --local-addr: how the other members reach this one (its own
            # store, once it leads a round) and what tells it apart. Its host name would
            # resolve nowhere else without cluster DNS; pods of one address (and one PID
            # namespace layout) go by their names, which the hostAliases above resolve.
            {"name": "PET_LOCAL_ADDR", **({"valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                                          if shared_address is not None else
                                          {"valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})},
        ]
        if ep.max_restarts is not None:
            env.append({"name": "PET_MAX_RESTARTS", "value": str(ep.max_restarts)})
        if ep.standalone:
            env.append({"name": "PET_STANDALONE", "value": ""})
    else:
        total = len(gang_members(job))
        per = int(nproc) if nproc.isdigit() else 1
        env += [
            {"name": "WORLD_SIZE", "value": str(total * per)},
            {"name": "RANK", "value": str(rank)},
            {"name": "PET_NNODES", "value": str(total)},
            {"name": "PET_NODE_RANK", "value": str(rank)},
        ]
    return env


def service_body(job: Any) -> dict[str, Any]:
    name = objects.name_of(job)
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": objects.namespace_of(job),
                     "labels": {JOB_NAME_LABEL: name, OPERATOR_NAME_LABEL: OPERATOR_NAME},
                     "ownerReferences": [owner_reference(job, API_VERSION, KIND)]},
        "spec": {"clusterIP": "None", "selector": {JOB_NAME_LABEL: name, OPERATOR_NAME_LABEL: OPERATOR_NAME},
                 "publishNotReadyAddresses": True},
    }


def podgroup_body(job: Any) -> dict[str, Any]:
    name = objects.name_of(job)
    sp = run_policy(job).scheduling_policy
    if sp is not None and sp.min_available:
        min_member = sp.min_available
    elif resize_in_place(job):
        # torchrun starts once minReplicas joined; the rest may come later.
        min_member = elastic_bounds(job)[0] + (1 if MASTER in replica_specs(job) else 0)
    else:
        min_member = len(gang_members(job))
    spec: dict[str, Any] = {"minMember": max(min_member, 1)}
    if sp is not None and sp.schedule_timeout_seconds:
        spec["scheduleTimeoutSeconds"] = sp.schedule_timeout_seconds
    if sp is not None and sp.min_resources:
        spec["minResources"] = dict(sp.min_resources)
    return {
        "apiVersion": PODGROUP_API_VERSION, "kind": "PodGroup",
        "metadata": {"name": name, "namespace": objects.namespace_of(job),
                     "labels": {JOB_NAME_LABEL: name, OPERATOR_NAME_LABEL: OPERATOR_NAME},
                     "ownerReferences": [owner_reference(job, API_VERSION, KIND)]},
        "spec": spec,
    }


def rendezvous_body(job: Any, attempt: int, lead_pod: Any, nodes: dict[str, Any]) -> dict[str, Any] | None:
    """The ConfigMap that tells members the leader's address when nodes differ; None while
    the leader of this attempt has no address yet."""
    if lead_pod is None or pod_attempt(lead_pod) != attempt or is_being_deleted(lead_pod):
        return None
    node_name = lead_pod.spec.node_name if lead_pod.spec is not None else None
    if not node_name:
        return None
    node = nodes.get(node_name)
    address = None
    if node is not None and _pods_share_host_network(node):
        for a in ((node.status.addresses if node.status is not None else None) or []):
            if a.type == "InternalIP":
                address = a.address
    else:
        # A pod with a network namespace of its own is reached at its own IP, known once
        # its node's agent made its sandbox.
        address = lead_pod.status.pod_ip if lead_pod.status is not None else None
    if not address:
        return None
    data = {"MASTER_ADDR": address, "MASTER_PORT": str(job_port(job, attempt)),
            "LEADER_UID": objects.uid_of(lead_pod)}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": rendezvous_name(job), "namespace": objects.namespace_of(job),
                         "labels": {JOB_NAME_LABEL: objects.name_of(job)},
                         "ownerReferences": [owner_reference(job, API_VERSION, KIND)]},
            "data": data}


def replica_statuses(job: Any, pods: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    name = objects.name_of(job)
    for rtype in replica_specs(job):
        mine = [p for p in pods if (pod_member(p) or ("", 0))[0] == rtype]
        labels = {JOB_NAME_LABEL: name, OPERATOR_NAME_LABEL: OPERATOR_NAME, REPLICA_TYPE_LABEL: rtype.lower()}
        entry: dict[str, Any] = {
            "labelSelector": {"matchLabels": labels},
            "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        }
        counts = {
            "active": sum(1 for p in mine if pod_phase(p) == "Running" and not is_being_deleted(p)),
            "succeeded": sum(1 for p in mine if pod_phase(p) == "Succeeded"),
            "failed": sum(1 for p in mine if pod_phase(p) == "Failed"),
        }
        entry.update({k: v for k, v in counts.items() if v})
        out[rtype] = entry
    return out


def free_gpus(nodes: list[Any], pods: list[Any]) -> dict[str, int]:
    """GPUs not requested by unfinished pods, per schedulable, untainted, Ready node."""
    used: dict[str, int] = {}
    for p in pods:
        node = p.spec.node_name if p.spec is not None else None
        if node and pod_phase(p) not in ("Succeeded", "Failed"):
            used[node] = used.get(node, 0) + pod_gpu_request(p)
    out: dict[str, int] = {}
    for node in nodes:
        if node.spec is not None and node.spec.unschedulable:
            continue
        if taint_tuples(node.spec.taints if node.spec else None, (NO_SCHEDULE, NO_EXECUTE)):
            continue
        status = node.status
        ready = any(c.type == "Ready" and c.status == "True" for c in (status.conditions if status else None) or [])
        if not ready:
            continue
        try:
            total = int(parse_quantity(((status.allocatable if status else None) or {}).get(GPU_RESOURCE, "0")))
        except ValueError:
            continue
        name = objects.name_of(node)
        out[name] = total - used.get(name, 0)
    return out


def node_down(pod: Any, nodes: dict[str, Any]) -> bool:
    """Whether the pod's node is gone or not Ready (its pods are then deleted at once)."""
    node_name = getattr(pod.spec, "node_name", None) if pod.spec is not None else None
    if not node_name:
        return False
    node = nodes.get(node_name)
    if node is None:
        return True
    for c in (node.status.conditions if node.status is not None else None) or []:
        if c.type == "Ready":
            return c.status != "True"
    return False
