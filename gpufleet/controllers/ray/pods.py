"""What a RayCluster's controller writes, as wire dicts: the head and worker pods with their
`ray start` commands, the head Service, the head-address ConfigMap and the PodGroup.
Everything here is a function of the cluster and its pods: nothing is sent."""

from __future__ import annotations

import json
import math
import shlex
from typing import Any

from gpufleet.api.endpoints import HOST_PORTS_ANNOTATION
from gpufleet.api.gpu import GPU_RESOURCE
from gpufleet.api.podgroup import API_VERSION as PODGROUP_API_VERSION
from gpufleet.api.podgroup import POD_GROUP_LABEL
from gpufleet.api.quantity import parse_quantity
from gpufleet.api.ray import (
    API_VERSION,
    CLUSTER_KIND,
    RayClusterSpec,
    WorkerGroupSpec,
    desired_replicas,
    worker_groups,
)
from gpufleet.client import objects
from gpufleet.controllers._common import owner_reference, pod_from_template

# KubeRay's labels on every Ray pod.
CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
GROUP_LABEL = "ray.io/group"
IDENTIFIER_LABEL = "ray.io/identifier"
IS_RAY_NODE_LABEL = "ray.io/is-ray-node"
CREATED_BY_LABEL = "app.kubernetes.io/created-by"
APP_NAME_LABEL = "app.kubernetes.io/name"
CREATED_BY = "kuberay-operator"
HEAD = "head"
WORKER = "worker"
HEAD_GROUP = "headgroup"

# The head's ports, as KubeRay names them (the Service and `ray start` use them).
GCS_PORT_NAME = "gcs-server"
DASHBOARD_PORT_NAME = "dashboard"
CLIENT_PORT_NAME = "client"
HEAD_PORTS = ((GCS_PORT_NAME, 6379), (DASHBOARD_PORT_NAME, 8265), (CLIENT_PORT_NAME, 10001))
# Every Ray node's dashboard agent, which its readiness probe asks (Ray's default port).
AGENT_PORT_NAME = "dashboard-agent"
AGENT_PORT = 52365
# Keys of the head-address ConfigMap, read by the workers' environment.
IP_KEY = "RAY_IP"
GCS_PORT_KEY = "RAY_PORT"
DASHBOARD_PORT_KEY = "RAY_DASHBOARD_PORT"
HEAD_UID_KEY = "HEAD_UID"
# The workers' environment: the head's address and GCS port.
GCS_PORT_ENV = "GPUFLEET_RAY_GCS_PORT"


def head_service_name(cluster: Any) -> str:
    return f"{objects.name_of(cluster)}-head-svc"


def head_config_name(cluster: Any) -> str:
    return f"{objects.name_of(cluster)}-head"


def _port_env(name: str) -> str:
    return "GPUFLEET_PORT_" + name.upper().replace("-", "_")


def _container_resources(container: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    res = container.get("resources") or {}
    return res.get("limits") or {}, res.get("requests") or {}


def resource_params(container: dict[str, Any]) -> dict[str, str]:
    """`ray start` resources from the Ray container, as KubeRay derives them: num-cpus from
    the CPU limit (else request), rounded up; num-gpus from the ``nvidia.com/gpu`` limit;
    memory (bytes) from the memory limit (else request)."""
    limits, requests = _container_resources(container)
    out: dict[str, str] = {}
    cpu = limits.get("cpu", requests.get("cpu"))
    if cpu is not None:
        out["num-cpus"] = str(max(1, math.ceil(parse_quantity(cpu))))
    gpu = limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE))
    if gpu is not None and parse_quantity(gpu) > 0:
        out["num-gpus"] = str(int(parse_quantity(gpu)))
    memory = limits.get("memory", requests.get("memory"))
    if memory is not None:
        out["memory"] = str(int(parse_quantity(memory)))
    return out


def start_params(role: str, params: dict[str, str], container: dict[str, Any]) -> dict[str, str]:
    """The flags of `ray start` for a head or worker: the container's resources, then what
    the group's rayStartParams say (they win), then the addresses and ports."""
    out = resource_params(container)
    out.update(params or {})
    if role == HEAD:
        out.setdefault("dashboard-host", "0.0.0.0")
        # On a node whose pods share its network the agent hands out the ports (its
        # GPUFLEET_PORT_<NAME>); with a network of its own they are the container's.
        out.setdefault("port", f"${{{_port_env(GCS_PORT_NAME)}:-6379}}")
        out.setdefault("dashboard-port", f"${{{_port_env(DASHBOARD_PORT_NAME)}:-8265}}")
        out.setdefault("ray-client-server-port", f"${{{_port_env(CLIENT_PORT_NAME)}:-10001}}")
    else:
        out.setdefault("address", f"${{FQ_RAY_IP}}:${{{GCS_PORT_ENV}}}")
    out.setdefault("dashboard-agent-listen-port", f"${{{_port_env(AGENT_PORT_NAME)}:-{AGENT_PORT}}}")
    # Several Ray nodes may share one server's network: the metrics port Ray would
    # otherwise fix (8080) is left to the system.
    out.setdefault("metrics-export-port", "0")
    return out


