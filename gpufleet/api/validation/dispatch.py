"""Which validator runs for which kind, and the entry points the API server calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpufleet.api import k8s
from gpufleet.api.validation.apps import (
    _validate_controller_revision,
    _validate_controller_revision_update,
    _validate_daemon_set,
    _validate_daemon_set_update,
    _validate_stateful_set,
    _validate_stateful_set_update,
)
from gpufleet.api.validation.autoscaling import _validate_hpa, _validate_pdb
from gpufleet.api.validation.cluster import (
    _validate_config_map,
    _validate_config_map_update,
    _validate_endpoints,
    _validate_event,
    _validate_lease,
    _validate_namespace,
    _validate_node,
    _validate_priority_class,
    _validate_priority_class_update,
    _validate_secret,
    _validate_secret_update,
    _validate_service_account,
)
from gpufleet.api.validation.core import Errs, validate_object_meta, validate_object_meta_update
from gpufleet.api.validation.cronjob import _validate_cron_job
from gpufleet.api.validation.discovery import _validate_endpoint_slice, _validate_endpoint_slice_update
from gpufleet.api.validation.errors import FieldError
from gpufleet.api.validation.networking import (
    _validate_ingress,
    _validate_ingress_class,
    _validate_ingress_class_update,
    _validate_network_policy,
)
from gpufleet.api.validation.pods import _validate_pod, _validate_pod_update
from gpufleet.api.validation.quota import _validate_limit_range, _validate_resource_quota
from gpufleet.api.validation.services import _validate_service, _validate_service_update
from gpufleet.api.validation.storage import (
    _validate_pv,
    _validate_pv_update,
    _validate_pvc,
    _validate_pvc_update,
    _validate_storage_class,
    _validate_storage_class_update,
)
from gpufleet.api.validation.workloads import (
    _validate_deployment,
    _validate_job,
    _validate_job_update,
    _validate_replica_set,
    _validate_selector_immutable,
)

CreateFn = Callable[[Any, Errs], None]
UpdateFn = Callable[[Any, Any, Errs], None]

_CREATE: dict[type, CreateFn] = {
    k8s.Pod: _validate_pod,
    k8s.Deployment: _validate_deployment,
    k8s.ReplicaSet: _validate_replica_set,
    k8s.StatefulSet: _validate_stateful_set,
    k8s.DaemonSet: _validate_daemon_set,
    k8s.ControllerRevision: _validate_controller_revision,
    k8s.Job: _validate_job,
    k8s.CronJob: _validate_cron_job,
    k8s.Service: _validate_service,
    k8s.HorizontalPodAutoscaler: _validate_hpa,
    k8s.PodDisruptionBudget: _validate_pdb,
    k8s.ResourceQuota: _validate_resource_quota,
    k8s.LimitRange: _validate_limit_range,
    k8s.PriorityClass: _validate_priority_class,
    k8s.Namespace: _validate_namespace,
    k8s.Node: _validate_node,
    k8s.Lease: _validate_lease,
    k8s.Endpoints: _validate_endpoints,
    k8s.EndpointSlice: _validate_endpoint_slice,
    k8s.Event: _validate_event,
    k8s.ConfigMap: _validate_config_map,
    k8s.Secret: _validate_secret,
    k8s.ServiceAccount: _validate_service_account,
    k8s.PersistentVolume: _validate_pv,
    k8s.PersistentVolumeClaim: _validate_pvc,
    k8s.StorageClass: _validate_storage_class,
    k8s.Ingress: _validate_ingress,
    k8s.IngressClass: _validate_ingress_class,
    k8s.NetworkPolicy: _validate_network_policy,
}
_UPDATE: dict[type, UpdateFn] = {
    k8s.Pod: _validate_pod_update,
    k8s.Deployment: _validate_selector_immutable,
    k8s.ReplicaSet: _validate_selector_immutable,
    k8s.StatefulSet: _validate_stateful_set_update,
    k8s.DaemonSet: _validate_daemon_set_update,
    k8s.ControllerRevision: _validate_controller_revision_update,
    k8s.Job: _validate_job_update,
    k8s.Service: _validate_service_update,
    k8s.PriorityClass: _validate_priority_class_update,
    k8s.Secret: _validate_secret_update,
    k8s.ConfigMap: _validate_config_map_update,
    k8s.PersistentVolume: _validate_pv_update,
    k8s.PersistentVolumeClaim: _validate_pvc_update,
    k8s.StorageClass: _validate_storage_class_update,
    k8s.IngressClass: _validate_ingress_class_update,
    k8s.EndpointSlice: _validate_endpoint_slice_update,
}


def register_validator(model: type, create: CreateFn, update: UpdateFn | None = None) -> None:
    """Let kinds defined outside this module (PyTorchJob, PodGroup, queues) plug in."""
    _CREATE[model] = create
    if update is not None:
        _UPDATE[model] = update


def _lookup(table: dict[type, Any], obj: Any) -> Any:
    for cls in type(obj).__mro__:
        if cls in table:
            return table[cls]
    return None


def validate_create(obj: Any) -> list[FieldError]:
    """Every problem with a new object; an empty list means it may be stored."""
    errs: Errs = []
    fn = _lookup(_CREATE, obj)
    if fn is not None:
        fn(obj, errs)
    elif hasattr(obj, "metadata"):
        validate_object_meta(obj.metadata, errs)
    return errs


def validate_update(obj: Any, old: Any) -> list[FieldError]:
    """The create rules plus what may not change between ``old`` and ``obj``."""
    if type(obj) is not type(old):
        raise TypeError(f"cannot validate an update from {type(old).__name__} to {type(obj).__name__}")
    errs: Errs = []
    if hasattr(obj, "metadata"):
        validate_object_meta_update(obj.metadata, old.metadata, errs)
    errs.extend(validate_create(obj))
    fn = _lookup(_UPDATE, obj)
    if fn is not None:
        fn(obj, old, errs)
    return errs


def validate(obj: Any, old: Any = None) -> list[FieldError]:
    """``validate_create`` for a new object, ``validate_update`` when the stored one is given."""
    return validate_create(obj) if old is None else validate_update(obj, old)
