"""Decoding of Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`).

kubectl 1.32 and later send the typed objects of its imperative commands (`create namespace`,
`create deployment`, `create configmap`, ...) as protobuf and do not retry with JSON when the
server answers 415, so the server has to read them. This module turns such a body into the
camelCase JSON dict that the same kubectl would have sent as JSON, so that everything after
body parsing (defaulting, strict field validation, admission, storage) stays JSON-only.

Wire format: the 4-byte magic ``k8s\\x00`` followed by a ``runtime.Unknown`` message
(typeMeta{apiVersion=1, kind=2}=1, raw=2, contentEncoding=3, contentType=4) whose ``raw`` is
the object encoded as the message of its kind (go-to-protobuf, proto2 syntax).

The JSON a Go client writes is not "every field that is set": it follows the Go struct tags.
Kubernetes' protobuf marshaller writes every non-pointer field, zero or not, and pointer fields
only when non-nil; the JSON encoder drops zero scalars and empty collections tagged
``omitempty``, always writes untagged ones, and always writes non-pointer structs (``{}`` when
empty). The schema below therefore records, per field, the Go shape as well as the wire type,
and the decoder reproduces the JSON side of each rule: ``creationTimestamp: null``,
``resources: {}``, ``strategy: {}``, ``status: {}`` and ``value: 0`` come out exactly as a JSON
client would have sent them.

Coverage is what kubectl's imperative creates and ordinary workloads carry (ObjectMeta,
Namespace, ConfigMap, Secret, ServiceAccount, ResourceQuota, Service, Pod/PodSpec/Container,
Deployment, ReplicaSet, Job, CronJob, PriorityClass, Role, ClusterRole, RoleBinding,
ClusterRoleBinding, PodDisruptionBudget, HorizontalPodAutoscaler, and TokenRequest for
`kubectl create token`). Errors are explicit rather
than lossy:

* a field number a modelled message does not define -> 400 BadRequest naming the message and
  the number (a newer client may set a field this table predates; dropping it silently would
  store an object other than the one sent);
* a known field whose type is deliberately not modelled (probes, lifecycle hooks, exotic volume
  sources, container statuses) -> 400 naming the field and asking for JSON;
* a kind the registry knows but this table does not model -> 415, like before this module;
* a kind the registry does not know -> 400, as kube-apiserver answers.
"""

from __future__ import annotations

import base64
import datetime as _dt
from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson

from gpufleet.apiserver.errors import ApiException, bad_request

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5

# Go's zero time.Time, in Unix seconds; Kubernetes writes it as an empty Time message, but a
# writer that encodes the value literally must still decode to null.
_GO_ZERO_TIME = -62135596800


class ProtobufDecodeError(ApiException):
    """A body that is not valid Kubernetes protobuf, or uses a field this server cannot map."""

    def __init__(self, message: str) -> None:
        err = bad_request(f"the body of the request could not be decoded as protobuf: {message}")
        super().__init__(err.code, err.reason, err.message)


# --------------------------------------------------------------------------------- schema
#
# message -> {field number: (json name, type)}. Type mini-language:
#   string int32 int64 bool bytes        scalars (omitempty: zero values are left out)
#   Time MicroTime Quantity IntOrString  the apimachinery wrapper messages, rendered as in JSON
#   FieldsV1                             managedFields' raw JSON
#   <Message>                            a nested message held by value (always written)
#   []T                                  repeated (left out when empty)
#   map[T]                               map<string, T> (left out when empty)
#   *T                                   a Go pointer: written exactly when present on the wire
#   !T                                   no omitempty: written even when zero/empty (null for [])
#   ^Message                             embedded inline: its fields are merged into the parent
#   ?T                                   defined by Kubernetes but not modelled here: 400 if set

