"""Server-side printing: the `meta.k8s.io/v1` Table that `kubectl get` asks for.

kubectl sends `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` on every `get` and prints
whatever columns the server returns; without a Table it can only show NAME and AGE. The
columns and cell rules follow kube-apiserver's printers (pkg/printers/internalversion), so
`kubectl get` reads the same here as on a real cluster. Like kube-apiserver, every cell of
every column is always computed: kubectl itself hides the priority>0 columns unless `-o wide`.

Kinds added later (PyTorchJob, PodGroup, Kueue queues) call `register_printer`; any other
kind gets Name and Age, which is what a CRD without additionalPrinterColumns shows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.api import storage
from gpufleet.api.gpu import GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpufleet.api.podresources import pod_gpu_request
from gpufleet.api.quantity import to_int_bytes
from gpufleet.api.registry import ResourceType
from gpufleet.utils.clock import parse_rfc3339, rfc3339

_NODE_ROLE_PREFIX = "node-role.kubernetes.io/"
_NODE_ROLE_LABEL = "kubernetes.io/role"

Obj = dict[str, Any]
RowFn = Callable[[Obj, float], list[Any]]


@dataclass(frozen=True)
class Column:
    name: str
    type: str = "string"
    format: str = ""
    description: str = ""
    priority: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


NAME_COLUMN = Column(
    "Name",
    format="name",
    description="Name must be unique within a namespace. Is required when creating resources, although "
    "some resources may allow a client to request the generation of an appropriate name automatically.",
)
AGE_COLUMN = Column(
    "Age",
    description="CreationTimestamp is a timestamp representing the server time when this object was created.",
)


@dataclass(frozen=True)
class Printer:
    columns: tuple[Column, ...]
    row: RowFn


# (group, kind) -> Printer. group None matches a kind of any group.
_PRINTERS: dict[tuple[str | None, str], Printer] = {}


def register_printer(
    kind: str,
    columns: Sequence[Column | dict[str, Any]],
    row_fn: RowFn,
    *,
    group: str | None = None,
) -> None:
    """Give `kind` its own `kubectl get` columns.

    row_fn(obj, now) returns one cell per column, in order (Name and Age included; use
    `age_cell` for the latter). Pass `group` when another group has a kind of the same name.
    """
    cols = tuple(c if isinstance(c, Column) else Column(**c) for c in columns)
    _PRINTERS[(group, kind)] = Printer(cols, row_fn)


def printer_for(rt: ResourceType) -> Printer:
    return _PRINTERS.get((rt.group, rt.kind)) or _PRINTERS.get((None, rt.kind)) or _DEFAULT_PRINTER


# --- durations and times -------------------------------------------------------------------


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration: about two significant figures ("3m20s", "2d3h", "3y12d")."""
    whole = int(seconds)  # truncates toward zero, like Go's int(d.Seconds())
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 60 * 2:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        s = whole % 60
        return f"{minutes}m" if s == 0 else f"{minutes}m{s}s"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        m = minutes % 60
        return f"{hours}h" if m == 0 else f"{hours}h{m}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        h = hours % 24
        return f"{hours // 24}d" if h == 0 else f"{hours // 24}d{h}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if dy == 0 else f"{hours // 24 // 365}y{dy}d"
    return f"{hours // 24 // 365}y"


def _ts(value: Any) -> float | None:
    if not value:
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return parse_rfc3339(str(value))
    except ValueError:
        return None


def since(value: Any, now: float) -> str:
    """Time elapsed since an RFC 3339 timestamp, or "<unknown>" when there is none."""
    t = _ts(value)
    return "<unknown>" if t is None else human_duration(now - t)


def age_cell(obj: Obj, now: float) -> str:
    return since(_meta(obj).get("creationTimestamp"), now)


# --- small helpers -------------------------------------------------------------------------


def _meta(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _name(obj: Obj) -> str:
    return _meta(obj).get("name", "")


def _spec(obj: Obj) -> dict[str, Any]:
    return obj.get("spec") or {}


def _status(obj: Obj) -> dict[str, Any]:
    return obj.get("status") or {}


def _int(value: Any, default: int = 0) -> int:
    if value is None or isinstance(value, bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _count(value: Any) -> int:
    """A count-like quantity (GPUs) as Kubernetes' Quantity.Value() gives it; 0 when absent or invalid."""
    if value is None or isinstance(value, bool):
        return 0
    try:
        return to_int_bytes(value)
    except (TypeError, ValueError):
        return 0


def _format_labels(labels: dict[str, str] | None) -> str:
    if not labels:
        return "<none>"
    return ",".join(f"{k}={labels[k]}" for k in sorted(labels))


def format_label_selector(selector: dict[str, Any] | None) -> str:
    """metav1.FormatLabelSelector: requirements sorted by key, "<none>" when empty."""
    if not selector:
        return "<none>"
    reqs: list[tuple[str, str]] = []
    for k, v in (selector.get("matchLabels") or {}).items():
        reqs.append((k, f"{k}={v}"))
    for expr in selector.get("matchExpressions") or []:
        key, op = expr.get("key", ""), expr.get("operator", "")
        values = ",".join(sorted(expr.get("values") or []))
        if op == "In":
            reqs.append((key, f"{key} in ({values})"))
        elif op == "NotIn":
            reqs.append((key, f"{key} notin ({values})"))
        elif op == "Exists":
            reqs.append((key, key))
        elif op == "DoesNotExist":
            reqs.append((key, f"!{key}"))
        else:
            return "<error>"
    text = ",".join(r for _, r in sorted(reqs, key=lambda kv: kv[0]))
    return text or "<none>"


def _containers_cells(pod_spec: dict[str, Any] | None) -> tuple[str, str]:
    containers = (pod_spec or {}).get("containers") or []
    return (
        ",".join(c.get("name", "") for c in containers),
        ",".join(c.get("image", "") for c in containers),
    )


def _template_spec(obj: Obj) -> dict[str, Any]:
    return (_spec(obj).get("template") or {}).get("spec") or {}


def _true_condition(conditions: Iterable[dict[str, Any]] | None, ctype: str) -> bool:
    # Like kube-apiserver's hasJobCondition: the first condition of the type decides.
    for c in conditions or []:
        if c.get("type") == ctype:
            return c.get("status") == "True"
    return False


def _int_or_string(value: Any) -> str:
    return "N/A" if value is None else str(value)


def _quantity(value: Any) -> str:
    return "0" if value is None or value == "" else str(value)


# --- Pod -----------------------------------------------------------------------------------

_POD_SUCCEEDED_CONDITIONS = [
    {
        "type": "Completed",
        "status": "True",
        "reason": "Succeeded",
        "message": "The pod has completed successfully.",
    }
]
_POD_FAILED_CONDITIONS = [
    {"type": "Completed", "status": "True", "reason": "Failed", "message": "The pod failed."}
]


def _restartable_init(container: dict[str, Any] | None) -> bool:
    return bool(container) and container.get("restartPolicy") == "Always"


def _last_termination_finished(cs: dict[str, Any]) -> float | None:
    terminated = (cs.get("lastState") or {}).get("terminated") or {}
    return _ts(terminated.get("finishedAt"))


def _pod_summary(pod: Obj) -> tuple[str, int, int, int, float | None]:
    """(status, ready, total, restarts, last restart time), following kube-apiserver's printPod."""
    spec, status = _spec(pod), _status(pod)
    init_specs = spec.get("initContainers") or []
    total = len(spec.get("containers") or [])
    ready = 0
    restarts = 0
    sidecar_restarts = 0
    last_restart: float | None = None
    last_sidecar_restart: float | None = None

    phase = status.get("phase") or ""
    reason = status.get("reason") or phase

    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"

    init_by_name = {c.get("name"): c for c in init_specs}
    total += sum(1 for c in init_specs if _restartable_init(c))

    initializing = False
    for i, cs in enumerate(status.get("initContainerStatuses") or []):
        restarts += _int(cs.get("restartCount"))
        finished = _last_termination_finished(cs)
        if finished is not None and (last_restart is None or finished > last_restart):
            last_restart = finished
        sidecar = _restartable_init(init_by_name.get(cs.get("name")))
        if sidecar:
            sidecar_restarts += _int(cs.get("restartCount"))
            if finished is not None and (last_sidecar_restart is None or finished > last_sidecar_restart):
                last_sidecar_restart = finished
        state = cs.get("state") or {}
        terminated = state.get("terminated")
        waiting = state.get("waiting")
        if terminated is not None and _int(terminated.get("exitCode")) == 0:
            continue
        if sidecar and cs.get("started"):
            if cs.get("ready"):
                ready += 1
            continue
        if terminated is not None:
            if not terminated.get("reason"):
                if _int(terminated.get("signal")) != 0:
                    reason = f"Init:Signal:{_int(terminated.get('signal'))}"
                else:
                    reason = f"Init:ExitCode:{_int(terminated.get('exitCode'))}"
            else:
                reason = "Init:" + terminated["reason"]
        elif waiting is not None and waiting.get("reason") and waiting.get("reason") != "PodInitializing":
            reason = "Init:" + waiting["reason"]
        else:
            reason = f"Init:{i}/{len(init_specs)}"
        initializing = True
        break

    if not initializing or _true_condition(status.get("conditions"), "Initialized"):
        restarts = sidecar_restarts
        last_restart = last_sidecar_restart
        has_running = False
        # Walked backwards so that, as in kube-apiserver, the first container's state has the last word.
        for cs in reversed(status.get("containerStatuses") or []):
            restarts += _int(cs.get("restartCount"))
            finished = _last_termination_finished(cs)
            if finished is not None and (last_restart is None or finished > last_restart):
                last_restart = finished
            state = cs.get("state") or {}
            waiting, terminated = state.get("waiting"), state.get("terminated")
            if waiting is not None and waiting.get("reason"):
                reason = waiting["reason"]
            elif terminated is not None and terminated.get("reason"):
                reason = terminated["reason"]
            elif terminated is not None:
                if _int(terminated.get("signal")) != 0:
                    reason = f"Signal:{_int(terminated.get('signal'))}"
                else:
                    reason = f"ExitCode:{_int(terminated.get('exitCode'))}"
            elif cs.get("ready") and state.get("running") is not None:
                has_running = True
                ready += 1
        if reason == "Completed" and has_running:
            reason = "Running" if _true_condition(status.get("conditions"), "Ready") else "NotReady"

    if _meta(pod).get("deletionTimestamp"):
        if status.get("reason") == "NodeLost":
            reason = "Unknown"
        elif phase not in ("Succeeded", "Failed"):
            reason = "Terminating"

    return reason, ready, total, restarts, last_restart


def pod_status(pod: Obj) -> str:
    """The STATUS kubectl shows for a pod: CrashLoopBackOff, Init:0/1, Terminating, Running..."""
    return _pod_summary(pod)[0]


def _pod_row(pod: Obj, now: float) -> list[Any]:
    reason, ready, total, restarts, last_restart = _pod_summary(pod)
    restarts_cell = str(restarts)
    if restarts and last_restart is not None:
        restarts_cell = f"{restarts} ({human_duration(now - last_restart)} ago)"
    spec, status = _spec(pod), _status(pod)
    pod_ips = status.get("podIPs") or []
    ip = (pod_ips[0].get("ip") if pod_ips else None) or status.get("podIP") or "<none>"
    gates = spec.get("readinessGates") or []
    readiness = "<none>"
    if gates:
        conds = status.get("conditions") or []
        true_count = 0
        for gate in gates:
            for c in conds:
                if c.get("type") == gate.get("conditionType"):
                    true_count += c.get("status") == "True"
                    break
        readiness = f"{true_count}/{len(gates)}"
    return [
        _name(pod),
        f"{ready}/{total}",
        reason,
        restarts_cell,
        age_cell(pod, now),
        ip,
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        readiness,
        pod_gpu_request(pod),
    ]


_POD_COLUMNS = (
    NAME_COLUMN,
    Column("Ready", description="The aggregate readiness state of this pod for accepting traffic."),
    Column("Status", description="The aggregate status of the containers in this pod."),
    Column(
        "Restarts",
        description="The number of times the containers in this pod have been restarted and when the last "
        "container in this pod has restarted.",
    ),
    AGE_COLUMN,
    Column("IP", priority=1, description="IP address allocated to the pod."),
    Column("Node", priority=1, description="The node the pod is bound to."),
    Column("Nominated Node", priority=1, description="The node preemption made room on for this pod."),
    Column("Readiness Gates", priority=1, description="Readiness gates that are true, of all declared."),
    Column("GPUs", type="integer", priority=1, description="nvidia.com/gpu the pod requests."),
)


# --- workloads -----------------------------------------------------------------------------

_CONTAINERS_COLUMN = Column("Containers", priority=1, description="Names of each container in the template.")
_IMAGES_COLUMN = Column(
    "Images", priority=1, description="Images referenced by each container in the template."
)
_SELECTOR_COLUMN = Column("Selector", priority=1, description="Label selector of the pods it manages.")


def _desired_replicas(obj: Obj) -> int:
    # An unset spec.replicas is defaulted to 1 on create; stay right for objects that skipped it.
    return _int(_spec(obj).get("replicas"), 1)


def _deployment_row(obj: Obj, now: float) -> list[Any]:
    status = _status(obj)
    names, images = _containers_cells(_template_spec(obj))
    return [
        _name(obj),
        f"{_int(status.get('readyReplicas'))}/{_desired_replicas(obj)}",
        _int(status.get("updatedReplicas")),
        _int(status.get("availableReplicas")),
        age_cell(obj, now),
        names,
        images,
        format_label_selector(_spec(obj).get("selector")),
    ]


_DEPLOYMENT_COLUMNS = (
    NAME_COLUMN,
    Column("Ready", description="Number of the pod with ready state"),
    Column("Up-to-date", type="integer", description="Total number of pods running the latest template."),
    Column(
        "Available", type="integer", description="Total number of available pods (ready for minReadySeconds)."
    ),
    AGE_COLUMN,
    _CONTAINERS_COLUMN,
    _IMAGES_COLUMN,
    _SELECTOR_COLUMN,
)


def _replicaset_row(obj: Obj, now: float) -> list[Any]:
    status = _status(obj)
    names, images = _containers_cells(_template_spec(obj))
    return [
        _name(obj),
        _desired_replicas(obj),
        _int(status.get("replicas")),
        _int(status.get("readyReplicas")),
        age_cell(obj, now),
        names,
        images,
        format_label_selector(_spec(obj).get("selector")),
    ]


_REPLICASET_COLUMNS = (
    NAME_COLUMN,
    Column("Desired", type="integer", description="Number of desired pods."),
    Column("Current", type="integer", description="The most recently observed number of replicas."),
    Column(
        "Ready",
        type="integer",
        description="The number of pods targeted by this ReplicaSet with a Ready Condition.",
    ),
    AGE_COLUMN,
    _CONTAINERS_COLUMN,
    _IMAGES_COLUMN,
    _SELECTOR_COLUMN,
)


def job_status(obj: Obj) -> str:
    conds = _status(obj).get("conditions")
    if _true_condition(conds, "Complete"):
        return "Complete"
    if _true_condition(conds, "Failed"):
        return "Failed"
    if _meta(obj).get("deletionTimestamp"):
        return "Terminating"
    if _true_condition(conds, "Suspended"):
        return "Suspended"
    if _true_condition(conds, "FailureTarget"):
        return "FailureTarget"
    return "Running"


def _job_row(obj: Obj, now: float) -> list[Any]:
    spec, status = _spec(obj), _status(obj)
    succeeded = _int(status.get("succeeded"))
    if spec.get("completions") is not None:
        completions = f"{succeeded}/{_int(spec.get('completions'))}"
    elif _int(spec.get("parallelism")) > 1:
        completions = f"{succeeded}/1 of {_int(spec.get('parallelism'))}"
    else:
        completions = f"{succeeded}/1"
    start, end = _ts(status.get("startTime")), _ts(status.get("completionTime"))
    if start is None:
        duration = ""
    elif end is None:
        duration = human_duration(now - start)
    else:
        duration = human_duration(end - start)
    names, images = _containers_cells(_template_spec(obj))
    return [
        _name(obj),
        job_status(obj),
        completions,
        duration,
        age_cell(obj, now),
        names,
        images,
        format_label_selector(spec.get("selector")),
    ]


_JOB_COLUMNS = (
    NAME_COLUMN,
    Column("Status", description="Status of the job."),
    Column("Completions", description="The number of pods which reached phase Succeeded, of those wanted."),
    Column("Duration", description="Time required to complete the job."),
    AGE_COLUMN,
    _CONTAINERS_COLUMN,
    _IMAGES_COLUMN,
    _SELECTOR_COLUMN,
)


# --- Node ----------------------------------------------------------------------------------


def node_status(obj: Obj) -> str:
    status: list[str] = []
    for c in _status(obj).get("conditions") or []:
        if c.get("type") == "Ready":
            status = ["Ready" if c.get("status") == "True" else "NotReady"]
    if not status:
        status = ["Unknown"]
    if _spec(obj).get("unschedulable"):
        status.append("SchedulingDisabled")
    return ",".join(status)


def node_roles(obj: Obj) -> str:
    roles: set[str] = set()
    for key, value in (_meta(obj).get("labels") or {}).items():
        if key.startswith(_NODE_ROLE_PREFIX):
            role = key[len(_NODE_ROLE_PREFIX) :]
            if role:
                roles.add(role)
        elif key == _NODE_ROLE_LABEL and value:
            roles.add(value)
    return ",".join(sorted(roles)) or "<none>"


def _node_address(obj: Obj, kind: str) -> str:
    for a in _status(obj).get("addresses") or []:
        if a.get("type") == kind:
            return a.get("address", "")
    return "<none>"


def _node_row(obj: Obj, now: float) -> list[Any]:
    status = _status(obj)
    info = status.get("nodeInfo") or {}
    labels = _meta(obj).get("labels") or {}
    return [
        _name(obj),
        node_status(obj),
        node_roles(obj),
        age_cell(obj, now),
        info.get("kubeletVersion", ""),
        _node_address(obj, "InternalIP"),
        _node_address(obj, "ExternalIP"),
        info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
        _count((status.get("allocatable") or {}).get(GPU_RESOURCE)),
        labels.get(GPU_PRODUCT_LABEL) or "<none>",
    ]


_NODE_COLUMNS = (
    NAME_COLUMN,
    Column("Status", description="The status of the node"),
    Column("Roles", description="The roles of the node"),
    AGE_COLUMN,
    Column("Version", description="Kubelet Version reported by the node."),
    Column("Internal-IP", priority=1, description="The node's first InternalIP address."),
    Column("External-IP", priority=1, description="The node's first ExternalIP address."),
    Column("OS-Image", priority=1, description="OS Image reported by the node from /etc/os-release."),
    Column("Kernel-Version", priority=1, description="Kernel Version reported by the node from 'uname -r'."),
    Column("Container-Runtime", priority=1, description="ContainerRuntime Version reported by the node."),
    # The GPU columns come after Kubernetes' own, so scripts that pick `get nodes [-o wide]`
    # columns by position read the same fields as on a real cluster.
    Column("GPUs", type="integer", description="Allocatable nvidia.com/gpu on the node."),
    Column("GPU Model", priority=1, description="The node's GPU product (label nvidia.com/gpu.product)."),
)


# --- core kinds ----------------------------------------------------------------------------


def _namespace_row(obj: Obj, now: float) -> list[Any]:
    return [_name(obj), _status(obj).get("phase", ""), age_cell(obj, now)]


_NAMESPACE_COLUMNS = (NAME_COLUMN, Column("Status", description="The status of the namespace"), AGE_COLUMN)


def _service_external_ip(spec: dict[str, Any], status: dict[str, Any]) -> str:
    svc_type = spec.get("type") or "ClusterIP"
    external = spec.get("externalIPs") or []
    if svc_type in ("ClusterIP", "NodePort"):
        return ",".join(external) if external else "<none>"
    if svc_type == "LoadBalancer":
        ingress = set()
        for ing in (status.get("loadBalancer") or {}).get("ingress") or []:
            if ing.get("ip"):
                ingress.add(ing["ip"])
            elif ing.get("hostname"):
                ingress.add(ing["hostname"])
        lb = sorted(ingress)
        if external:
            return ",".join([*lb, *external])
        return ",".join(lb) if lb else "<pending>"
    if svc_type == "ExternalName":
        return spec.get("externalName", "")
    return "<unknown>"


def service_ports(ports: list[dict[str, Any]] | None) -> str:
    pieces = []
    for p in ports or []:
        proto = p.get("protocol") or "TCP"
        if _int(p.get("nodePort")) > 0:
            pieces.append(f"{p.get('port')}:{p.get('nodePort')}/{proto}")
        else:
            pieces.append(f"{p.get('port')}/{proto}")
    return ",".join(pieces) or "<none>"


def _service_row(obj: Obj, now: float) -> list[Any]:
    spec = _spec(obj)
    cluster_ips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
    return [
        _name(obj),
        spec.get("type") or "ClusterIP",
        cluster_ips[0] if cluster_ips else "<none>",
        _service_external_ip(spec, _status(obj)),
        service_ports(spec.get("ports")),
        age_cell(obj, now),
        _format_labels(spec.get("selector")),
    ]


_SERVICE_COLUMNS = (
    NAME_COLUMN,
    Column("Type", description="How the Service is exposed."),
    Column("Cluster-IP", description="The IP address of the service inside the cluster."),
    Column("External-IP", description="Addresses the service is reachable on from outside the cluster."),
    Column("Port(s)", description="The list of ports that are exposed by this service."),
    AGE_COLUMN,
    Column(
        "Selector",
        priority=1,
        description="Route service traffic to pods with label keys and values matching this selector.",
    ),
)


def format_endpoints(subsets: list[dict[str, Any]] | None) -> str:
    """kube-apiserver's formatEndpoints: the first three host:port pairs, then " + N more..."."""
    if not subsets:
        return "<none>"
    listed: list[str] = []
    limit = 3
    more = False
    count = 0
    for ss in subsets:
        addresses = ss.get("addresses") or []
        ports = ss.get("ports") or []
        if not ports:
            count += len(addresses)
            for a in addresses:
                if len(listed) == limit:
                    more = True
                    break
                listed.append(a.get("ip", ""))
            continue
        for port in ports:
            count += len(addresses)
            for a in addresses:
                if len(listed) == limit:
                    more = True
                    break
                ip = a.get("ip", "")
                host = f"[{ip}]" if ":" in ip else ip
                listed.append(f"{host}:{port.get('port')}")
    text = ",".join(listed)
    return f"{text} + {count - limit} more..." if more else text


def _endpoints_row(obj: Obj, now: float) -> list[Any]:
    return [_name(obj), format_endpoints(obj.get("subsets")), age_cell(obj, now)]


_ENDPOINTS_COLUMNS = (
    NAME_COLUMN,
    Column("Endpoints", description="The set of all endpoints is the union of all subsets."),
    AGE_COLUMN,
)


def _event_source(obj: Obj) -> str:
    source = obj.get("source") or {}
    component = (
        source.get("component") or obj.get("reportingComponent") or obj.get("reportingController") or ""
    )
    instance = source.get("host") or obj.get("reportingInstance") or ""
    return f"{component}, {instance}" if instance else component


def _event_row(obj: Obj, now: float) -> list[Any]:
    first = since(obj.get("firstTimestamp"), now)
    if not obj.get("firstTimestamp"):
        first = since(obj.get("eventTime"), now)
    last = since(obj.get("lastTimestamp"), now) if obj.get("lastTimestamp") else first
    count = _int(obj.get("count"))
    series = obj.get("series")
    if series:
        last = since(series.get("lastObservedTime"), now)
        count = _int(series.get("count"))
    elif count == 0:
        count = 1
    involved = obj.get("involvedObject") or obj.get("regarding") or {}
    kind = (involved.get("kind") or "").lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    return [
        last,
        obj.get("type", ""),
        obj.get("reason", ""),
        target,
        involved.get("fieldPath", ""),
        _event_source(obj),
        (obj.get("message") or obj.get("note") or "").strip(),
        first,
        count,
        _name(obj),
    ]


_EVENT_COLUMNS = (
    Column(
        "Last Seen", description="The time at which the most recent occurrence of this event was recorded."
    ),
    Column("Type", description="Type of this event (Normal, Warning)."),
    Column(
        "Reason",
        description="A short, machine understandable string that gives the reason for the transition.",
    ),
    Column("Object", description="The object that this event is about."),
    Column("Subobject", priority=1, description="The field of the object this event is about, if any."),
    Column("Source", priority=1, description="The component reporting this event."),
    Column("Message", description="A human-readable description of the status of this operation."),
    Column("First Seen", priority=1, description="The time at which the event was first recorded."),
    Column("Count", type="integer", priority=1, description="The number of times this event has occurred."),
    Column("Name", format="name", priority=1, description=NAME_COLUMN.description),
)


def _resource_quota_row(obj: Obj, now: float) -> list[Any]:
    status = _status(obj)
    hard = status.get("hard") or _spec(obj).get("hard") or {}
    used = status.get("used") or {}
    requests, limits = [], []
    for resource in sorted(hard):
        piece = f"{resource}: {_quantity(used.get(resource))}/{_quantity(hard[resource])}"
        parts = resource.split(".")
        (limits if len(parts) > 1 and parts[0] == "limits" else requests).append(piece)
    return [_name(obj), ", ".join(requests), ", ".join(limits), age_cell(obj, now)]


_RESOURCE_QUOTA_COLUMNS = (
    NAME_COLUMN,
    Column(
        "Request",
        description="Request represents a minimum amount of cpu/memory that a container may consume.",
    ),
    Column(
        "Limit",
        description="Limits control the maximum amount of cpu/memory that a container may use independent of "
        "contention on the node.",
    ),
    AGE_COLUMN,
)


def _limit_range_row(obj: Obj, now: float) -> list[Any]:
    t = _ts(_meta(obj).get("creationTimestamp"))
    return [_name(obj), rfc3339(t) if t is not None else ""]


_LIMIT_RANGE_COLUMNS = (
    NAME_COLUMN,
    Column("Created At", type="date", description=AGE_COLUMN.description),
)


def _config_map_row(obj: Obj, now: float) -> list[Any]:
    return [_name(obj), len(obj.get("data") or {}) + len(obj.get("binaryData") or {}), age_cell(obj, now)]


_CONFIG_MAP_COLUMNS = (
    NAME_COLUMN,
    Column("Data", type="integer", description="Number of data keys."),
    AGE_COLUMN,
)


def _secret_row(obj: Obj, now: float) -> list[Any]:
    # stringData is merged into data on write; count it here too in case a writer kept it.
    keys = set(obj.get("data") or {}) | set(obj.get("stringData") or {})
    return [_name(obj), obj.get("type") or "Opaque", len(keys), age_cell(obj, now)]


_SECRET_COLUMNS = (
    NAME_COLUMN,
    Column("Type", description="Used to facilitate programmatic handling of secret data."),
    Column("Data", type="integer", description="Number of data keys."),
    AGE_COLUMN,
)


def _service_account_row(obj: Obj, now: float) -> list[Any]:
    return [_name(obj), len(obj.get("secrets") or []), age_cell(obj, now)]


_SERVICE_ACCOUNT_COLUMNS = (
    NAME_COLUMN,
    Column("Secrets", type="integer", description="Number of secrets this service account may use."),
    AGE_COLUMN,
)


# --- other groups --------------------------------------------------------------------------


def _priority_class_row(obj: Obj, now: float) -> list[Any]:
    return [
        _name(obj),
        _int(obj.get("value")),
        bool(obj.get("globalDefault")),
        age_cell(obj, now),
        obj.get("preemptionPolicy") or "",
    ]


_PRIORITY_CLASS_COLUMNS = (
    NAME_COLUMN,
    Column("Value", type="integer", description="The priority pods of this class get."),
    Column(
        "Global-Default", type="boolean", description="Whether pods without a priorityClassName get this one."
    ),
    AGE_COLUMN,
    Column("PreemptionPolicy", description="Whether pods of this class may preempt lower-priority pods."),
)


def _lease_row(obj: Obj, now: float) -> list[Any]:
    return [_name(obj), _spec(obj).get("holderIdentity") or "", age_cell(obj, now)]


_LEASE_COLUMNS = (
    NAME_COLUMN,
    Column("Holder", description="The identity of the holder of the current lease."),
    AGE_COLUMN,
)


def _metric_value(value: Any) -> str:
    return "<unknown>" if value is None else str(value)


def _hpa_target(i: int, spec: dict[str, Any], statuses: list[dict[str, Any]]) -> str:
    mtype = spec.get("type")
    status = statuses[i] if i < len(statuses) else {}
    if mtype in ("Resource", "ContainerResource"):
        key = "resource" if mtype == "Resource" else "containerResource"
        source = spec.get(key) or {}
        target = source.get("target") or {}
        current = (status.get(key) or {}).get("current") or {}
        name = source.get("name", "")
        if target.get("averageValue") is not None:
            return f"{name}: {_metric_value(current.get('averageValue'))}/{target['averageValue']}"
        cur = "<unknown>"
        if current.get("averageUtilization") is not None:
            cur = f"{_int(current['averageUtilization'])}%"
        tgt = "<auto>"
        if target.get("averageUtilization") is not None:
            tgt = f"{_int(target['averageUtilization'])}%"
        return f"{name}: {cur}/{tgt}"
    if mtype == "Pods":
        target = (spec.get("pods") or {}).get("target") or {}
        current = ((status.get("pods") or {}).get("current")) or {}
        return f"{_metric_value(current.get('averageValue'))}/{target.get('averageValue')}"
    if mtype in ("Object", "External"):
        key = "object" if mtype == "Object" else "external"
        target = (spec.get(key) or {}).get("target") or {}
        current = ((status.get(key) or {}).get("current")) or {}
        if target.get("averageValue") is not None:
            return f"{_metric_value(current.get('averageValue'))}/{target['averageValue']} (avg)"
        return f"{_metric_value(current.get('value'))}/{target.get('value')}"
    return "<unknown type>"


def format_hpa_targets(specs: list[dict[str, Any]] | None, statuses: list[dict[str, Any]] | None) -> str:
    if not specs:
        return "<none>"
    listed = [_hpa_target(i, s, statuses or []) for i, s in enumerate(specs)]
    limit = 2
    if len(listed) > limit:
        return f"{', '.join(listed[:limit])} + {len(listed) - limit} more..."
    return ", ".join(listed)


def _hpa_row(obj: Obj, now: float) -> list[Any]:
    spec, status = _spec(obj), _status(obj)
    ref = spec.get("scaleTargetRef") or {}
    min_pods = "<unset>" if spec.get("minReplicas") is None else str(_int(spec.get("minReplicas")))
    return [
        _name(obj),
        f"{ref.get('kind', '')}/{ref.get('name', '')}",
        format_hpa_targets(spec.get("metrics"), status.get("currentMetrics")),
        min_pods,
        _int(spec.get("maxReplicas")),
        _int(status.get("currentReplicas")),
        age_cell(obj, now),
    ]


_HPA_COLUMNS = (
    NAME_COLUMN,
    Column("Reference", description="The target resource that is scaled."),
    Column("Targets", description="Current and target values of the metrics the autoscaler follows."),
    Column("MinPods", description="The lower limit for the number of replicas."),
    Column("MaxPods", type="integer", description="The upper limit for the number of replicas."),
    Column(
        "Replicas",
        type="integer",
        description="Current number of replicas of pods managed by this autoscaler.",
    ),
    AGE_COLUMN,
)


def _pdb_row(obj: Obj, now: float) -> list[Any]:
    spec = _spec(obj)
    return [
        _name(obj),
        _int_or_string(spec.get("minAvailable")),
        _int_or_string(spec.get("maxUnavailable")),
        _int(_status(obj).get("disruptionsAllowed")),
        age_cell(obj, now),
    ]


_PDB_COLUMNS = (
    NAME_COLUMN,
    Column("Min Available", description="The minimum number of pods that must be available."),
    Column("Max Unavailable", description="The maximum number of pods that may be unavailable."),
    Column(
        "Allowed Disruptions",
        type="integer",
        description="Calculated number of pods that may be disrupted at this time.",
    ),
    AGE_COLUMN,
)


def _rbac_subjects(obj: Obj) -> tuple[str, str, str]:
    """rbac.SubjectsStrings: users, groups and service accounts (namespace/name), comma-joined."""
    users: list[str] = []
    groups: list[str] = []
    sas: list[str] = []
    for subject in obj.get("subjects") or []:
        name = subject.get("name") or ""
        kind = subject.get("kind")
        if kind == "User":
            users.append(name)
        elif kind == "Group":
            groups.append(name)
        elif kind == "ServiceAccount":
            ns = subject.get("namespace")
            sas.append(f"{ns}/{name}" if ns else name)
    return ", ".join(users), ", ".join(groups), ", ".join(sas)


def _role_binding_row(obj: Obj, now: float) -> list[Any]:
    ref = obj.get("roleRef") or {}
    return [_name(obj), f"{ref.get('kind', '')}/{ref.get('name', '')}", age_cell(obj, now), *_rbac_subjects(obj)]


_ROLE_BINDING_COLUMNS = (
    NAME_COLUMN,
    Column("Role", description="RoleRef can reference a Role in the current namespace or a ClusterRole in the "
                               "global namespace."),
    AGE_COLUMN,
    Column("Users", priority=1, description="Users in the binding."),
    Column("Groups", priority=1, description="Groups in the binding."),
    Column("ServiceAccounts", priority=1, description="ServiceAccounts in the binding."),
)


# --- storage -------------------------------------------------------------------------------


def _storage_text(resources: Any) -> str:
    value = (resources or {}).get("storage") if isinstance(resources, dict) else None
    return "" if value is None else str(value)


def _pv_row(obj: Obj, now: float) -> list[Any]:
    spec, status = _spec(obj), _status(obj)
    ref = spec.get("claimRef")
    claim = f"{ref.get('namespace') or ''}/{ref.get('name') or ''}" if isinstance(ref, dict) else ""
    phase = "Terminating" if _meta(obj).get("deletionTimestamp") else status.get("phase") or ""
    return [
        _name(obj),
        _storage_text(spec.get("capacity")),
        storage.access_modes_text(spec.get("accessModes")),
        spec.get("persistentVolumeReclaimPolicy") or "",
        phase,
        claim,
        storage.volume_class(obj),
        spec.get("volumeAttributesClassName") or "<unset>",
        status.get("reason") or "",
        age_cell(obj, now),
        spec.get("volumeMode") or "<unset>",
    ]


_PV_COLUMNS = (
    NAME_COLUMN,
    Column("Capacity", description="capacity is the description of the persistent volume's resources and "
                                   "capacity."),
    Column("Access Modes", description="accessModes contains all ways the volume can be mounted."),
    Column("Reclaim Policy", description="persistentVolumeReclaimPolicy defines what happens to a persistent "
                                         "volume when released from its claim."),
    Column("Status", description="phase indicates if a volume is available, bound to a claim, or released by "
                                 "a claim."),
    Column("Claim", description="claimRef is part of a bi-directional binding between PersistentVolume and "
                                "PersistentVolumeClaim."),
    Column("StorageClass", description="StorageClass of the pv"),
    Column("VolumeAttributesClass", description="VolumeAttributesClass of the pv"),
    Column("Reason", description="reason is a brief CamelCase string that describes any failure and is meant "
                                 "for machine parsing and tidy display in the CLI."),
    AGE_COLUMN,
    Column("VolumeMode", priority=1, description="volumeMode defines if a volume is intended to be used with a "
                                                 "formatted filesystem or to remain in raw block state."),
)


def _pvc_row(obj: Obj, now: float) -> list[Any]:
    spec, status = _spec(obj), _status(obj)
    phase = "Terminating" if _meta(obj).get("deletionTimestamp") else status.get("phase") or ""
    capacity = modes = ""
    if spec.get("volumeName"):
        capacity = _storage_text(status.get("capacity"))
        modes = storage.access_modes_text(status.get("accessModes"))
    return [
        _name(obj),
        phase,
        spec.get("volumeName") or "",
        capacity,
        modes,
        storage.claim_class(obj),
        spec.get("volumeAttributesClassName") or "<unset>",
        age_cell(obj, now),
        spec.get("volumeMode") or "<unset>",
    ]


_PVC_COLUMNS = (
    NAME_COLUMN,
    Column("Status", description="phase represents the current phase of PersistentVolumeClaim."),
    Column("Volume", description="volumeName is the binding reference to the PersistentVolume backing this "
                                 "claim."),
    Column("Capacity", description="capacity represents the actual resources of the underlying volume."),
    Column("Access Modes", description="accessModes contains the actual access modes the volume backing the PVC "
                                       "has."),
    Column("StorageClass", description="StorageClass of the pvc"),
    Column("VolumeAttributesClass", description="VolumeAttributesClass of the pvc"),
    AGE_COLUMN,
    Column("VolumeMode", priority=1, description="volumeMode defines what type of volume is required by the "
                                                 "claim."),
)


def _storage_class_row(obj: Obj, now: float) -> list[Any]:
    name = _name(obj) + (" (default)" if storage.is_default_class(obj) else "")
    return [
        name,
        obj.get("provisioner") or "",
        obj.get("reclaimPolicy") or "Delete",
        obj.get("volumeBindingMode") or "Immediate",
        bool(obj.get("allowVolumeExpansion")),
        age_cell(obj, now),
    ]


_STORAGE_CLASS_COLUMNS = (
    NAME_COLUMN,
    Column("Provisioner", description="provisioner indicates the type of the provisioner."),
    Column("ReclaimPolicy", description="reclaimPolicy controls the reclaimPolicy for dynamically provisioned "
                                        "PersistentVolumes of this storage class."),
    Column("VolumeBindingMode", description="volumeBindingMode indicates how PersistentVolumeClaims should be "
                                            "provisioned and bound."),
    Column("AllowVolumeExpansion", description="allowVolumeExpansion shows whether the storage class allow "
                                               "volume expand."),
    AGE_COLUMN,
)


def _default_row(obj: Obj, now: float) -> list[Any]:
    return [_name(obj), age_cell(obj, now)]


_DEFAULT_PRINTER = Printer((NAME_COLUMN, AGE_COLUMN), _default_row)

for _group, _kind, _columns, _row in (
    ("", "Pod", _POD_COLUMNS, _pod_row),
    ("", "Node", _NODE_COLUMNS, _node_row),
    ("", "Namespace", _NAMESPACE_COLUMNS, _namespace_row),
    ("", "Service", _SERVICE_COLUMNS, _service_row),
    ("", "Endpoints", _ENDPOINTS_COLUMNS, _endpoints_row),
    ("", "Event", _EVENT_COLUMNS, _event_row),
    ("", "ResourceQuota", _RESOURCE_QUOTA_COLUMNS, _resource_quota_row),
    ("", "LimitRange", _LIMIT_RANGE_COLUMNS, _limit_range_row),
    ("", "ConfigMap", _CONFIG_MAP_COLUMNS, _config_map_row),
    ("", "Secret", _SECRET_COLUMNS, _secret_row),
    ("", "ServiceAccount", _SERVICE_ACCOUNT_COLUMNS, _service_account_row),
    ("", "PersistentVolume", _PV_COLUMNS, _pv_row),
    ("", "PersistentVolumeClaim", _PVC_COLUMNS, _pvc_row),
    ("storage.k8s.io", "StorageClass", _STORAGE_CLASS_COLUMNS, _storage_class_row),
    ("apps", "Deployment", _DEPLOYMENT_COLUMNS, _deployment_row),
    ("apps", "ReplicaSet", _REPLICASET_COLUMNS, _replicaset_row),
    ("batch", "Job", _JOB_COLUMNS, _job_row),
    ("autoscaling", "HorizontalPodAutoscaler", _HPA_COLUMNS, _hpa_row),
    ("scheduling.k8s.io", "PriorityClass", _PRIORITY_CLASS_COLUMNS, _priority_class_row),
    ("coordination.k8s.io", "Lease", _LEASE_COLUMNS, _lease_row),
    ("policy", "PodDisruptionBudget", _PDB_COLUMNS, _pdb_row),
    ("rbac.authorization.k8s.io", "Role", _LIMIT_RANGE_COLUMNS, _limit_range_row),
    ("rbac.authorization.k8s.io", "ClusterRole", _LIMIT_RANGE_COLUMNS, _limit_range_row),
    ("rbac.authorization.k8s.io", "RoleBinding", _ROLE_BINDING_COLUMNS, _role_binding_row),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding", _ROLE_BINDING_COLUMNS, _role_binding_row),
):
    register_printer(_kind, _columns, _row, group=_group)


def _podgroup_row(obj: Obj, now: float) -> list[Any]:
    from gpufleet.api import podgroup

    return [_name(obj), *podgroup.printer_cells(obj), age_cell(obj, now)]


def _register_podgroup_printer() -> None:
    from gpufleet.api import podgroup

    columns = (NAME_COLUMN, *(Column(**c) for c in podgroup.PRINTER_COLUMNS), AGE_COLUMN)
    register_printer("PodGroup", columns, _podgroup_row, group=podgroup.GROUP)


_register_podgroup_printer()


def _pytorchjob_row(obj: Obj, now: float) -> list[Any]:
    from gpufleet.api import kubeflow

    return [_name(obj), *kubeflow.printer_cells(obj), age_cell(obj, now)]


def _register_pytorchjob_printer() -> None:
    from gpufleet.api import kubeflow

    columns = (NAME_COLUMN, *(Column(**c) for c in kubeflow.PRINTER_COLUMNS), AGE_COLUMN)
    register_printer(kubeflow.KIND, columns, _pytorchjob_row, group=kubeflow.GROUP)


_register_pytorchjob_printer()


# --- the Table -----------------------------------------------------------------------------

INCLUDE_OBJECT = ("None", "Metadata", "Object")


def _row_object(rt: ResourceType, obj: Obj, include_object: str) -> dict[str, Any] | None:
    if include_object == "None":
        return None
    if include_object == "Object":
        return {"apiVersion": rt.api_version, "kind": rt.kind, **obj}
    # managedFields can dwarf the rest of the row and no Table reader uses them.
    meta = {k: v for k, v in _meta(obj).items() if k != "managedFields"}
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}


def _row(rt: ResourceType, printer: Printer, obj: Obj, now: float, include_object: str) -> dict[str, Any]:
    row: dict[str, Any] = {"cells": printer.row(obj, now)}
    if rt.group == "" and rt.kind == "Pod":
        phase = _status(obj).get("phase")
        if phase == "Succeeded":
            row["conditions"] = _POD_SUCCEEDED_CONDITIONS
        elif phase == "Failed":
            row["conditions"] = _POD_FAILED_CONDITIONS
    ro = _row_object(rt, obj, include_object)
    if ro is not None:
        row["object"] = ro
    return row


def to_table(
    rt: ResourceType,
    objects: Iterable[Obj],
    *,
    resource_version: str,
    continue_token: str | None = None,
    now: float,
    include_object: str = "Metadata",
    include_columns: bool = True,
) -> dict[str, Any]:
    """The `meta.k8s.io/v1` Table of `objects` (all of kind `rt`), as kubectl's `get` wants it.

    include_object is the `includeObject` query parameter: "Metadata" (kubectl's default:
    PartialObjectMetadata, which carries the namespace and labels kubectl prints for -A and
    --show-labels), "Object" (the whole object) or "None".
    """
    if include_object not in INCLUDE_OBJECT:
        raise ValueError(f"includeObject must be one of {', '.join(INCLUDE_OBJECT)}, not {include_object!r}")
    printer = printer_for(rt)
    metadata: dict[str, Any] = {"resourceVersion": resource_version}
    if continue_token:
        metadata["continue"] = continue_token
    table: dict[str, Any] = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata}
    if include_columns:
        table["columnDefinitions"] = [c.to_dict() for c in printer.columns]
    table["rows"] = [_row(rt, printer, o, now, include_object) for o in objects]
    return table


def watch_event_table(
    rt: ResourceType,
    obj: Obj,
    *,
    now: float,
    include_object: str = "Metadata",
    include_columns: bool = True,
) -> dict[str, Any]:
    """The one-row Table that is the `object` of a watch event for `kubectl get -w`.

    kubectl takes its header from the list that preceded the watch and accepts the column
    definitions in every event or in none; they are sent by default.
    """
    return to_table(
        rt,
        [obj],
        resource_version=str(_meta(obj).get("resourceVersion", "")),
        now=now,
        include_object=include_object,
        include_columns=include_columns,
    )
