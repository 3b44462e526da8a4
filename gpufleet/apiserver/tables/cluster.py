"""Printers for cluster kinds: Node, scheduling, coordination, autoscaling, policy, RBAC and
storage.
"""

from __future__ import annotations

from typing import Any

from gpufleet.api import storage
from gpufleet.api.gpu import GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpufleet.apiserver.tables.core import (
    AGE_COLUMN,
    NAME_COLUMN,
    Column,
    Obj,
    _count,
    _int,
    _int_or_string,
    _meta,
    _name,
    _spec,
    _status,
    age_cell,
)

_NODE_ROLE_PREFIX = "node-role.kubernetes.io/"
_NODE_ROLE_LABEL = "kubernetes.io/role"


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