_META: dict[str, dict[int, tuple[str, str]]] = {
    "ObjectMeta": {
        1: ("name", "string"),
        2: ("generateName", "string"),
        3: ("namespace", "string"),
        4: ("selfLink", "string"),
        5: ("uid", "string"),
        6: ("resourceVersion", "string"),
        7: ("generation", "int64"),
        8: ("creationTimestamp", "Time"),
        9: ("deletionTimestamp", "*Time"),
        10: ("deletionGracePeriodSeconds", "*int64"),
        11: ("labels", "map[string]"),
        12: ("annotations", "map[string]"),
        13: ("ownerReferences", "[]OwnerReference"),
        14: ("finalizers", "[]string"),
        17: ("managedFields", "[]ManagedFieldsEntry"),
    },
    "OwnerReference": {
        1: ("kind", "!string"),
        3: ("name", "!string"),
        4: ("uid", "!string"),
        5: ("apiVersion", "!string"),
        6: ("controller", "*bool"),
        7: ("blockOwnerDeletion", "*bool"),
    },
    "ManagedFieldsEntry": {
        1: ("manager", "string"),
        2: ("operation", "string"),
        3: ("apiVersion", "string"),
        4: ("time", "*Time"),
        6: ("fieldsType", "string"),
        7: ("fieldsV1", "*FieldsV1"),
        8: ("subresource", "string"),
    },
    "LabelSelector": {
        1: ("matchLabels", "map[string]"),
        2: ("matchExpressions", "[]LabelSelectorRequirement"),
    },
    "LabelSelectorRequirement": {
        1: ("key", "!string"),
        2: ("operator", "!string"),
        3: ("values", "[]string"),
    },
    "Condition": {
        1: ("type", "!string"),
        2: ("status", "!string"),
        3: ("observedGeneration", "int64"),
        4: ("lastTransitionTime", "Time"),
        5: ("reason", "!string"),
        6: ("message", "!string"),
    },
}

