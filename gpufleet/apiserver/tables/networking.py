"""Printers for networking.k8s.io/v1: Ingress, IngressClass, NetworkPolicy, and for
discovery.k8s.io/v1 EndpointSlice (kube-apiserver's printIngress, printIngressClass,
printNetworkPolicy, printEndpointSlice)."""

from __future__ import annotations

from typing import Any

from gpufleet.apiserver.tables.core import (
    AGE_COLUMN,
    NAME_COLUMN,
    Column,
    Obj,
    _name,
    _spec,
    _status,
    age_cell,
    format_label_selector,
    register_printer,
)

GROUP = "networking.k8s.io"


def ingress_hosts(rules: list[dict[str, Any]] | None) -> str:
    """The first three hosts, then "+ N more..."; "*" when no rule names one."""
    rules = rules or []
    hosts: list[str] = []
    more = False
    for rule in rules:
        if len(hosts) == 3:
            more = True
        if not more and rule.get("host"):
            hosts.append(rule["host"])
    if not hosts:
        return "*"
    return ",".join(hosts) + (f" + {len(rules) - 3} more..." if more else "")


def ingress_address(status: dict[str, Any]) -> str:
    found = set()
    for ing in (status.get("loadBalancer") or {}).get("ingress") or []:
        if ing.get("ip"):
            found.add(ing["ip"])
        elif ing.get("hostname"):
            found.add(ing["hostname"])
    return ",".join(sorted(found))


def _ingress_row(obj: Obj, now: float) -> list[Any]:
    spec = _spec(obj)
    return [_name(obj), spec.get("ingressClassName") or "<none>", ingress_hosts(spec.get("rules")),
            ingress_address(_status(obj)), "80, 443" if spec.get("tls") else "80", age_cell(obj, now)]


_INGRESS_COLUMNS = (
    NAME_COLUMN,
    Column("Class", description="The name of the IngressClass resource that should be used for additional "
                                "configuration"),
    Column("Hosts", description="Hosts that incoming requests are matched against before the ingress rule"),
    Column("Address", description="Address is a list containing ingress points for the load-balancer"),
    Column("Ports", description="Ports of TLS configurations that open"),
    AGE_COLUMN,
)


def _ingress_class_row(obj: Obj, now: float) -> list[Any]:
    spec = _spec(obj)
    params = spec.get("parameters")
    shown = "<none>"
    if params:
        shown = params.get("kind", "") + (f".{params['apiGroup']}" if params.get("apiGroup") else "")
        shown += "/" + params.get("name", "")
    return [_name(obj), spec.get("controller", ""), shown, age_cell(obj, now)]


_INGRESS_CLASS_COLUMNS = (
    NAME_COLUMN,
    Column("Controller", description="Controller that is responsible for handling this class"),
    Column("Parameters", description="A reference to a resource with additional parameters"),
    AGE_COLUMN,
)


def _network_policy_row(obj: Obj, now: float) -> list[Any]:
    return [_name(obj), format_label_selector(_spec(obj).get("podSelector")), age_cell(obj, now)]


_NETWORK_POLICY_COLUMNS = (
    NAME_COLUMN,
    Column("Pod-Selector", description="Selects the pods to which this NetworkPolicy object applies."),
    AGE_COLUMN,
)

register_printer("Ingress", _INGRESS_COLUMNS, _ingress_row, group=GROUP)
register_printer("IngressClass", _INGRESS_CLASS_COLUMNS, _ingress_class_row, group=GROUP)
register_printer("NetworkPolicy", _NETWORK_POLICY_COLUMNS, _network_policy_row, group=GROUP)


# discovery.k8s.io/v1 (kube-apiserver's printEndpointSlice)

def _list_with_more(items: list[str], count: int, limit: int = 3) -> str:
    """listWithMoreString: the first three, then " + N more..."; "<unset>" for none."""
    if count > limit:
        return ",".join(items[:limit]) + f" + {count - limit} more..."
    return ",".join(items) or "<unset>"


def discovery_ports(ports: list[dict[str, Any]] | None) -> str:
    shown = [str(p["port"]) if p.get("port") is not None else (p.get("name") or "*") for p in ports or []]
    return _list_with_more(shown, len(shown))


def discovery_endpoints(endpoints: list[dict[str, Any]] | None) -> str:
    addresses = [a for ep in endpoints or [] for a in ep.get("addresses") or []]
    return _list_with_more(addresses, len(addresses))


def _endpoint_slice_row(obj: Obj, now: float) -> list[Any]:
    return [_name(obj), obj.get("addressType", ""), discovery_ports(obj.get("ports")),
            discovery_endpoints(obj.get("endpoints")), age_cell(obj, now)]


_ENDPOINT_SLICE_COLUMNS = (
    NAME_COLUMN,
    Column("AddressType", description="addressType specifies the type of address carried by this EndpointSlice."),
    Column("Ports", description="ports specifies the list of network ports exposed by each endpoint in this "
                                "slice."),
    Column("Endpoints", description="endpoints is a list of unique endpoints in this slice."),
    AGE_COLUMN,
)

register_printer("EndpointSlice", _ENDPOINT_SLICE_COLUMNS, _endpoint_slice_row, group="discovery.k8s.io")
