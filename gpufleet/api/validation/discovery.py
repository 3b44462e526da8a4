"""discovery.k8s.io/v1: EndpointSlice, as pkg/apis/discovery/validation words it."""

from __future__ import annotations

import ipaddress

from gpufleet.api import k8s
from gpufleet.api.validation.core import Errs, _immutable, _names, validate_object_meta
from gpufleet.api.validation.errors import duplicate, invalid, not_supported, required, too_long
from gpufleet.api.validation.names import (
    is_dns1123_label,
    is_dns1123_subdomain,
    is_label_value,
    is_qualified_name,
    is_valid_port_name,
    is_valid_port_num,
)

ADDRESS_TYPES = ["FQDN", "IPv4", "IPv6"]
PROTOCOLS = ["SCTP", "TCP", "UDP"]
MAX_ENDPOINTS = 1000
MAX_ADDRESSES = 100
MAX_PORTS = 20000
MAX_HINTS = 8


def _validate_address(address: str, address_type: str, path: str, errs: Errs) -> None:
    if address_type == "FQDN":
        _names(address, path, is_dns1123_subdomain, errs)
        return
    want = ipaddress.IPv4Address if address_type == "IPv4" else ipaddress.IPv6Address
    try:
        ok = isinstance(ipaddress.ip_address(address), want)
    except ValueError:
        ok = False
    if not ok:
        errs.append(invalid(path, address, f"must be a valid {address_type} address"))


def _validate_endpoint_slice(es: k8s.EndpointSlice, errs: Errs) -> None:
    validate_object_meta(es.metadata, errs)
    address_type = es.address_type
    if address_type not in ADDRESS_TYPES:
        errs.append(not_supported("addressType", address_type, ADDRESS_TYPES))
    endpoints = es.endpoints or []
    if len(endpoints) > MAX_ENDPOINTS:
        errs.append(too_long("endpoints", MAX_ENDPOINTS))
    for i, ep in enumerate(endpoints):
        p = f"endpoints[{i}]"
        if not ep.addresses:
            errs.append(required(f"{p}.addresses", "must contain at least 1 address"))
        elif len(ep.addresses) > MAX_ADDRESSES:
            errs.append(too_long(f"{p}.addresses", MAX_ADDRESSES))
        if address_type in ADDRESS_TYPES:
            for j, address in enumerate(ep.addresses or []):
                _validate_address(address, address_type, f"{p}.addresses[{j}]", errs)
        if ep.hostname:
            _names(ep.hostname, f"{p}.hostname", is_dns1123_label, errs)
        if ep.node_name:
            _names(ep.node_name, f"{p}.nodeName", is_dns1123_subdomain, errs)
        if ep.zone:
            _names(ep.zone, f"{p}.zone", is_label_value, errs)
        for j, zone in enumerate((ep.hints.for_zones if ep.hints is not None else None) or []):
            if j == MAX_HINTS:
                errs.append(too_long(f"{p}.hints.forZones", MAX_HINTS))
                break
            _names(zone.name, f"{p}.hints.forZones[{j}].name", is_label_value, errs)
    ports = es.ports or []
    if len(ports) > MAX_PORTS:
        errs.append(too_long("ports", MAX_PORTS))
    seen: set[str] = set()
    for i, port in enumerate(ports):
        p = f"ports[{i}]"
        name = port.name or ""
        if name:
            for msg in is_valid_port_name(name):
                errs.append(invalid(f"{p}.name", name, msg))
        if name in seen:
            errs.append(duplicate(f"{p}.name", name))
        seen.add(name)
        if port.protocol is None:
            errs.append(required(f"{p}.protocol", "one of SCTP, TCP, UDP"))
        elif port.protocol not in PROTOCOLS:
            errs.append(not_supported(f"{p}.protocol", port.protocol, PROTOCOLS))
        if port.port is not None:
            for msg in is_valid_port_num(port.port):
                errs.append(invalid(f"{p}.port", port.port, msg))
        if port.app_protocol:
            _names(port.app_protocol, f"{p}.appProtocol", is_qualified_name, errs)


def _validate_endpoint_slice_update(es: k8s.EndpointSlice, old: k8s.EndpointSlice, errs: Errs) -> None:
    _immutable(es.address_type, old.address_type, "addressType", errs)