_CORE: dict[str, dict[int, tuple[str, str]]] = {
    # --- simple kinds
    "Namespace": {
        1: ("metadata", "ObjectMeta"),
        2: ("spec", "NamespaceSpec"),
        3: ("status", "NamespaceStatus"),
    },
    "NamespaceSpec": {1: ("finalizers", "[]string")},
    "NamespaceStatus": {1: ("phase", "string"), 2: ("conditions", "[]NamespaceCondition")},
    "NamespaceCondition": {
        1: ("type", "!string"),
        2: ("status", "!string"),
        4: ("lastTransitionTime", "Time"),
        5: ("reason", "string"),
        6: ("message", "string"),
    },
    "ConfigMap": {
        1: ("metadata", "ObjectMeta"),
        2: ("data", "map[string]"),
        3: ("binaryData", "map[bytes]"),
        4: ("immutable", "*bool"),
    },
    "Secret": {
        1: ("metadata", "ObjectMeta"),
        2: ("data", "map[bytes]"),
        3: ("type", "string"),
        4: ("stringData", "map[string]"),
        5: ("immutable", "*bool"),
    },
    "ServiceAccount": {
        1: ("metadata", "ObjectMeta"),
        2: ("secrets", "[]ObjectReference"),
        3: ("imagePullSecrets", "[]LocalObjectReference"),
        4: ("automountServiceAccountToken", "*bool"),
    },
    "ObjectReference": {
        1: ("kind", "string"),
        2: ("namespace", "string"),
        3: ("name", "string"),
        4: ("uid", "string"),
        5: ("apiVersion", "string"),
        6: ("resourceVersion", "string"),
        7: ("fieldPath", "string"),
    },
    "LocalObjectReference": {1: ("name", "string")},
    "ResourceQuota": {
        1: ("metadata", "ObjectMeta"),
        2: ("spec", "ResourceQuotaSpec"),
        3: ("status", "ResourceQuotaStatus"),
    },
    "ResourceQuotaSpec": {
        1: ("hard", "map[Quantity]"),
        2: ("scopes", "[]string"),
        3: ("scopeSelector", "*ScopeSelector"),
    },
    "ScopeSelector": {1: ("matchExpressions", "[]ScopedResourceSelectorRequirement")},
    "ScopedResourceSelectorRequirement": {
        1: ("scopeName", "!string"),
        2: ("operator", "!string"),
        3: ("values", "[]string"),
    },
    "ResourceQuotaStatus": {1: ("hard", "map[Quantity]"), 2: ("used", "map[Quantity]")},
    # --- Service
    "Service": {1: ("metadata", "ObjectMeta"), 2: ("spec", "ServiceSpec"), 3: ("status", "ServiceStatus")},
    "ServiceSpec": {
        1: ("ports", "[]ServicePort"),
        2: ("selector", "map[string]"),
        3: ("clusterIP", "string"),
        4: ("type", "string"),
        5: ("externalIPs", "[]string"),
        7: ("sessionAffinity", "string"),
        8: ("loadBalancerIP", "string"),
        9: ("loadBalancerSourceRanges", "[]string"),
        10: ("externalName", "string"),
        11: ("externalTrafficPolicy", "string"),
        12: ("healthCheckNodePort", "int32"),
        13: ("publishNotReadyAddresses", "bool"),
        14: ("sessionAffinityConfig", "*SessionAffinityConfig"),
        17: ("ipFamilyPolicy", "*string"),
        18: ("clusterIPs", "[]string"),
        19: ("ipFamilies", "[]string"),
        20: ("allocateLoadBalancerNodePorts", "*bool"),
        21: ("loadBalancerClass", "*string"),
        22: ("internalTrafficPolicy", "*string"),
    },
    "SessionAffinityConfig": {1: ("clientIP", "*ClientIPConfig")},
    "ClientIPConfig": {1: ("timeoutSeconds", "*int32")},
    "ServicePort": {
        1: ("name", "string"),
        2: ("protocol", "string"),
        3: ("port", "!int32"),
        4: ("targetPort", "IntOrString"),
        5: ("nodePort", "int32"),
        6: ("appProtocol", "*string"),
    },
    "ServiceStatus": {1: ("loadBalancer", "LoadBalancerStatus"), 2: ("conditions", "[]Condition")},
    "LoadBalancerStatus": {1: ("ingress", "[]LoadBalancerIngress")},
    "LoadBalancerIngress": {1: ("ip", "string"), 2: ("hostname", "string"), 4: ("ports", "[]PortStatus")},
    "PortStatus": {1: ("port", "!int32"), 2: ("protocol", "!string"), 3: ("error", "*string")},
    # --- Pod
    "Pod": {1: ("metadata", "ObjectMeta"), 2: ("spec", "PodSpec"), 3: ("status", "PodStatus")},
    "PodTemplateSpec": {1: ("metadata", "ObjectMeta"), 2: ("spec", "PodSpec")},
    "PodSpec": {
        1: ("volumes", "[]Volume"),
        2: ("containers", "![]Container"),
        3: ("restartPolicy", "string"),
        4: ("terminationGracePeriodSeconds", "*int64"),
        5: ("activeDeadlineSeconds", "*int64"),
        6: ("dnsPolicy", "string"),
        7: ("nodeSelector", "map[string]"),
        8: ("serviceAccountName", "string"),
        9: ("serviceAccount", "string"),
        10: ("nodeName", "string"),
        11: ("hostNetwork", "bool"),
        12: ("hostPID", "bool"),
        13: ("hostIPC", "bool"),
        14: ("securityContext", "*PodSecurityContext"),
        15: ("imagePullSecrets", "[]LocalObjectReference"),
        16: ("hostname", "string"),
        17: ("subdomain", "string"),
        18: ("affinity", "*Affinity"),
        19: ("schedulerName", "string"),
        20: ("initContainers", "[]Container"),
        21: ("automountServiceAccountToken", "*bool"),
        22: ("tolerations", "[]Toleration"),
        23: ("hostAliases", "?[]HostAlias"),
        24: ("priorityClassName", "string"),
        25: ("priority", "*int32"),
        26: ("dnsConfig", "*PodDNSConfig"),
        27: ("shareProcessNamespace", "*bool"),
        28: ("readinessGates", "[]PodReadinessGate"),
        29: ("runtimeClassName", "*string"),
        30: ("enableServiceLinks", "*bool"),
        31: ("preemptionPolicy", "*string"),
        32: ("overhead", "map[Quantity]"),
        33: ("topologySpreadConstraints", "[]TopologySpreadConstraint"),
        34: ("ephemeralContainers", "?[]EphemeralContainer"),
        35: ("setHostnameAsFQDN", "*bool"),
    },
    "PodStatus": {
        1: ("phase", "string"),
        2: ("conditions", "[]PodCondition"),
        3: ("message", "string"),
        4: ("reason", "string"),
        5: ("hostIP", "string"),
        6: ("podIP", "string"),
        7: ("startTime", "*Time"),
        8: ("containerStatuses", "?[]ContainerStatus"),
        9: ("qosClass", "string"),
        10: ("initContainerStatuses", "?[]ContainerStatus"),
        11: ("nominatedNodeName", "string"),
        12: ("podIPs", "[]PodIP"),
        13: ("ephemeralContainerStatuses", "?[]ContainerStatus"),
    },
    "PodCondition": {
        1: ("type", "!string"),
        2: ("status", "!string"),
        3: ("lastProbeTime", "Time"),
        4: ("lastTransitionTime", "Time"),
        5: ("reason", "string"),
        6: ("message", "string"),
    },
    "PodIP": {1: ("ip", "!string")},
    "Toleration": {
        1: ("key", "string"),
        2: ("operator", "string"),
        3: ("value", "string"),
        4: ("effect", "string"),
        5: ("tolerationSeconds", "*int64"),
    },
    "PodReadinessGate": {1: ("conditionType", "!string")},
    "PodDNSConfig": {
        1: ("nameservers", "[]string"),
        2: ("searches", "[]string"),
        3: ("options", "[]PodDNSConfigOption"),
    },
    "PodDNSConfigOption": {1: ("name", "string"), 2: ("value", "*string")},
    "TopologySpreadConstraint": {
        1: ("maxSkew", "!int32"),
        2: ("topologyKey", "!string"),
        3: ("whenUnsatisfiable", "!string"),
        4: ("labelSelector", "*LabelSelector"),
    },
    "PodSecurityContext": {
        1: ("seLinuxOptions", "*SELinuxOptions"),
        2: ("runAsUser", "*int64"),
        3: ("runAsNonRoot", "*bool"),
        4: ("supplementalGroups", "[]int64"),
        5: ("fsGroup", "*int64"),
        6: ("runAsGroup", "*int64"),
        7: ("sysctls", "[]Sysctl"),
        8: ("windowsOptions", "*WindowsSecurityContextOptions"),
        9: ("fsGroupChangePolicy", "*string"),
        10: ("seccompProfile", "*SeccompProfile"),
    },
    "SecurityContext": {
        1: ("capabilities", "*Capabilities"),
        2: ("privileged", "*bool"),
        3: ("seLinuxOptions", "*SELinuxOptions"),
        4: ("runAsUser", "*int64"),
        5: ("runAsNonRoot", "*bool"),
        6: ("readOnlyRootFilesystem", "*bool"),
        7: ("allowPrivilegeEscalation", "*bool"),
        8: ("runAsGroup", "*int64"),
        9: ("procMount", "*string"),
        10: ("windowsOptions", "*WindowsSecurityContextOptions"),
        11: ("seccompProfile", "*SeccompProfile"),
    },
    "Capabilities": {1: ("add", "[]string"), 2: ("drop", "[]string")},
    "SELinuxOptions": {
        1: ("user", "string"),
        2: ("role", "string"),
        3: ("type", "string"),
        4: ("level", "string"),
    },
    "WindowsSecurityContextOptions": {
        1: ("gmsaCredentialSpecName", "*string"),
        2: ("gmsaCredentialSpec", "*string"),
        3: ("runAsUserName", "*string"),
    },
    "SeccompProfile": {1: ("type", "!string"), 2: ("localhostProfile", "*string")},
    "Sysctl": {1: ("name", "!string"), 2: ("value", "!string")},
    "Affinity": {
        1: ("nodeAffinity", "*NodeAffinity"),
        2: ("podAffinity", "*PodAffinity"),
        3: ("podAntiAffinity", "*PodAffinity"),
    },
    "NodeAffinity": {
        1: ("requiredDuringSchedulingIgnoredDuringExecution", "*NodeSelector"),
        2: ("preferredDuringSchedulingIgnoredDuringExecution", "[]PreferredSchedulingTerm"),
    },
    "NodeSelector": {1: ("nodeSelectorTerms", "![]NodeSelectorTerm")},
    "NodeSelectorTerm": {
        1: ("matchExpressions", "[]NodeSelectorRequirement"),
        2: ("matchFields", "[]NodeSelectorRequirement"),
    },
    "NodeSelectorRequirement": {1: ("key", "!string"), 2: ("operator", "!string"), 3: ("values", "[]string")},
    "PreferredSchedulingTerm": {1: ("weight", "!int32"), 2: ("preference", "NodeSelectorTerm")},
    # PodAntiAffinity has the same shape and field numbers as PodAffinity.
    "PodAffinity": {
        1: ("requiredDuringSchedulingIgnoredDuringExecution", "[]PodAffinityTerm"),
        2: ("preferredDuringSchedulingIgnoredDuringExecution", "[]WeightedPodAffinityTerm"),
    },
    "PodAffinityTerm": {
        1: ("labelSelector", "*LabelSelector"),
        2: ("namespaces", "[]string"),
        3: ("topologyKey", "!string"),
        4: ("namespaceSelector", "*LabelSelector"),
    },
    "WeightedPodAffinityTerm": {1: ("weight", "!int32"), 2: ("podAffinityTerm", "PodAffinityTerm")},
    # --- containers
    "Container": {
        1: ("name", "!string"),
        2: ("image", "string"),
        3: ("command", "[]string"),
        4: ("args", "[]string"),
        5: ("workingDir", "string"),
        6: ("ports", "[]ContainerPort"),
        7: ("env", "[]EnvVar"),
        8: ("resources", "ResourceRequirements"),
        9: ("volumeMounts", "[]VolumeMount"),
        10: ("livenessProbe", "?Probe"),
        11: ("readinessProbe", "?Probe"),
        12: ("lifecycle", "?Lifecycle"),
        13: ("terminationMessagePath", "string"),
        14: ("imagePullPolicy", "string"),
        15: ("securityContext", "*SecurityContext"),
        16: ("stdin", "bool"),
        17: ("stdinOnce", "bool"),
        18: ("tty", "bool"),
        19: ("envFrom", "[]EnvFromSource"),
        20: ("terminationMessagePolicy", "string"),
        21: ("volumeDevices", "[]VolumeDevice"),
        22: ("startupProbe", "?Probe"),
    },
    "ContainerPort": {
        1: ("name", "string"),
        2: ("hostPort", "int32"),
        3: ("containerPort", "!int32"),
        4: ("protocol", "string"),
        5: ("hostIP", "string"),
    },
    "EnvVar": {1: ("name", "!string"), 2: ("value", "string"), 3: ("valueFrom", "*EnvVarSource")},
    "EnvVarSource": {
        1: ("fieldRef", "*ObjectFieldSelector"),
        2: ("resourceFieldRef", "*ResourceFieldSelector"),
        3: ("configMapKeyRef", "*ConfigMapKeySelector"),
        4: ("secretKeyRef", "*SecretKeySelector"),
    },
    "ObjectFieldSelector": {1: ("apiVersion", "string"), 2: ("fieldPath", "!string")},
    "ResourceFieldSelector": {
        1: ("containerName", "string"),
        2: ("resource", "!string"),
        3: ("divisor", "Quantity"),
    },
    "ConfigMapKeySelector": {
        1: ("", "^LocalObjectReference"),
        2: ("key", "!string"),
        3: ("optional", "*bool"),
    },
    "SecretKeySelector": {1: ("", "^LocalObjectReference"), 2: ("key", "!string"), 3: ("optional", "*bool")},
    "EnvFromSource": {
        1: ("prefix", "string"),
        2: ("configMapRef", "*ConfigMapEnvSource"),
        3: ("secretRef", "*SecretEnvSource"),
    },
    "ConfigMapEnvSource": {1: ("", "^LocalObjectReference"), 2: ("optional", "*bool")},
    "SecretEnvSource": {1: ("", "^LocalObjectReference"), 2: ("optional", "*bool")},
    "ResourceRequirements": {1: ("limits", "map[Quantity]"), 2: ("requests", "map[Quantity]")},
    "VolumeMount": {
        1: ("name", "!string"),
        2: ("readOnly", "bool"),
        3: ("mountPath", "!string"),
        4: ("subPath", "string"),
        5: ("mountPropagation", "*string"),
        6: ("subPathExpr", "string"),
    },
    "VolumeDevice": {1: ("name", "!string"), 2: ("devicePath", "!string")},
    # --- volumes (the common sources; the others are rejected with a 400 naming them)
    "Volume": {1: ("name", "!string"), 2: ("", "^VolumeSource")},
    "VolumeSource": {
        1: ("hostPath", "*HostPathVolumeSource"),
        2: ("emptyDir", "*EmptyDirVolumeSource"),
        6: ("secret", "*SecretVolumeSource"),
        10: ("persistentVolumeClaim", "*PersistentVolumeClaimVolumeSource"),
        16: ("downwardAPI", "?DownwardAPIVolumeSource"),
        19: ("configMap", "*ConfigMapVolumeSource"),
        26: ("projected", "?ProjectedVolumeSource"),
        28: ("csi", "?CSIVolumeSource"),
        29: ("ephemeral", "?EphemeralVolumeSource"),
    },
    "HostPathVolumeSource": {1: ("path", "!string"), 2: ("type", "*string")},
    "EmptyDirVolumeSource": {1: ("medium", "string"), 2: ("sizeLimit", "*Quantity")},
    "SecretVolumeSource": {
        1: ("secretName", "string"),
        2: ("items", "[]KeyToPath"),
        3: ("defaultMode", "*int32"),
        4: ("optional", "*bool"),
    },
    "ConfigMapVolumeSource": {
        1: ("", "^LocalObjectReference"),
        2: ("items", "[]KeyToPath"),
        3: ("defaultMode", "*int32"),
        4: ("optional", "*bool"),
    },
    "KeyToPath": {1: ("key", "!string"), 2: ("path", "!string"), 3: ("mode", "*int32")},
    "PersistentVolumeClaimVolumeSource": {1: ("claimName", "!string"), 2: ("readOnly", "bool")},
}

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