def _flag(key: str, value: str) -> str:
    if value == "" or value.lower() == "true" and key in ("block", "head"):
        return f"--{key}"
    # Keep ${...} expansions for the shell, quote anything else.
    if "${" in value:
        return f'--{key}="{value}"'
    return f"--{key}={shlex.quote(value)}"


def ray_start_command(role: str, params: dict[str, str], container: dict[str, Any]) -> str:
    """The shell line KubeRay runs in the Ray container: `ulimit -n 65536; ray start ...`."""
    flags = start_params(role, params, container)
    words = ["ray", "start"]
    if role == HEAD:
        words.append("--head")
    words.extend(_flag(k, v) for k, v in sorted(flags.items()) if k not in ("head", "block"))
    return "ulimit -n 65536; " + " ".join(words)


def _container_command(role: str, params: dict[str, str], container: dict[str, Any]) -> None:
    """Set the Ray container's command as KubeRay does: `ray start ... --block` alone, or,
    when the template gives a command of its own, `ray start` and then that command."""
    start = ray_start_command(role, params, container)
    if role == HEAD:
        # What `ray status` and a job's driver in the head connect to.
        start = f"export RAY_ADDRESS=127.0.0.1:${{{_port_env(GCS_PORT_NAME)}:-6379}}; {start}"
    user = [*(container.get("command") or []), *(container.get("args") or [])]
    line = f"{start} && {shlex.join(user)}" if user else f"{start} --block"
    container["command"] = ["/bin/bash", "-c", "--"]
    container["args"] = [line]


def _labels(cluster: Any, role: str, group: str) -> dict[str, str]:
    name = objects.name_of(cluster)
    return {CLUSTER_LABEL: name, NODE_TYPE_LABEL: role, GROUP_LABEL: group,
            IDENTIFIER_LABEL: f"{name}-{role}", IS_RAY_NODE_LABEL: "yes",
            CREATED_BY_LABEL: CREATED_BY, APP_NAME_LABEL: "kuberay"}


def _env(container: dict[str, Any], extra: list[dict[str, Any]]) -> None:
    have = {e.get("name") for e in container.get("env") or []}
    container["env"] = [*(container.get("env") or []), *(e for e in extra if e["name"] not in have)]


