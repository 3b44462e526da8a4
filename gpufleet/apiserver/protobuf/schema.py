"""Protobuf schema of the other API groups, the decodable kinds, and the compiled field table.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from gpufleet.apiserver.protobuf.schema_core import _CORE, _META

_APPS: dict[str, dict[int, tuple[str, str]]] = {
    "Deployment": {
        1: ("metadata", "ObjectMeta"),
        2: ("spec", "DeploymentSpec"),
        3: ("status", "DeploymentStatus"),
    },
    "DeploymentSpec": {
        1: ("replicas", "*int32"),
        2: ("selector", "*LabelSelector"),
        3: ("template", "PodTemplateSpec"),
        4: ("strategy", "DeploymentStrategy"),
        5: ("minReadySeconds", "int32"),
        6: ("revisionHistoryLimit", "*int32"),
        7: ("paused", "bool"),
        9: ("progressDeadlineSeconds", "*int32"),
    },
    "DeploymentStrategy": {1: ("type", "string"), 2: ("rollingUpdate", "*RollingUpdateDeployment")},
    "RollingUpdateDeployment": {1: ("maxUnavailable", "*IntOrString"), 2: ("maxSurge", "*IntOrString")},
    "DeploymentStatus": {
        1: ("observedGeneration", "int64"),
        2: ("replicas", "int32"),
        3: ("updatedReplicas", "int32"),
        4: ("availableReplicas", "int32"),
        5: ("unavailableReplicas", "int32"),
        6: ("conditions", "[]DeploymentCondition"),
        7: ("readyReplicas", "int32"),
        8: ("collisionCount", "*int32"),
    },
    "DeploymentCondition": {
        1: ("type", "!string"),
        2: ("status", "!string"),
        4: ("reason", "string"),
        5: ("message", "string"),
        6: ("lastUpdateTime", "Time"),
        7: ("lastTransitionTime", "Time"),
    },
    "ReplicaSet": {
        1: ("metadata", "ObjectMeta"),
        2: ("spec", "ReplicaSetSpec"),
        3: ("status", "ReplicaSetStatus"),
    },
    "ReplicaSetSpec": {
        1: ("replicas", "*int32"),
        2: ("selector", "*LabelSelector"),
        3: ("template", "PodTemplateSpec"),
        4: ("minReadySeconds", "int32"),
    },
    "ReplicaSetStatus": {
        1: ("replicas", "!int32"),
        2: ("fullyLabeledReplicas", "int32"),
        3: ("observedGeneration", "int64"),
        4: ("readyReplicas", "int32"),
        5: ("availableReplicas", "int32"),
        6: ("conditions", "[]ReplicaSetCondition"),
    },
    "ReplicaSetCondition": {
        1: ("type", "!string"),
        2: ("status", "!string"),
        3: ("lastTransitionTime", "Time"),
        4: ("reason", "string"),
        5: ("message", "string"),
    },
}

_BATCH: dict[str, dict[int, tuple[str, str]]] = {
    "Job": {1: ("metadata", "ObjectMeta"), 2: ("spec", "JobSpec"), 3: ("status", "JobStatus")},
    "JobSpec": {
        1: ("parallelism", "*int32"),
        2: ("completions", "*int32"),
        3: ("activeDeadlineSeconds", "*int64"),
        4: ("selector", "*LabelSelector"),
        5: ("manualSelector", "*bool"),
        6: ("template", "PodTemplateSpec"),
        7: ("backoffLimit", "*int32"),
        8: ("ttlSecondsAfterFinished", "*int32"),
        9: ("completionMode", "*string"),
        10: ("suspend", "*bool"),
        11: ("podFailurePolicy", "*PodFailurePolicy"),
    },
    "PodFailurePolicy": {1: ("rules", "![]PodFailurePolicyRule")},
    "PodFailurePolicyRule": {
        1: ("action", "!string"),
        2: ("onExitCodes", "*PodFailurePolicyOnExitCodesRequirement"),
        3: ("onPodConditions", "[]PodFailurePolicyOnPodConditionsPattern"),
    },
    "PodFailurePolicyOnExitCodesRequirement": {
        1: ("containerName", "*string"),
        2: ("operator", "!string"),
        3: ("values", "![]int32"),
    },
    "PodFailurePolicyOnPodConditionsPattern": {1: ("type", "!string"), 2: ("status", "!string")},
    "JobStatus": {
        1: ("conditions", "[]JobCondition"),
        2: ("startTime", "*Time"),
        3: ("completionTime", "*Time"),
        4: ("active", "int32"),
        5: ("succeeded", "int32"),
        6: ("failed", "int32"),
        7: ("completedIndexes", "string"),
        8: ("uncountedTerminatedPods", "*UncountedTerminatedPods"),
        9: ("ready", "*int32"),
    },
    "JobCondition": {
        1: ("type", "!string"),
        2: ("status", "!string"),
        3: ("lastProbeTime", "Time"),
        4: ("lastTransitionTime", "Time"),
        5: ("reason", "string"),
        6: ("message", "string"),
    },
    "UncountedTerminatedPods": {1: ("succeeded", "[]string"), 2: ("failed", "[]string")},
    "CronJob": {1: ("metadata", "ObjectMeta"), 2: ("spec", "CronJobSpec"), 3: ("status", "CronJobStatus")},
    "CronJobSpec": {
        1: ("schedule", "!string"),
        2: ("startingDeadlineSeconds", "*int64"),
        3: ("concurrencyPolicy", "string"),
        4: ("suspend", "*bool"),
        5: ("jobTemplate", "JobTemplateSpec"),
        6: ("successfulJobsHistoryLimit", "*int32"),
        7: ("failedJobsHistoryLimit", "*int32"),
        8: ("timeZone", "*string"),
    },
    "CronJobStatus": {
        1: ("active", "[]ObjectReference"),
        4: ("lastScheduleTime", "*Time"),
        5: ("lastSuccessfulTime", "*Time"),
    },
    "JobTemplateSpec": {1: ("metadata", "ObjectMeta"), 2: ("spec", "JobSpec")},
}

_SCHEDULING: dict[str, dict[int, tuple[str, str]]] = {
    "PriorityClass": {
        1: ("metadata", "ObjectMeta"),
        2: ("value", "!int32"),
        3: ("globalDefault", "bool"),
        4: ("description", "string"),
        5: ("preemptionPolicy", "*string"),
    },
}

# rbac.authorization.k8s.io/v1: `kubectl create role|clusterrole|rolebinding|clusterrolebinding`.
_RBAC: dict[str, dict[int, tuple[str, str]]] = {
    "Role": {1: ("metadata", "ObjectMeta"), 2: ("rules", "![]PolicyRule")},
    "ClusterRole": {
        1: ("metadata", "ObjectMeta"),
        2: ("rules", "![]PolicyRule"),
        3: ("aggregationRule", "*AggregationRule"),
    },
    "AggregationRule": {1: ("clusterRoleSelectors", "[]LabelSelector")},
    "PolicyRule": {
        1: ("verbs", "![]string"),
        2: ("apiGroups", "[]string"),
        3: ("resources", "[]string"),
        4: ("resourceNames", "[]string"),
        5: ("nonResourceURLs", "[]string"),
    },
    "RoleBinding": {1: ("metadata", "ObjectMeta"), 2: ("subjects", "[]Subject"), 3: ("roleRef", "RoleRef")},
    "ClusterRoleBinding": {
        1: ("metadata", "ObjectMeta"),
        2: ("subjects", "[]Subject"),
        3: ("roleRef", "RoleRef"),
    },
    "Subject": {
        1: ("kind", "!string"),
        2: ("apiGroup", "string"),
        3: ("name", "!string"),
        4: ("namespace", "string"),
    },
    "RoleRef": {1: ("apiGroup", "!string"), 2: ("kind", "!string"), 3: ("name", "!string")},
}

# policy/v1: `kubectl create poddisruptionbudget`.
_POLICY: dict[str, dict[int, tuple[str, str]]] = {
    "PodDisruptionBudget": {
        1: ("metadata", "ObjectMeta"),
        2: ("spec", "PodDisruptionBudgetSpec"),
        3: ("status", "PodDisruptionBudgetStatus"),
    },
    "PodDisruptionBudgetSpec": {
        1: ("minAvailable", "*IntOrString"),
        2: ("selector", "*LabelSelector"),
        3: ("maxUnavailable", "*IntOrString"),
        4: ("unhealthyPodEvictionPolicy", "*string"),
    },
    "PodDisruptionBudgetStatus": {
        1: ("observedGeneration", "int64"),
        2: ("disruptedPods", "map[Time]"),
        3: ("disruptionsAllowed", "!int32"),
        4: ("currentHealthy", "!int32"),
        5: ("desiredHealthy", "!int32"),
        6: ("expectedPods", "!int32"),
        7: ("conditions", "[]Condition"),
    },
}

# autoscaling/v2 (`kubectl autoscale` of 1.33 and later) and autoscaling/v1 (1.27-1.32).
_AUTOSCALING: dict[str, dict[int, tuple[str, str]]] = {
    "HorizontalPodAutoscaler": {
        1: ("metadata", "ObjectMeta"),
        2: ("spec", "HorizontalPodAutoscalerSpec"),
        3: ("status", "HorizontalPodAutoscalerStatus"),
    },
    "HorizontalPodAutoscalerSpec": {
        1: ("scaleTargetRef", "CrossVersionObjectReference"),
        2: ("minReplicas", "*int32"),
        3: ("maxReplicas", "!int32"),
        4: ("metrics", "[]MetricSpec"),
        5: ("behavior", "*HorizontalPodAutoscalerBehavior"),
    },
    "CrossVersionObjectReference": {1: ("kind", "!string"), 2: ("name", "!string"), 3: ("apiVersion", "string")},
    "MetricSpec": {
        1: ("type", "!string"),
        2: ("object", "*ObjectMetricSource"),
        3: ("pods", "*PodsMetricSource"),
        4: ("resource", "*ResourceMetricSource"),
        5: ("external", "*ExternalMetricSource"),
        7: ("containerResource", "*ContainerResourceMetricSource"),
    },
    "ObjectMetricSource": {
        1: ("describedObject", "CrossVersionObjectReference"),
        2: ("target", "MetricTarget"),
        3: ("metric", "MetricIdentifier"),
    },
    "PodsMetricSource": {1: ("metric", "MetricIdentifier"), 2: ("target", "MetricTarget")},
    "ResourceMetricSource": {1: ("name", "!string"), 2: ("target", "MetricTarget")},
    "ExternalMetricSource": {1: ("metric", "MetricIdentifier"), 2: ("target", "MetricTarget")},
    "ContainerResourceMetricSource": {
        1: ("name", "!string"),
        2: ("target", "MetricTarget"),
        3: ("container", "!string"),
    },
    "MetricIdentifier": {1: ("name", "!string"), 2: ("selector", "*LabelSelector")},
    "MetricTarget": {
        1: ("type", "!string"),
        2: ("value", "*Quantity"),
        3: ("averageValue", "*Quantity"),
        4: ("averageUtilization", "*int32"),
    },
    "HorizontalPodAutoscalerBehavior": {1: ("scaleUp", "*HPAScalingRules"), 2: ("scaleDown", "*HPAScalingRules")},
    "HPAScalingRules": {
        1: ("selectPolicy", "*string"),
        2: ("policies", "[]HPAScalingPolicy"),
        3: ("stabilizationWindowSeconds", "*int32"),
        4: ("tolerance", "*Quantity"),
    },
    "HPAScalingPolicy": {1: ("type", "!string"), 2: ("value", "!int32"), 3: ("periodSeconds", "!int32")},
    "HorizontalPodAutoscalerStatus": {
        1: ("observedGeneration", "*int64"),
        2: ("lastScaleTime", "*Time"),
        3: ("currentReplicas", "int32"),
        4: ("desiredReplicas", "!int32"),
        5: ("currentMetrics", "?[]MetricStatus"),
        6: ("conditions", "?[]HorizontalPodAutoscalerCondition"),
    },
    # autoscaling/v1 (`kubectl autoscale` of 1.32), converted to the stored v2 by the server.
    "V1HorizontalPodAutoscaler": {
        1: ("metadata", "ObjectMeta"),
        2: ("spec", "V1HorizontalPodAutoscalerSpec"),
        3: ("status", "V1HorizontalPodAutoscalerStatus"),
    },
    "V1HorizontalPodAutoscalerSpec": {
        1: ("scaleTargetRef", "CrossVersionObjectReference"),
        2: ("minReplicas", "*int32"),
        3: ("maxReplicas", "!int32"),
        4: ("targetCPUUtilizationPercentage", "*int32"),
    },
    "V1HorizontalPodAutoscalerStatus": {
        1: ("observedGeneration", "*int64"),
        2: ("lastScaleTime", "*Time"),
        3: ("currentReplicas", "!int32"),
        4: ("desiredReplicas", "!int32"),
        5: ("currentCPUUtilizationPercentage", "*int32"),
    },
}

# k8s.io/api/authentication/v1: what `kubectl create token` sends.
_AUTHENTICATION: dict[str, dict[int, tuple[str, str]]] = {
    "TokenRequest": {
        1: ("metadata", "ObjectMeta"),
        2: ("spec", "TokenRequestSpec"),
        3: ("status", "TokenRequestStatus"),
    },
    "TokenRequestSpec": {
        1: ("audiences", "![]string"),
        3: ("boundObjectRef", "*BoundObjectReference"),
        4: ("expirationSeconds", "*int64"),
    },
    "BoundObjectReference": {
        1: ("kind", "string"),
        2: ("apiVersion", "string"),
        3: ("name", "string"),
        4: ("uid", "string"),
    },
    "TokenRequestStatus": {1: ("token", "!string"), 2: ("expirationTimestamp", "!Time")},
}

# networking.k8s.io/v1 Ingress (what `kubectl create ingress` sends).
_NETWORKING: dict[str, dict[int, tuple[str, str]]] = {
    "Ingress": {1: ("metadata", "ObjectMeta"), 2: ("spec", "IngressSpec"), 3: ("status", "IngressStatus")},
    "IngressSpec": {
        1: ("defaultBackend", "*IngressBackend"),
        2: ("tls", "[]IngressTLS"),
        3: ("rules", "[]IngressRule"),
        4: ("ingressClassName", "*string"),
    },
    "IngressBackend": {3: ("resource", "*TypedLocalObjectReference"), 4: ("service", "*IngressServiceBackend")},
    "TypedLocalObjectReference": {1: ("apiGroup", "*string"), 2: ("kind", "!string"), 3: ("name", "!string")},
    "IngressServiceBackend": {1: ("name", "!string"), 2: ("port", "ServiceBackendPort")},
    "ServiceBackendPort": {1: ("name", "string"), 2: ("number", "int32")},
    "IngressTLS": {1: ("hosts", "[]string"), 2: ("secretName", "string")},
    "IngressRule": {1: ("host", "string"), 2: ("", "^IngressRuleValue")},
    "IngressRuleValue": {1: ("http", "*HTTPIngressRuleValue")},
    "HTTPIngressRuleValue": {1: ("paths", "![]HTTPIngressPath")},
    "HTTPIngressPath": {1: ("path", "string"), 2: ("backend", "IngressBackend"), 3: ("pathType", "*string")},
    "IngressStatus": {1: ("loadBalancer", "IngressLoadBalancerStatus")},
    "IngressLoadBalancerStatus": {1: ("ingress", "[]IngressLoadBalancerIngress")},
    "IngressLoadBalancerIngress": {1: ("ip", "string"), 2: ("hostname", "string"), 4: ("ports", "[]IngressPortStatus")},
    "IngressPortStatus": {1: ("port", "!int32"), 2: ("protocol", "!string"), 3: ("error", "*string")},
}

SCHEMA: dict[str, dict[int, tuple[str, str]]] = {
    **_META, **_CORE, **_APPS, **_BATCH, **_SCHEDULING, **_RBAC, **_POLICY, **_AUTOSCALING, **_AUTHENTICATION,
    **_NETWORKING,
}

# Top-level kinds this module decodes, by (apiVersion, kind). A registered kind that is not here
# keeps the old 415 answer.
KINDS: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "Namespace",
    ("v1", "ConfigMap"): "ConfigMap",
    ("v1", "Secret"): "Secret",
    ("v1", "ServiceAccount"): "ServiceAccount",
    ("v1", "ResourceQuota"): "ResourceQuota",
    ("v1", "Service"): "Service",
    ("v1", "Pod"): "Pod",
    ("apps/v1", "Deployment"): "Deployment",
    ("apps/v1", "ReplicaSet"): "ReplicaSet",
    ("batch/v1", "Job"): "Job",
    ("batch/v1", "CronJob"): "CronJob",
    ("scheduling.k8s.io/v1", "PriorityClass"): "PriorityClass",
    ("rbac.authorization.k8s.io/v1", "Role"): "Role",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "ClusterRole",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "ClusterRoleBinding",
    ("policy/v1", "PodDisruptionBudget"): "PodDisruptionBudget",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "HorizontalPodAutoscaler",
    ("autoscaling/v1", "HorizontalPodAutoscaler"): "V1HorizontalPodAutoscaler",
    ("authentication.k8s.io/v1", "TokenRequest"): "TokenRequest",
    ("networking.k8s.io/v1", "Ingress"): "Ingress",
}
# Kinds only a subresource takes (serviceaccounts/token): not in the registry, decoded all the same.
SUBRESOURCE_KINDS = {("authentication.k8s.io/v1", "TokenRequest")}

_SCALARS = {"string", "int32", "int64", "bool", "bytes"}
# Wrapper messages rendered as JSON scalars/strings rather than objects.
_SPECIAL = {"Time", "MicroTime", "Quantity", "IntOrString", "FieldsV1"}
_ZERO: dict[str, Any] = {"string": "", "int32": 0, "int64": 0, "bool": False, "bytes": ""}


@dataclass(frozen=True)
class _Field:
    name: str
    mode: str  # "omit" | "always" | "ptr" | "inline" | "unsupported"
    shape: str  # "one" | "list" | "map"
    elem: str  # scalar name, special name or message name
    raw_type: str


def _parse_type(json_name: str, t: str) -> _Field:
    mode = "omit"
    if t[0] == "?":
        return _Field(json_name, "unsupported", "one", t[1:].removeprefix("[]"), t[1:])
    if t[0] == "*":
        mode, t = "ptr", t[1:]
    elif t[0] == "!":
        mode, t = "always", t[1:]
    elif t[0] == "^":
        mode, t = "inline", t[1:]
    if t.startswith("[]"):
        return _Field(json_name, mode, "list", t[2:], t)
    if t.startswith("map[") and t.endswith("]"):
        return _Field(json_name, mode, "map", t[4:-1], t)
    return _Field(json_name, mode, "one", t, t)


@cache
def _compiled(message: str) -> dict[int, _Field]:
    return {num: _parse_type(name, t) for num, (name, t) in SCHEMA[message].items()}


def _is_message(elem: str) -> bool:
    return elem not in _SCALARS and elem not in _SPECIAL
