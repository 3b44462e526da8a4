"""{nodes,pods,services}/{name}/proxy/...: requests passed on, as kube-apiserver's proxy
subresources.

- nodes/{name}/proxy/{path} (GET): to the node agent (ApiServer.node_proxy_provider).
- pods/{[scheme:]name[:port]}/proxy/{path}, every method: to the pod's port (a number, or a
  container port's name; default its first container port), relayed by the pod's node agent
  (ApiServer.pod_proxy_provider).
- services/{[scheme:]name[:port]}/proxy/{path}, every method: to a ready endpoint of the
  Service, picked at random among the pods of its Endpoints for that Service port (by name,
  or by number as the port it declares; default the unnamed port), relayed likewise.

The name parts are kube-apiserver's (``SplitSchemeNamePort``): ``name``, ``name:port`` or
``scheme:name:port`` with scheme http or https. RBAC sees the verb of the HTTP method (GET
get, POST create, PUT update, PATCH patch, DELETE delete) on ``pods/proxy`` or
``services/proxy``. A Service without ready endpoints is a 503 ``no endpoints available for
service "x"``; an address that is not a pod's (no targetRef) is not proxied to, as upstream.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from gpufleet.apiserver.errors import ApiException, bad_request, method_not_allowed
from gpufleet.apiserver.subresources.base import Subresource

if TYPE_CHECKING:
    from gpufleet.apiserver.handlers.scope import Scope
    from gpufleet.utils.http import RawResponse

_SCHEMES = ("", "http", "https")


def split_scheme_name_port(id_: str) -> tuple[str, str, str] | None:
    """(scheme, name, port) of ``name``, ``name:port`` or ``scheme:name:port``; None when it is
    none of those (kube's utilnet.SplitSchemeNamePort)."""
    parts = id_.split(":")
    if len(parts) == 1:
        scheme, name, port = "", parts[0], ""
    elif len(parts) == 2:
        scheme, name, port = "", parts[0], parts[1]
    elif len(parts) == 3:
        scheme, name, port = parts
    else:
        return None
    if not name or scheme not in _SCHEMES:
        return None
    return scheme, name, port


def _unavailable(message: str) -> ApiException:
    return ApiException(503, "ServiceUnavailable", message)


class Proxy(Subresource):
    name = "proxy"
    takes_write_options = False

    async def serve(self, scope: Scope) -> RawResponse:
        path = scope.req.path
        prefix = f"/{scope.rt.plural}/{scope.name}/proxy"
        rest = (path[path.index(prefix) + len(prefix):] if prefix in path else "") or "/"
        if scope.rt.plural == "nodes":
            if scope.info.verb != "get":
                raise method_not_allowed()
            provider = scope.api.node_proxy_provider
            if provider is None:
                raise _unavailable(f"no node proxy is configured to reach node {scope.name}")
            return await provider(scope.name, rest, scope.req)
        if scope.rt.plural == "pods":
            pod, scheme, port = await _pod_location(scope)
        else:
            pod, scheme, port = await _service_location(scope)
        relay = scope.api.pod_proxy_provider
        if relay is None:
            raise _unavailable(f"no node agent is reachable to proxy to pod {pod['metadata']['name']}")
        return await relay(pod, scheme or "http", port, rest, scope.req)


async def _get(scope: Scope, plural: str, ns: str, name: str) -> dict[str, Any]:
    rt = scope.api.registry.by_key(plural)
    assert rt is not None
    return await scope.generic.get(rt, ns, name)


def _pod_ips(pod: dict[str, Any]) -> set[str]:
    status = pod.get("status") or {}
    return {status.get("podIP") or "", *((i or {}).get("ip", "") for i in status.get("podIPs") or [])} - {""}


def _check_placed(pod: dict[str, Any], name: str) -> None:
    if not (pod.get("spec") or {}).get("nodeName") or not _pod_ips(pod):
        raise bad_request(f'address not allowed: pod "{name}" has no IP yet (it is not running)')


async def _pod_location(scope: Scope) -> tuple[dict[str, Any], str, str]:
    split = split_scheme_name_port(scope.name)
    if split is None:
        raise bad_request(f'invalid pod request "{scope.name}"')
    scheme, name, port = split
    pod = await _get(scope, "pods", scope.ns, name)
    if not port:  # the first port a container declares, as upstream
        for c in (pod.get("spec") or {}).get("containers") or []:
            ports = c.get("ports") or []
            if ports:
                port = str(ports[0].get("containerPort") or "")
                break
    _check_placed(pod, name)
    return pod, scheme, port or ("443" if scheme == "https" else "80")


async def _service_location(scope: Scope) -> tuple[dict[str, Any], str, str]:
    split = split_scheme_name_port(scope.name)
    if split is None:
        raise bad_request(f'invalid service request "{scope.name}"')
    scheme, name, port = split
    svc = await _get(scope, "services", scope.ns, name)
    svc_ports = (svc.get("spec") or {}).get("ports") or []
    if port.isdigit():  # a number names the Service port that declares it
        named = next((p for p in svc_ports if str(p.get("port")) == port), None)
        if named is None:
            raise _unavailable(f'no service port {port} found for service "{name}"')
        port = named.get("name") or ""
    svc_port = next((p for p in svc_ports if (p.get("name") or "") == port), None)
    try:
        eps = await _get(scope, "endpoints", scope.ns, name)
    except ApiException as e:
        if e.code != 404:
            raise
        raise _unavailable(f'no endpoints available for service "{name}"') from None
    subsets = list(eps.get("subsets") or [])
    if not subsets:
        raise _unavailable(f'no endpoints available for service "{name}"')
    if svc_port is not None:
        random.shuffle(subsets)
        for ss in subsets:
            if not any((p.get("name") or "") == port for p in ss.get("ports") or []):
                continue
            addresses = list(ss.get("addresses") or [])
            random.shuffle(addresses)
            for addr in addresses:
                pod = await _endpoint_pod(scope, addr)
                if pod is not None:
                    target = svc_port.get("targetPort") or svc_port.get("port")
                    return pod, scheme, str(target)
    raise _unavailable(f'no endpoints available for service "{scope.name}"')


async def _endpoint_pod(scope: Scope, addr: dict[str, Any]) -> dict[str, Any] | None:
    """The running pod an Endpoints address names (its targetRef, with that IP), else None."""
    ref = addr.get("targetRef") or {}
    if ref.get("kind") != "Pod" or not ref.get("name"):
        return None
    try:
        pod = await _get(scope, "pods", ref.get("namespace") or scope.ns, ref["name"])
    except ApiException as e:
        if e.code == 404:
            return None
        raise
    if addr.get("ip") not in _pod_ips(pod) or not (pod.get("spec") or {}).get("nodeName"):
        return None
    return pod

