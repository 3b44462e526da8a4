"""What both OpenAPI documents share: content types, schema package names, query parameters.
"""

from __future__ import annotations

from gpufleet.api.registry import ResourceType

OPENAPI_V2_CONTENT_TYPE = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
"""What to answer /openapi/v2 with. kubectl asks for `…spec.v2@v1.0+protobuf`, but Go's MIME
parser rejects the '@', so echoing the Accept header breaks it."""

_META_PACKAGE = "io.k8s.apimachinery.pkg.apis.meta.v1"
_META_TYPES = frozenset(
    {
        "ObjectMeta",
        "ListMeta",
        "OwnerReference",
        "ManagedFieldsEntry",
        "LabelSelector",
        "LabelSelectorRequirement",
        "Condition",
        "Time",
        "MicroTime",
        "Status",
        "StatusDetails",
        "StatusCause",
        "Preconditions",
        "DeleteOptions",
        "FieldsV1",
        "ShardInfo",
    }
)
# Shared types that Kubernetes files under core/v1 but that no core kind served here embeds.
_CORE_TYPES = frozenset({"PodTemplateSpec", "TopologySelectorTerm", "TopologySelectorLabelRequirement"})

# Patch strategy and merge key of well-known lists, by property name (Kubernetes' Go tags).
_PATCH_META: dict[str, tuple[str, str | None]] = {
    "containers": ("merge", "name"),
    "initContainers": ("merge", "name"),
    "ephemeralContainers": ("merge", "name"),
    "volumes": ("merge,retainKeys", "name"),
    "env": ("merge", "name"),
    "imagePullSecrets": ("merge", "name"),
    "volumeMounts": ("merge", "mountPath"),
    "volumeDevices": ("merge", "devicePath"),
    "hostAliases": ("merge", "ip"),
    "conditions": ("merge", "type"),
    "ownerReferences": ("merge", "uid"),
    "finalizers": ("merge", None),
}
# `ports` means different things in a container and in a service.
_PORTS_MERGE_KEY = {"ContainerPort": "containerPort", "ServicePort": "port"}

_QUERY_DESCRIPTIONS = {
    "dryRun": "When present, indicates that modifications should not be persisted. Valid value: All.",
    "fieldManager": "A name associated with the actor or entity that is making these changes.",
    "fieldValidation": "How the server treats unknown or duplicate fields: Ignore, Warn or Strict.",
    "force": 'Force is going to "force" Apply requests, re-acquiring conflicting fields.',
    "gracePeriodSeconds": "The duration in seconds before the object should be deleted.",
    "propagationPolicy": "Whether and how garbage collection will be performed: Orphan, Background, Foreground.",
    "labelSelector": "A selector to restrict the list of returned objects by their labels.",
    "fieldSelector": "A selector to restrict the list of returned objects by their fields.",
    "limit": "The maximum number of responses to return for a list call.",
    "continue": "The continue token of the previous page of a list call.",
    "resourceVersion": "Which resource versions the request may be served from.",
    "resourceVersionMatch": "How resourceVersion is applied to list calls.",
    "timeoutSeconds": "Timeout for the list/watch call.",
    "watch": "Watch for changes to the described resources and return them as a stream of events.",
    "allowWatchBookmarks": "Requests watch events with type BOOKMARK.",
}
_QUERY_TYPES = {
    "force": "boolean",
    "watch": "boolean",
    "allowWatchBookmarks": "boolean",
    "gracePeriodSeconds": "integer",
    "limit": "integer",
    "timeoutSeconds": "integer",
}
_WRITE_PARAMS = ("dryRun", "fieldManager", "fieldValidation")
_LIST_PARAMS = (
    "allowWatchBookmarks",
    "continue",
    "fieldSelector",
    "labelSelector",
    "limit",
    "resourceVersion",
    "resourceVersionMatch",
    "timeoutSeconds",
    "watch",
)
_DELETE_PARAMS = ("dryRun", "gracePeriodSeconds", "propagationPolicy")


def gv_path(group: str, version: str) -> str:
    """The key of a group-version in the v3 index: 'api/v1', 'apis/apps/v1'."""
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def schema_package(group: str, version: str) -> str:
    """The prefix Kubernetes gives a group-version's schema names.

    Built-in groups: io.k8s.api.<first label>.<version> (core for ''); other groups take the
    reversed domain, as CRD schemas do (kubeflow.org/v1 -> org.kubeflow.v1).
    """
    if not group:
        return f"io.k8s.api.core.{version}"
    labels = group.split(".")
    if len(labels) == 1 or group.endswith(".k8s.io"):
        return f"io.k8s.api.{labels[0]}.{version}"
    return ".".join([*reversed(labels), version])


def _camel(text: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in text.replace("-", ".").split(".") if p)


def _operation_prefix(rt: ResourceType) -> str:
    if not rt.group:
        group = "Core"
    elif "." not in rt.group or rt.group.endswith(".k8s.io"):
        group = _camel(rt.group.split(".")[0])
    else:
        group = _camel(rt.group)
    return group + _camel(rt.version)


def _gvk(rt: ResourceType) -> dict[str, str]:
    return {"group": rt.group, "kind": rt.kind, "version": rt.version}
