"""HorizontalPodAutoscaler as autoscaling/v1 serves it: one CPU-utilization target.

The objects are stored as autoscaling/v2 (gpufleet.api.k8s.HorizontalPodAutoscaler); this
version is a view of them, converted both ways by gpufleet.api.conversion. The shape is
upstream's (k8s.io/api/autoscaling/v1/types.go), so `kubectl autoscale` of kubectl 1.27-1.32
and the official client's AutoscalingV1Api read and write it unchanged.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from gpufleet.api.k8s import CrossVersionObjectReference, K8sModel, ListMeta, ObjectMeta, Time

GROUP = "autoscaling"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "HorizontalPodAutoscaler"


class HorizontalPodAutoscalerSpec(K8sModel):
    """Specification of a horizontal pod autoscaler (autoscaling/v1)."""

    scale_target_ref: CrossVersionObjectReference = Field(alias="scaleTargetRef")
    min_replicas: int | None = Field(default=None, alias="minReplicas")
    max_replicas: int = Field(alias="maxReplicas")
    target_cpu_utilization_percentage: int | None = Field(
        default=None, alias="targetCPUUtilizationPercentage",
        description="The target average CPU utilization over all the pods, as a percentage of the requested "
                    "CPU; if not given, the default autoscaling policy is used.")


class HorizontalPodAutoscalerStatus(K8sModel):
    """Current status of a horizontal pod autoscaler (autoscaling/v1)."""

    observed_generation: int | None = Field(default=None, alias="observedGeneration")
    last_scale_time: Time | None = Field(default=None, alias="lastScaleTime")
    current_replicas: int | None = Field(default=None, alias="currentReplicas")
    desired_replicas: int | None = Field(default=None, alias="desiredReplicas")
    current_cpu_utilization_percentage: int | None = Field(
        default=None, alias="currentCPUUtilizationPercentage",
        description="The current average CPU utilization over all the pods, as a percentage of the requested CPU.")


class HorizontalPodAutoscalerV1(K8sModel):
    """Configuration of a horizontal pod autoscaler (autoscaling/v1): scale a target between
    minReplicas and maxReplicas to keep its average CPU utilization near a percentage."""

    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = KIND

    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: HorizontalPodAutoscalerSpec | None = None
    status: HorizontalPodAutoscalerStatus | None = None


class HorizontalPodAutoscalerListV1(K8sModel):
    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "HorizontalPodAutoscalerList"

    api_version: str | None = Field(default=None, alias="apiVersion")
    items: list[HorizontalPodAutoscalerV1]
    kind: str | None = None
    metadata: ListMeta | None = None
