"""API discovery: legacy (APIVersions/APIGroupList/APIResourceList) and aggregated (apidiscovery v2/v2beta1).

kubectl 1.30+ asks for aggregated discovery v2, 1.27-1.29 for v2beta1; it reads the Content-Type
to decide how to decode, so the negotiated type is echoed exactly.
"""

from __future__ import annotations

from typing import Any

from gpufleet.api.registry import Registry, ResourceType

GIT_VERSION = "v1.32.4"
VERSION_INFO = {
    "major": "1",
    "minor": "32",
    "gitVersion": GIT_VERSION,
    "gitCommit": "gpufleet",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_AGG = "application/json;g=apidiscovery.k8s.io;v={v};as=APIGroupDiscoveryList"

# Subresources with their own response kind; the rest answer with the parent's kind.
_SUBRESOURCE_KINDS: dict[str, tuple[str, str, str]] = {
    "scale": ("autoscaling", "v1", "Scale"),
    "binding": ("", "v1", "Binding"),
    "eviction": ("policy", "v1", "Eviction"),
    "token": ("authentication.k8s.io", "v1", "TokenRequest"),
    "exec": ("", "v1", "PodExecOptions"),
    "attach": ("", "v1", "PodAttachOptions"),
    "portforward": ("", "v1", "PodPortForwardOptions"),
}
_SUBRESOURCE_VERBS: dict[str, list[str]] = {
    "status": ["get", "patch", "update"],
    "scale": ["get", "patch", "update"],
    "log": ["get"],
    "binding": ["create"],
    "eviction": ["create"],
    "token": ["create"],
    "finalize": ["update"],
    "exec": ["create", "get"],
    "attach": ["create", "get"],
    "portforward": ["create", "get"],
    # Proxying to a pod or a Service takes every method (nodes/proxy here only GET).
    "pods/proxy": ["create", "delete", "get", "patch", "update"],
    "services/proxy": ["create", "delete", "get", "patch", "update"],
}


def _subresource_verbs(rt: ResourceType, sub: str) -> list[str]:
    return _SUBRESOURCE_VERBS.get(f"{rt.plural}/{sub}") or _SUBRESOURCE_VERBS.get(sub, ["get"])


def negotiate_aggregated(accept: str) -> str | None:
    """'v2' or 'v2beta1' when the client accepts aggregated discovery, else None."""
    accept = accept.replace(" ", "")
    for part in accept.split(","):
        if "as=APIGroupDiscoveryList" in part and "g=apidiscovery.k8s.io" in part:
            if "v=v2beta1" in part:
                return "v2beta1"
            if "v=v2" in part:
                return "v2"
    return None


def aggregated_content_type(version: str) -> str:
    return _AGG.format(v=version)


def _resource_entry(rt: ResourceType) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "resource": rt.plural,
        "responseKind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        "scope": "Namespaced" if rt.namespaced else "Cluster",
        "singularResource": rt.singular,
        "verbs": list(rt.verbs),
    }
    if rt.short_names:
        entry["shortNames"] = list(rt.short_names)
    if rt.categories:
        entry["categories"] = list(rt.categories)
    subs = []
    for sub in rt.subresources:
        g, v, k = _SUBRESOURCE_KINDS.get(sub, (rt.group, rt.version, rt.kind))
        subs.append({
            "subresource": sub,
            "responseKind": {"group": g, "version": v, "kind": k},
            "verbs": _subresource_verbs(rt, sub),
        })
    if subs:
        entry["subresources"] = subs
    return entry


def aggregated(registry: Registry, version: str, core: bool, extra_groups: list[dict] | None = None) -> dict:
    items = []
    for group, versions in registry.groups().items():
        if (group == "") != core:
            continue
        items.append({
            "metadata": {"name": group, "creationTimestamp": None},
            "versions": [
                {
                    "version": v,
                    "freshness": "Current",
                    "resources": [
                        _resource_entry(rt) for rt in registry.served() if rt.group == group and rt.version == v
                    ],
                }
                for v in versions
            ],
        })
    if not core and extra_groups:
        items.extend(extra_groups)
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": f"apidiscovery.k8s.io/{version}",
        "metadata": {},
        "items": items,
    }


def api_versions() -> dict:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
    }


def _group_entry(group: str, versions: list[str]) -> dict:
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}


def api_group_list(registry: Registry, extra: list[tuple[str, list[str]]] = ()) -> dict:
    groups = [_group_entry(g, vs) for g, vs in registry.groups().items() if g]
    groups += [_group_entry(g, vs) for g, vs in extra]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(registry: Registry, group: str) -> dict | None:
    versions = registry.groups().get(group)
    if not versions or not group:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_entry(group, versions)}


def api_resource_list(registry: Registry, group: str, version: str) -> dict | None:
    types = [rt for rt in registry.served() if rt.group == group and rt.version == version]
    if not types:
        return None
    resources = []
    for rt in types:
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(rt.verbs),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        for sub in rt.subresources:
            g, v, k = _SUBRESOURCE_KINDS.get(sub, (rt.group, rt.version, rt.kind))
            sub_entry: dict[str, Any] = {
                "name": f"{rt.plural}/{sub}",
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": k,
                "verbs": _subresource_verbs(rt, sub),
            }
            if g != rt.group or v != rt.version:
                sub_entry["group"], sub_entry["version"] = g, v
            resources.append(sub_entry)
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}
