"""KubeRay's RayService (ray.io/v1): Ray Serve applications (``serveConfigV2``) served from
a RayCluster made from ``rayClusterConfig``, upgraded to a new cluster without downtime.

The shape is KubeRay's (ray-operator/apis/ray/v1 rayservice_types.go, v1.3 and later: the
status with ``serviceStatus``, ``activeServiceStatus`` / ``pendingServiceStatus`` and the
conditions Ready and UpgradeInProgress), so a manifest written for the KubeRay operator
applies unchanged. Importing this module registers the kind's defaulting and validation; the
table printer reads ``PRINTER_COLUMNS`` and ``printer_cells``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import yaml
from pydantic import Field

from gpufleet.api import defaults as d
from gpufleet.api import validation as v
from gpufleet.api.k8s import K8sModel, ListMeta, ObjectMeta, Service, Time
from gpufleet.api.ray import (
    API_VERSION,
    Condition,
    RayClusterSpec,
    RayClusterStatus,
    _default_cluster_spec,
    validate_cluster_spec,
)

KIND = "RayService"

# spec.upgradeStrategy.type (KubeRay's RayServiceUpgradeType). The incremental upgrade
# (Gateway API traffic shifting) is not served.
UPGRADE_NEW_CLUSTER = "NewCluster"
UPGRADE_NONE = "None"
UPGRADE_INCREMENTAL = "NewClusterWithIncrementalUpgrade"
UPGRADE_TYPES = (UPGRADE_NEW_CLUSTER, UPGRADE_NONE)

# status.serviceStatus: "Running" while the Ready condition is True, else empty.
SERVICE_RUNNING = "Running"
# Conditions (KubeRay's RayServiceConditionType) and their reasons.
READY = "Ready"
UPGRADE_IN_PROGRESS = "UpgradeInProgress"
REASON_INITIALIZING = "Initializing"
REASON_ZERO_ENDPOINTS = "ZeroServeEndpoints"
REASON_NONZERO_ENDPOINTS = "NonZeroServeEndpoints"
REASON_BOTH_CLUSTERS = "BothActivePendingClustersExist"
REASON_NO_PENDING = "NoPendingCluster"
REASON_NO_ACTIVE = "NoActiveCluster"

# Serve's application and deployment statuses (serve.proto).
APP_RUNNING = "RUNNING"
DEPLOYMENT_HEALTHY = "HEALTHY"

# The default delay before a RayCluster the RayService no longer uses is deleted.
DEFAULT_DELETION_DELAY_SECONDS = 60
# 63 - len("-serve-svc") - 6 (the "-xxxxx" of its clusters' names), as KubeRay.
MAX_NAME_LENGTH = 47


class ClusterUpgradeOptions(K8sModel):
    max_surge_percent: int | None = Field(default=None, alias="maxSurgePercent")
    step_size_percent: int | None = Field(default=None, alias="stepSizePercent")
    interval_seconds: int | None = Field(default=None, alias="intervalSeconds")
    gateway_class_name: str | None = Field(default=None, alias="gatewayClassName")


class RayServiceUpgradeStrategy(K8sModel):
    type: str | None = Field(default=None, description="NewCluster (the default: a new RayCluster, traffic "
                                                        "switched once it serves) or None (no new cluster).")
    cluster_upgrade_options: ClusterUpgradeOptions | None = Field(default=None, alias="clusterUpgradeOptions")


class RayServiceSpec(K8sModel):
    serve_config_v2: str | None = Field(
        default=None, alias="serveConfigV2",
        description="Ray Serve's config (applications, http_options, ...) as a YAML string, deployed through the "
                    "head's dashboard (PUT /api/serve/applications/).")
    ray_cluster_config: RayClusterSpec | None = Field(default=None, alias="rayClusterConfig",
                                                      description="The RayCluster the applications run on.")
    ray_cluster_deletion_delay_seconds: int | None = Field(
        default=None, alias="rayClusterDeletionDelaySeconds",
        description="How long a RayCluster the RayService no longer uses is kept before it is deleted (default 60).")
    service_unhealthy_second_threshold: int | None = Field(default=None, alias="serviceUnhealthySecondThreshold",
                                                           description="Deprecated upstream; not used.")
    deployment_unhealthy_second_threshold: int | None = Field(default=None,
                                                              alias="deploymentUnhealthySecondThreshold",
                                                              description="Deprecated upstream; not used.")
    serve_service: Service | None = Field(default=None, alias="serveService",
                                          description="A Service to use as the Serve Service (its selector is "
                                                      "replaced).")
    upgrade_strategy: RayServiceUpgradeStrategy | None = Field(default=None, alias="upgradeStrategy")
    exclude_head_pod_from_serve_svc: bool | None = Field(
        default=None, alias="excludeHeadPodFromServeSvc",
        description="Keep the head pod out of the Serve Service (its ray.io/serve label stays false).")
    suspend: bool | None = None
    managed_by: str | None = Field(default=None, alias="managedBy")


class ServeDeploymentStatus(K8sModel):
    status: str | None = None
    message: str | None = None


class AppStatus(K8sModel):
    serve_deployment_statuses: dict[str, ServeDeploymentStatus] | None = Field(default=None,
                                                                              alias="serveDeploymentStatuses")
    status: str | None = None
    message: str | None = None


class RayServiceStatus(K8sModel):
    application_statuses: dict[str, AppStatus] | None = Field(default=None, alias="applicationStatuses")
    target_capacity: int | None = Field(default=None, alias="targetCapacity")
    traffic_routed_percent: int | None = Field(default=None, alias="trafficRoutedPercent")
    last_traffic_migrated_time: Time | None = Field(default=None, alias="lastTrafficMigratedTime")
    ray_cluster_name: str | None = Field(default=None, alias="rayClusterName")
    ray_cluster_status: RayClusterStatus | None = Field(default=None, alias="rayClusterStatus")


class RayServiceStatuses(K8sModel):
    conditions: list[Condition] | None = None
    last_update_time: Time | None = Field(default=None, alias="lastUpdateTime")
    service_status: str | None = Field(default=None, alias="serviceStatus")
    active_service_status: RayServiceStatus | None = Field(default=None, alias="activeServiceStatus")
    pending_service_status: RayServiceStatus | None = Field(default=None, alias="pendingServiceStatus")
    num_serve_endpoints: int | None = Field(default=None, alias="numServeEndpoints")
    observed_generation: int | None = Field(default=None, alias="observedGeneration")


class RayService(K8sModel):
    """Ray Serve applications on a RayCluster, upgraded without downtime."""

    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = KIND

    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: RayServiceSpec | None = None
    status: RayServiceStatuses | None = None


class RayServiceList(K8sModel):
    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "RayServiceList"

    api_version: str | None = Field(default=None, alias="apiVersion")
    items: list[RayService]
    kind: str | None = None
    metadata: ListMeta | None = None


def upgrade_type(spec: RayServiceSpec | None) -> str:
    strategy = spec.upgrade_strategy if spec is not None else None
    return (strategy.type if strategy is not None else None) or UPGRADE_NEW_CLUSTER


def deletion_delay(spec: RayServiceSpec | None) -> int:
    value = spec.ray_cluster_deletion_delay_seconds if spec is not None else None
    return DEFAULT_DELETION_DELAY_SECONDS if value is None else value


def serve_config(text: str | None) -> dict[str, Any]:
    """serveConfigV2 parsed: a mapping (empty for no config). Raises ValueError when it is not."""
    if not text or not text.strip():
        return {}
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"not YAML: {e}".replace("\n", " ")) from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError("must be a YAML mapping (applications, http_options, ...)")
    return config


# -- defaulting ------------------------------------------------------------------------------


def _default(service: RayService) -> None:
    if service.spec is not None:
        _default_cluster_spec(service.spec.ray_cluster_config)


d.register_defaulter(RayService, _default)


# -- validation ------------------------------------------------------------------------------

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _validate(service: RayService, errs: list[v.FieldError]) -> None:
    v.validate_object_meta(service.metadata, errs)
    name = service.metadata.name if service.metadata is not None else None
    if name and len(name) > MAX_NAME_LENGTH:
        errs.append(v.invalid("metadata.name", name, f"must be no more than {MAX_NAME_LENGTH} characters (its "
                                                     "Services and RayClusters are named after it)"))
    elif name and not _DNS1035.match(name):
        errs.append(v.invalid("metadata.name", name, "a RayService name must be a DNS-1035 label (lower case "
                                                     "letters, digits and '-', starting with a letter)"))
    spec = service.spec
    if spec is None:
        errs.append(v.required("spec", "a rayClusterConfig and a serveConfigV2"))
        return
    validate_cluster_spec(spec.ray_cluster_config, "spec.rayClusterConfig", errs)
    head = spec.ray_cluster_config.head_group_spec if spec.ray_cluster_config is not None else None
    if head is not None and head.head_service and (head.head_service.get("metadata") or {}).get("name"):
        errs.append(v.forbidden("spec.rayClusterConfig.headGroupSpec.headService.metadata.name",
                                "must not be set: the head Service of a RayService is <name>-head-svc"))
    try:
        serve_config(spec.serve_config_v2)
    except ValueError as e:
        errs.append(v.invalid("spec.serveConfigV2", v.Unquoted("..."), str(e)))
    kind = spec.upgrade_strategy.type if spec.upgrade_strategy is not None else None
    if kind is not None and kind not in UPGRADE_TYPES:
        errs.append(v.not_supported("spec.upgradeStrategy.type", kind, UPGRADE_TYPES))
    delay = spec.ray_cluster_deletion_delay_seconds
    if delay is not None and delay < 0:
        errs.append(v.invalid("spec.rayClusterDeletionDelaySeconds", delay, "must be greater than or equal to 0"))


v.register_validator(RayService, _validate)


# -- printing ------------------------------------------------------------------------------

# KubeRay's printer columns (kubebuilder:printcolumn). Its CRD names its columns, so no Age
# column is added (apiextensions adds one only to a CRD that names none).
PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "service status", "type": "string", "description": "status.serviceStatus"},
    {"name": "num serve endpoints", "type": "string", "description": "status.numServeEndpoints"},
)


def printer_cells(obj: dict[str, Any]) -> list[Any]:
    st = obj.get("status") or {}
    n = st.get("numServeEndpoints")
    return [st.get("serviceStatus", ""), "" if n is None else str(n)]