def _pod(cluster: Any, spec: RayClusterSpec, role: str, group: WorkerGroupSpec | None,
         gang: bool) -> dict[str, Any]:
    name = objects.name_of(cluster)
    source = spec.head_group_spec if role == HEAD else group
    group_name = HEAD_GROUP if role == HEAD else (group.group_name or "")
    labels = _labels(cluster, role, group_name)
    if gang:
        labels[POD_GROUP_LABEL] = name
    body = pod_from_template(
        source.template, namespace=objects.namespace_of(cluster),
        generate_name=f"{name}-head-" if role == HEAD else f"{name}-{group_name}-worker-",
        owner_ref=owner_reference(cluster, API_VERSION, CLUSTER_KIND), labels=labels)
    pspec = body["spec"]
    # A Ray node that exits is replaced by the controller (as KubeRay's default restartPolicy
    # Never with the operator recreating lost pods).
    pspec.setdefault("restartPolicy", "Never")
    containers = pspec.get("containers") or []
    if not containers:
        return body
    ray = containers[0]
    env = [{"name": "RAY_CLUSTER_NAME", "value": name},
           {"name": "RAY_CLOUD_INSTANCE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "RAY_NODE_TYPE_NAME", "value": group_name},
           {"name": "RAY_USAGE_STATS_KUBERAY_IN_USE", "value": "1"}]
    have = {p.get("name") for p in ray.get("ports") or []}
    wanted = [*(HEAD_PORTS if role == HEAD else ()), (AGENT_PORT_NAME, AGENT_PORT)]
    ray["ports"] = [*(ray.get("ports") or []),
                    *({"name": n, "containerPort": p, "protocol": "TCP"} for n, p in wanted if n not in have)]
    # Ready once the node's raylet is up (a worker: once it joined the head), and for the
    # head once its GCS answers, as the probes KubeRay injects check.
    path, port = ("/api/gcs_healthz", DASHBOARD_PORT_NAME) if role == HEAD \
        else ("/api/local_raylet_healthz", AGENT_PORT_NAME)
    ray.setdefault("readinessProbe", {"httpGet": {"path": path, "port": port},
                                      "periodSeconds": 2, "timeoutSeconds": 2, "failureThreshold": 10})
    if role != HEAD:
        ref = head_config_name(cluster)
        env.extend([
            {"name": "FQ_RAY_IP", "valueFrom": {"configMapKeyRef": {"name": ref, "key": IP_KEY}}},
            {"name": "RAY_IP", "valueFrom": {"configMapKeyRef": {"name": ref, "key": IP_KEY}}},
            {"name": GCS_PORT_ENV, "valueFrom": {"configMapKeyRef": {"name": ref, "key": GCS_PORT_KEY}}},
        ])
    params = dict(source.ray_start_params or {})
    env.append({"name": "KUBERAY_GEN_RAY_START_CMD", "value": ray_start_command(role, params, ray)})
    if role == HEAD and autoscaling(spec):
        if autoscaler_version(spec) == "v2":
            # What makes `ray start --head` run the GCS side of autoscaler v2.
            env.append({"name": "RAY_enable_autoscaler_v2", "value": "1"})
        pspec.setdefault("serviceAccountName", service_account_name(cluster, spec))
        _mount_logs(pspec, ray)
        containers.append(autoscaler_container(cluster, spec, ray))
    _container_command(role, params, ray)
    _env(ray, env)
    return body


# -- the autoscaler (enableInTreeAutoscaling) ----------------------------------------------

AUTOSCALER_CONTAINER = "autoscaler"
LOGS_VOLUME = "ray-logs"
LOGS_PATH = "/tmp/ray"
# Ray's autoscaler serves its metrics on 44217 (AUTOSCALER_METRIC_PORT); declared, so that
# where a node's pods share its network the agent hands it a free port instead.
AUTOSCALER_METRICS_PORT_NAME = "as-metrics"
AUTOSCALER_METRICS_PORT = 44217
AUTOSCALER_RESOURCES = {"limits": {"cpu": "500m", "memory": "512Mi"},
                        "requests": {"cpu": "500m", "memory": "512Mi"}}


def autoscaling(spec: RayClusterSpec) -> bool:
    return bool(spec.enable_in_tree_autoscaling)


def autoscaler_version(spec: RayClusterSpec) -> str:
    """v1 or v2. Unset means v2 here (KubeRay: v1): v1 tells Ray nodes apart by IP, and
    Ray pods of the process runtime share their node's address; v2 tells them apart by
    pod name (RAY_CLOUD_INSTANCE_ID)."""
    opts = spec.autoscaler_options
    return (opts.version if opts is not None else None) or "v2"


def service_account_name(cluster: Any, spec: RayClusterSpec) -> str:
    """The head's service account, which the autoscaler calls the API as: the head
    template's own, else one named after the cluster (as KubeRay)."""
    head = spec.head_group_spec
    tspec = head.template.spec if head is not None and head.template is not None else None
    return (tspec.service_account_name if tspec is not None else None) or objects.name_of(cluster)


def _mount_logs(pspec: dict[str, Any], ray: dict[str, Any]) -> None:
    """The emptyDir KubeRay shares between the Ray container and the autoscaler (Ray's
    logs, which the autoscaler writes its monitor.log beside)."""
    volumes = pspec.setdefault("volumes", [])
    if not any(v.get("name") == LOGS_VOLUME for v in volumes):
        volumes.append({"name": LOGS_VOLUME, "emptyDir": {}})
    mounts = ray.setdefault("volumeMounts", [])
    if not any(m.get("mountPath") == LOGS_PATH for m in mounts):
        mounts.append({"name": LOGS_VOLUME, "mountPath": LOGS_PATH})


def autoscaler_container(cluster: Any, spec: RayClusterSpec, ray: dict[str, Any]) -> dict[str, Any]:
    """The sidecar running Ray's own autoscaler, as KubeRay adds it: `ray kuberay-autoscaler`
    with the cluster's name and namespace, from the head's image (or autoscalerOptions'),
    500m/512Mi unless autoscalerOptions says. It reaches the GCS at the head container's
    port (GPUFLEET_PORT_GCS_SERVER where the node hands the ports out)."""
    opts = spec.autoscaler_options
    gcs = f"127.0.0.1:${{{_port_env(GCS_PORT_NAME)}:-6379}}"
    env = [
        {"name": "RAY_CLUSTER_NAME", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{CLUSTER_LABEL}']"}}},
        {"name": "RAY_CLUSTER_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "RAY_HEAD_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "KUBERAY_CRD_VER", "value": "v1"},
    ]
    if autoscaler_version(spec) == "v2":
        env.append({"name": "RAY_enable_autoscaler_v2", "value": "1"})
    container: dict[str, Any] = {
        "name": AUTOSCALER_CONTAINER,
        "image": (opts.image if opts is not None else None) or ray.get("image"),
        "imagePullPolicy": (opts.image_pull_policy if opts is not None else None)
        or ray.get("imagePullPolicy") or "IfNotPresent",
        "command": ["/bin/bash", "-c", "--"],
        "args": [f"export AUTOSCALER_METRIC_PORT=${{{_port_env(AUTOSCALER_METRICS_PORT_NAME)}:-"
                 f"{AUTOSCALER_METRICS_PORT}}}; ray kuberay-autoscaler --cluster-name $(RAY_CLUSTER_NAME) "
                 f"--cluster-namespace $(RAY_CLUSTER_NAMESPACE) --gcs-address {gcs}"],
        "ports": [{"name": AUTOSCALER_METRICS_PORT_NAME, "containerPort": AUTOSCALER_METRICS_PORT,
                   "protocol": "TCP"}],
        "env": [*env, *((opts.env if opts is not None else None) or [])],
        "resources": (opts.resources if opts is not None else None) or json.loads(json.dumps(AUTOSCALER_RESOURCES)),
        "volumeMounts": [{"name": LOGS_VOLUME, "mountPath": LOGS_PATH},
                         *((opts.volume_mounts if opts is not None else None) or [])],
    }
    if opts is not None and opts.env_from:
        container["envFrom"] = list(opts.env_from)
    if opts is not None and opts.security_context:
        container["securityContext"] = dict(opts.security_context)
    return container


# KubeRay's Role for the autoscaler: read the cluster's pods, scale the RayCluster.
AUTOSCALER_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["patch"]},
    {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "patch"]},
]


