"""Server-side printing: the `meta.k8s.io/v1` Table that `kubectl get` asks for.

kubectl sends `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` on every `get` and prints
whatever columns the server returns; without a Table it can only show NAME and AGE. The
columns and cell rules follow kube-apiserver's printers (pkg/printers/internalversion), so
`kubectl get` reads the same here as on a real cluster. Like kube-apiserver, every cell of
every column is always computed: kubectl itself hides the priority>0 columns unless `-o wide`.

Kinds added later (PyTorchJob, PodGroup, Kueue queues) call `register_printer`; any other
kind gets Name and Age, which is what a CRD without additionalPrinterColumns shows.

The machinery (Column, the printer registry, durations, the Table) is in `core`; the per-kind
printers are in `pods`, `workloads`, `corekinds`, `cluster` and `ml`.
"""

from __future__ import annotations

from gpufleet.apiserver.tables import apps as _apps  # noqa: F401  (StatefulSet, DaemonSet, ControllerRevision)
from gpufleet.apiserver.tables import cronjob as _cronjob  # noqa: F401  (registers the CronJob printer)
from gpufleet.apiserver.tables import ml as _ml  # noqa: F401  (registers the ML kinds' printers)
from gpufleet.apiserver.tables import networking as _networking  # noqa: F401  (Ingress, NetworkPolicy)
from gpufleet.apiserver.tables.cluster import (
    _HPA_COLUMNS,
    _LEASE_COLUMNS,
    _NODE_COLUMNS,
    _PDB_COLUMNS,
    _PRIORITY_CLASS_COLUMNS,
    _PV_COLUMNS,
    _PVC_COLUMNS,
    _ROLE_BINDING_COLUMNS,
    _STORAGE_CLASS_COLUMNS,
    _hpa_row,
    _lease_row,
    _node_row,
    _pdb_row,
    _priority_class_row,
    _pv_row,
    _pvc_row,
    _role_binding_row,
    _storage_class_row,
    format_hpa_targets,
    node_roles,
    node_status,
)
from gpufleet.apiserver.tables.core import (
    _PRINTERS,
    AGE_COLUMN,
    INCLUDE_OBJECT,
    NAME_COLUMN,
    Column,
    Obj,
    Printer,
    RowFn,
    age_cell,
    format_label_selector,
    human_duration,
    printer_for,
    register_printer,
    since,
    to_table,
    watch_event_table,
)
from gpufleet.apiserver.tables.corekinds import (
    _CONFIG_MAP_COLUMNS,
    _ENDPOINTS_COLUMNS,
    _EVENT_COLUMNS,
    _LIMIT_RANGE_COLUMNS,
    _NAMESPACE_COLUMNS,
    _RESOURCE_QUOTA_COLUMNS,
    _SECRET_COLUMNS,
    _SERVICE_ACCOUNT_COLUMNS,
    _SERVICE_COLUMNS,
    _config_map_row,
    _endpoints_row,
    _event_row,
    _limit_range_row,
    _namespace_row,
    _resource_quota_row,
    _secret_row,
    _service_account_row,
    _service_row,
    format_endpoints,
    service_ports,
)
from gpufleet.apiserver.tables.pods import _POD_COLUMNS, _pod_row, pod_status
from gpufleet.apiserver.tables.workloads import (
    _DEPLOYMENT_COLUMNS,
    _JOB_COLUMNS,
    _REPLICASET_COLUMNS,
    _deployment_row,
    _job_row,
    _replicaset_row,
    job_status,
)

__all__ = [
    "AGE_COLUMN",
    "INCLUDE_OBJECT",
    "NAME_COLUMN",
    "Column",
    "Obj",
    "Printer",
    "RowFn",
    "_PRINTERS",
    "age_cell",
    "format_endpoints",
    "format_hpa_targets",
    "format_label_selector",
    "human_duration",
    "job_status",
    "node_roles",
    "node_status",
    "pod_status",
    "printer_for",
    "register_printer",
    "service_ports",
    "since",
    "to_table",
    "watch_event_table",
]

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