SCHEMA: dict[str, dict[int, tuple[str, str]]] = {
    **_META, **_CORE, **_APPS, **_BATCH, **_SCHEDULING, **_RBAC, **_POLICY, **_AUTOSCALING, **_AUTHENTICATION,
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


# ---------------------------------------------------------------------------- wire reader


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise ProtobufDecodeError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ProtobufDecodeError("varint longer than 10 bytes")


def _fields(buf: bytes, message: str):
    """Yields (field number, wire type, value): an int for varint/fixed, bytes for length-delimited."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos, end)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise ProtobufDecodeError(f"field number 0 in {message}")
        if wt == _VARINT:
            val, pos = _varint(buf, pos, end)
            yield num, wt, val
        elif wt == _LEN:
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                raise ProtobufDecodeError(f"field {num} of {message} runs past the end of its message")
            yield num, wt, buf[pos : pos + n]
            pos += n
        elif wt == _FIXED64:
            if pos + 8 > end:
                raise ProtobufDecodeError(f"truncated 64-bit field {num} in {message}")
            yield num, wt, int.from_bytes(buf[pos : pos + 8], "little")
            pos += 8
        elif wt == _FIXED32:
            if pos + 4 > end:
                raise ProtobufDecodeError(f"truncated 32-bit field {num} in {message}")
            yield num, wt, int.from_bytes(buf[pos : pos + 4], "little")
            pos += 4
        else:
            raise ProtobufDecodeError(f"unsupported wire type {wt} for field {num} in {message}")


def _signed(v: int, bits: int) -> int:
    # Negative int32/int64 values travel as 64-bit two's complement varints.
    v &= (1 << 64) - 1
    if v >= 1 << 63:
        v -= 1 << 64
    if bits == 32 and not -(1 << 31) <= v < (1 << 31):
        raise ProtobufDecodeError(f"value {v} does not fit in int32")
    return v


# ------------------------------------------------------------------------------- decoding


def _where(message: str, num: int, f: _Field | None = None) -> str:
    return f'field {num} ("{f.name}") of {message}' if f and f.name else f"field {num} of {message}"


def _scalar(elem: str, wt: int, val: Any, message: str, num: int, f: _Field) -> Any:
    if elem in ("int32", "int64", "bool"):
        if wt != _VARINT:
            raise ProtobufDecodeError(f"{_where(message, num, f)} should be a varint, got wire type {wt}")
        if elem == "bool":
            return val != 0
        return _signed(val, 32 if elem == "int32" else 64)
    if wt != _LEN:
        raise ProtobufDecodeError(f"{_where(message, num, f)} should be length-delimited, got wire type {wt}")
    if elem == "bytes":
        return base64.b64encode(val).decode("ascii")
    try:
        return val.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtobufDecodeError(f"{_where(message, num, f)} is not valid UTF-8") from None


def _time(buf: bytes, micro: bool) -> str | None:
    seconds = nanos = 0
    for num, wt, val in _fields(buf, "Time"):
        if wt != _VARINT or num not in (1, 2):
            raise ProtobufDecodeError(f"unexpected field {num} (wire type {wt}) in Time")
        if num == 1:
            seconds = _signed(val, 64)
        else:
            nanos = _signed(val, 32)
    if not buf or (seconds == _GO_ZERO_TIME and nanos == 0):
        return None  # Go's zero time, which JSON renders as null
    try:
        t = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC) + _dt.timedelta(seconds=seconds)
    except OverflowError:
        raise ProtobufDecodeError(f"time {seconds}s is out of range") from None
    # Same layouts as metav1.Time (RFC 3339, seconds) and metav1.MicroTime (microseconds).
    text = f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"
    if micro:
        text += f".{nanos // 1000:06d}"
    return text + "Z"


def _quantity(buf: bytes) -> str:
    out = ""
    for num, wt, val in _fields(buf, "Quantity"):
        if num != 1 or wt != _LEN:
            raise ProtobufDecodeError(f"unexpected field {num} (wire type {wt}) in Quantity")
        out = val.decode("utf-8", errors="strict")
    return out or "0"  # a zero Quantity marshals as "0" in JSON


def _int_or_string(buf: bytes) -> int | str:
    kind, int_val, str_val = 0, 0, ""
    for num, wt, val in _fields(buf, "IntOrString"):
        if num in (1, 2) and wt == _VARINT:
            if num == 1:
                kind = _signed(val, 64)
            else:
                int_val = _signed(val, 32)
        elif num == 3 and wt == _LEN:
            str_val = val.decode("utf-8")
        else:
            raise ProtobufDecodeError(f"unexpected field {num} (wire type {wt}) in IntOrString")
    return str_val if kind == 1 else int_val


def _fields_v1(buf: bytes) -> Any:
    raw = b""
    for num, wt, val in _fields(buf, "FieldsV1"):
        if num != 1 or wt != _LEN:
            raise ProtobufDecodeError(f"unexpected field {num} (wire type {wt}) in FieldsV1")
        raw = val
    try:
        return orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        raise ProtobufDecodeError("managedFields fieldsV1 is not JSON") from None


def _special(elem: str, buf: bytes) -> Any:
    if elem == "Time":
        return _time(buf, micro=False)
    if elem == "MicroTime":
        return _time(buf, micro=True)
    if elem == "Quantity":
        return _quantity(buf)
    if elem == "IntOrString":
        return _int_or_string(buf)
    return _fields_v1(buf)


def _element(elem: str, wt: int, val: Any, message: str, num: int, f: _Field) -> Any:
    if elem in _SCALARS:
        return _scalar(elem, wt, val, message, num, f)
    if wt != _LEN:
        raise ProtobufDecodeError(f"{_where(message, num, f)} should be a message, got wire type {wt}")
    if elem in _SPECIAL:
        return _special(elem, val)
    return _decode_message(val, elem)


def _map_entry(buf: bytes, elem: str, message: str, num: int, f: _Field) -> tuple[str, Any]:
    key: str = ""
    value: Any = None
    for n, wt, val in _fields(buf, f"{message}.{f.name} entry"):
        if n == 1:
            if wt != _LEN:
                raise ProtobufDecodeError(f"map key of {_where(message, num, f)} is not a string")
            key = val.decode("utf-8")
        elif n == 2:
            value = _element(elem, wt, val, message, num, f)
        else:
            raise ProtobufDecodeError(f"unexpected field {n} in a map entry of {_where(message, num, f)}")
    if value is None:
        value = _default_element(elem)
    return key, value


def _default_element(elem: str) -> Any:
    if elem in _SCALARS:
        return _ZERO[elem]
    if elem in _SPECIAL:
        return _special(elem, b"")
    return _decode_message(b"", elem)


def _decode_message(buf: bytes, message: str) -> dict[str, Any]:
    fields = _compiled(message)
    out: dict[str, Any] = {}
    inline: list[dict[str, Any]] = []
    seen: set[int] = set()
    for num, wt, val in _fields(buf, message):
        f = fields.get(num)
        if f is None:
            raise ProtobufDecodeError(f"unknown field {num} (wire type {wt}) in {message}")
        if f.mode == "unsupported":
            raise ProtobufDecodeError(
                f"{_where(message, num, f)} ({f.raw_type}) is not supported in protobuf bodies by this "
                "server; send the object as application/json"
            )
        seen.add(num)
        if f.mode == "inline":
            if wt != _LEN:
                raise ProtobufDecodeError(
                    f"{_where(message, num, f)} should be a message, got wire type {wt}"
                )
            inline.append(_decode_message(val, f.elem))
        elif f.shape == "map":
            if wt != _LEN:
                raise ProtobufDecodeError(
                    f"{_where(message, num, f)} should be a map entry, got wire type {wt}"
                )
            k, v = _map_entry(val, f.elem, message, num, f)
            out.setdefault(f.name, {})[k] = v
        elif f.shape == "list":
            items = out.setdefault(f.name, [])
            if wt == _LEN and f.elem in ("int32", "int64", "bool"):
                # Packed encoding: a run of varints in one length-delimited field.
                pos = 0
                while pos < len(val):
                    v, pos = _varint(val, pos, len(val))
                    items.append(_scalar(f.elem, _VARINT, v, message, num, f))
            else:
                items.append(_element(f.elem, wt, val, message, num, f))
        else:
            out[f.name] = _element(f.elem, wt, val, message, num, f)

    # Go's JSON encoder decides what a JSON client would have written; apply its rules.
    result: dict[str, Any] = {}
    for num, f in fields.items():
        if f.mode in ("inline", "unsupported"):
            continue
        present = num in seen
        if f.shape in ("list", "map"):
            if present:
                result[f.name] = out[f.name]
            elif f.mode == "always":
                result[f.name] = None  # a nil slice/map without omitempty is null
        elif f.mode == "ptr":
            if present:
                result[f.name] = out[f.name]
        elif f.elem in _SCALARS:
            value = out[f.name] if present else _ZERO[f.elem]
            if f.mode == "always" or value != _ZERO[f.elem]:
                result[f.name] = value
        else:
            # Structs held by value are always written, including Time (null when zero),
            # Quantity ("0") and IntOrString (0).
            result[f.name] = out[f.name] if present else _default_element(f.elem)
    for extra in inline:
        result.update(extra)
    return result


# ---------------------------------------------------------------------------------- entry


def _envelope(body: bytes) -> tuple[str, str, bytes, str, str]:
    api_version = kind = content_encoding = content_type = ""
    raw = b""
    for num, wt, val in _fields(body[len(MAGIC) :], "runtime.Unknown"):
        if wt != _LEN:
            raise ProtobufDecodeError(f"unexpected wire type {wt} for field {num} of runtime.Unknown")
        if num == 1:
            for n, w, v in _fields(val, "runtime.TypeMeta"):
                if w != _LEN:
                    raise ProtobufDecodeError(f"unexpected wire type {w} for field {n} of runtime.TypeMeta")
                if n == 1:
                    api_version = v.decode("utf-8")
                elif n == 2:
                    kind = v.decode("utf-8")
        elif num == 2:
            raw = val
        elif num == 3:
            content_encoding = val.decode("utf-8")
        elif num == 4:
            content_type = val.decode("utf-8")
    return api_version, kind, raw, content_encoding, content_type


def decode_k8s_protobuf(body: bytes, registry: Any) -> dict[str, Any]:
    """A Kubernetes protobuf body -> the JSON dict a JSON client would have sent for it."""
    if not body.startswith(MAGIC):
        raise ProtobufDecodeError('the body does not start with the Kubernetes protobuf prefix "k8s\\x00"')
    try:
        api_version, kind, raw, encoding, inner_type = _envelope(body)
    except UnicodeDecodeError:
        raise ProtobufDecodeError("runtime.Unknown carries a string that is not valid UTF-8") from None
    if encoding:
        raise ApiException(
            415,
            "UnsupportedMediaType",
            f"protobuf bodies with content encoding {encoding!r} are not supported",
        )
    if inner_type not in ("", CONTENT_TYPE):
        raise ApiException(
            415,
            "UnsupportedMediaType",
            f"the protobuf envelope carries an unsupported content type {inner_type!r}",
        )
    if not kind or not api_version:
        raise ProtobufDecodeError("runtime.Unknown has no apiVersion/kind")
    if registry.by_api_version_kind(api_version, kind) is None and (api_version, kind) not in SUBRESOURCE_KINDS:
        raise bad_request(f'no kind "{kind}" is registered for version "{api_version}"')
    message = KINDS.get((api_version, kind))
    if message is None:
        raise ApiException(
            415,
            "UnsupportedMediaType",
            f"this server cannot decode {kind} ({api_version}) from protobuf; send it as application/json",
        )
    try:
        decoded = _decode_message(raw, message)
    except UnicodeDecodeError:
        raise ProtobufDecodeError(f"a string in the {kind} is not valid UTF-8") from None
    return {"kind": kind, "apiVersion": api_version, **decoded}