def autoscaler_rbac_bodies(cluster: Any, spec: RayClusterSpec) -> list[dict[str, Any]]:
    """The ServiceAccount (unless the head template names its own), Role and RoleBinding
    the autoscaler calls the API with, each named after the cluster, as KubeRay makes them."""
    name, ns = objects.name_of(cluster), objects.namespace_of(cluster)
    sa = service_account_name(cluster, spec)

    def meta(n: str) -> dict[str, Any]:
        return {"name": n, "namespace": ns, "labels": {CLUSTER_LABEL: name, CREATED_BY_LABEL: CREATED_BY},
                "ownerReferences": [owner_reference(cluster, API_VERSION, CLUSTER_KIND)]}

    out: list[dict[str, Any]] = []
    if sa == name:
        out.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(name)})
    out.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(name),
                "rules": json.loads(json.dumps(AUTOSCALER_RULES))})
    out.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(name),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]})
    return out


def head_pod_body(cluster: Any, spec: RayClusterSpec, gang: bool) -> dict[str, Any]:
    return _pod(cluster, spec, HEAD, None, gang)


def worker_pod_body(cluster: Any, spec: RayClusterSpec, group: WorkerGroupSpec, gang: bool) -> dict[str, Any]:
    return _pod(cluster, spec, WORKER, group, gang)


def head_service_body(cluster: Any, spec: RayClusterSpec) -> dict[str, Any]:
    name = objects.name_of(cluster)
    head = spec.head_group_spec
    containers = (head.template.spec.containers if head and head.template and head.template.spec else None) or []
    declared = {p.name: p.container_port for p in (containers[0].ports or [])} if containers else {}
    ports = [{"name": n, "port": declared.get(n, p), "targetPort": n, "protocol": "TCP"} for n, p in HEAD_PORTS]
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": head_service_name(cluster), "namespace": objects.namespace_of(cluster),
                     "labels": {CLUSTER_LABEL: name, NODE_TYPE_LABEL: HEAD, CREATED_BY_LABEL: CREATED_BY},
                     "ownerReferences": [owner_reference(cluster, API_VERSION, CLUSTER_KIND)]},
        "spec": {"type": (head.service_type if head else None) or "ClusterIP",
                 "selector": {CLUSTER_LABEL: name, NODE_TYPE_LABEL: HEAD},
                 "ports": ports},
    }
    if spec.head_service_annotations:
        body["metadata"]["annotations"] = dict(spec.head_service_annotations)
    return body


