"""Turns a URL into what it addresses, the way kube-apiserver's RequestInfoFactory does."""

from __future__ import annotations

from dataclasses import dataclass

# Subresources of a Namespace object itself: /api/v1/namespaces/{name}/status
_NAMESPACE_SUBRESOURCES = {"status", "finalize"}


@dataclass
class RequestInfo:
    is_resource_request: bool
    verb: str = ""
    group: str = ""
    version: str = ""
    namespace: str = ""
    resource: str = ""
    name: str = ""
    subresource: str = ""
    path: str = ""
    # The request's ?fieldSelector= and ?labelSelector= as given (the Node authorizer scopes a
    # node's reads of pods and of its local volumes by them).
    field_selector: str = ""
    label_selector: str = ""


def parse_request(method: str, path: str, is_watch: bool, field_selector: str = "",
                  label_selector: str = "") -> RequestInfo:
    """``.../proxy/<more>`` keeps ``proxy`` as the subresource, whatever follows it (the path
    the proxy forwards), as Kubernetes does."""
    parts = [p for p in path.split("/") if p]
    # A non-resource request's verb is the lower-cased HTTP method, as RBAC matches it.
    info = RequestInfo(is_resource_request=False, path=path, verb=method.lower())
    if not parts or parts[0] not in ("api", "apis"):
        return info
    if parts[0] == "api":
        if len(parts) < 3:
            return info
        info.group, info.version = "", parts[1]
        rest = parts[2:]
    else:
        if len(parts) < 4:
            return info
        info.group, info.version = parts[1], parts[2]
        rest = parts[3:]

    # Deprecated /watch/ prefix, still accepted by Kubernetes.
    if rest and rest[0] == "watch":
        is_watch = True
        rest = rest[1:]
        if not rest:
            return info

    if rest[0] == "namespaces":
        if len(rest) > 1:
            info.namespace = rest[1]
            if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
                rest = rest[2:]
            else:
                # The Namespace object itself (and its status/finalize subresources).
                info.namespace = ""
                info.resource = "namespaces"
                info.name = rest[1]
                info.subresource = rest[2] if len(rest) > 2 else ""
                rest = []
        else:
            info.resource = "namespaces"
            rest = []
    if rest:
        info.resource = rest[0]
        if len(rest) > 1:
            info.name = rest[1]
        if len(rest) > 2:
            info.subresource = rest[2]
        if len(rest) > 3 and rest[2] != "proxy":
            return RequestInfo(is_resource_request=False, path=path, verb=method.lower())

    info.is_resource_request = True
    info.field_selector = field_selector
    info.label_selector = label_selector
    m = method.upper()
    if info.subresource == "proxy":
        # A proxied request's verb is its method's, whatever its query says (?watch is the
        # backend's business).
        is_watch = False
    if m in ("GET", "HEAD"):
        if is_watch:
            info.verb = "watch"
        else:
            info.verb = "get" if info.name else "list"
    elif m == "POST":
        info.verb = "create"
    elif m == "PUT":
        info.verb = "update"
    elif m == "PATCH":
        info.verb = "patch"
    elif m == "DELETE":
        info.verb = "delete" if info.name else "deletecollection"
    else:
        info.verb = m.lower()
    return info