def head_ports(head_pod: Any) -> dict[str, int]:
    """The head's ports as reachable from other pods: the node port its agent handed out
    (the pod's host-ports annotation) when its node's pods share the node's network, else
    the container port."""
    ann = (objects.meta(head_pod, "annotations") or {}).get(HOST_PORTS_ANNOTATION)
    try:
        published = {str(k): int(v) for k, v in json.loads(ann).items()} if ann else {}
    except (ValueError, TypeError, AttributeError):
        published = {}
    out: dict[str, int] = {}
    spec = head_pod.spec
    for c in (spec.containers if spec is not None else None) or []:
        for p in c.ports or []:
            if p.name and p.name not in out:
                out[p.name] = published.get(p.name, p.container_port)
    return out


def head_config_body(cluster: Any, head_pod: Any) -> dict[str, Any] | None:
    """The ConfigMap telling the workers where the head is; None until the head has an
    address and its ports (the agent publishes them once it set the pod up)."""
    ip = head_pod.status.pod_ip if head_pod.status is not None else None
    ports = head_ports(head_pod)
    ann = objects.meta(head_pod, "annotations") or {}
    if not ip or GCS_PORT_NAME not in ports or HOST_PORTS_ANNOTATION not in ann:
        return None
    data = {IP_KEY: ip, GCS_PORT_KEY: str(ports[GCS_PORT_NAME]),
            DASHBOARD_PORT_KEY: str(ports.get(DASHBOARD_PORT_NAME, 8265)), HEAD_UID_KEY: objects.uid_of(head_pod)}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": head_config_name(cluster), "namespace": objects.namespace_of(cluster),
                         "labels": {CLUSTER_LABEL: objects.name_of(cluster), CREATED_BY_LABEL: CREATED_BY},
                         "ownerReferences": [owner_reference(cluster, API_VERSION, CLUSTER_KIND)]},
            "data": data}


def gang_size(spec: RayClusterSpec) -> int:
    """The head and every group's minReplicas (times numOfHosts): the least the cluster is."""
    return 1 + sum((g.min_replicas or 0) * (g.num_of_hosts or 1) for g in worker_groups(spec) if not g.suspend)


def podgroup_body(cluster: Any, spec: RayClusterSpec) -> dict[str, Any]:
    name = objects.name_of(cluster)
    return {"apiVersion": PODGROUP_API_VERSION, "kind": "PodGroup",
            "metadata": {"name": name, "namespace": objects.namespace_of(cluster),
                         "labels": {CLUSTER_LABEL: name, CREATED_BY_LABEL: CREATED_BY},
                         "ownerReferences": [owner_reference(cluster, API_VERSION, CLUSTER_KIND)]},
            "spec": {"minMember": gang_size(spec)}}


def desired_resources(spec: RayClusterSpec) -> dict[str, str]:
    """status.desiredCPU/Memory/GPU: the head's and the desired workers' container requests
    (limits where no request), as KubeRay sums them."""
    totals = {"cpu": 0, "memory": 0, GPU_RESOURCE: 0}

    def add(template: Any, times: int) -> None:
        for c in ((template.spec.containers if template is not None and template.spec is not None else None) or []):
            limits, requests = _container_resources(c.to_dict() if hasattr(c, "to_dict") else c)
            for key in totals:
                value = requests.get(key, limits.get(key))
                if value is not None:
                    totals[key] += parse_quantity(value) * times

    head = spec.head_group_spec
    if head is not None:
        add(head.template, 1)
    for g in worker_groups(spec):
        add(g.template, desired_replicas(g, bool(spec.suspend)))
    return {"desiredCPU": _quantity(totals["cpu"]), "desiredMemory": _memory(totals["memory"]),
            "desiredGPU": _quantity(totals[GPU_RESOURCE])}


def _quantity(value: Any) -> str:
    if value == int(value):
        return str(int(value))
    return f"{int(value * 1000)}m"


def _memory(value: Any) -> str:
    n = int(value)
    for suffix, size in (("Gi", 1 << 30), ("G", 10**9), ("Mi", 1 << 20), ("M", 10**6), ("Ki", 1 << 10),
                         ("k", 1000)):
        if n and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)
