"""Services."""

from __future__ import annotations

import ipaddress

from gpufleet.api import k8s
from gpufleet.api.validation.containers import PORT_PROTOCOLS, _validate_port_num_or_name
from gpufleet.api.validation.core import (
    Errs,
    _enum,
    _int_or_string,
    _names,
    validate_labels,
    validate_object_meta,
)
from gpufleet.api.validation.errors import Unquoted, duplicate, forbidden, invalid, required
from gpufleet.api.validation.names import (
    NODE_PORT_RANGE,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_qualified_name,
    is_valid_port_num,
    name_is_dns1035_label,
)

SERVICE_TYPES = ["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"]
SESSION_AFFINITIES = ["ClientIP", "None"]


def _valid_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _validate_service(svc: k8s.Service, errs: Errs) -> None:
    validate_object_meta(svc.metadata, errs, name_fn=name_is_dns1035_label)
    spec = svc.spec or k8s.ServiceSpec()
    headless = spec.cluster_ip == "None"
    ports = spec.ports or []
    _enum(spec.type, "spec.type", SERVICE_TYPES, errs)
    if not ports and not headless and spec.type != "ExternalName":
        errs.append(required("spec.ports"))
    if spec.type == "ExternalName":
        cname = (spec.external_name or "").removesuffix(".")
        if cname:
            _names(cname, "spec.externalName", is_dns1123_subdomain, errs)
        else:
            errs.append(required("spec.externalName"))
    if spec.cluster_ip not in (None, "", "None") and not _valid_ip(spec.cluster_ip):
        errs.append(
            invalid(
                "spec.clusterIP",
                spec.cluster_ip,
                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            )
        )
    if headless and spec.type in ("LoadBalancer", "NodePort"):
        errs.append(
            invalid("spec.clusterIP", spec.cluster_ip, f"may not be set to 'None' for {spec.type} services")
        )

    names: set[str] = set()
    seen_ports: set[tuple[str, int]] = set()
    seen_node_ports: set[tuple[str, int]] = set()
    for i, port in enumerate(ports):
        p = f"spec.ports[{i}]"
        if len(ports) > 1 and not port.name:
            errs.append(required(f"{p}.name"))
        elif port.name:
            _names(port.name, f"{p}.name", is_dns1123_label, errs)
            if port.name in names:
                errs.append(duplicate(f"{p}.name", port.name))
            names.add(port.name)
        errs.extend(invalid(f"{p}.port", port.port, m) for m in is_valid_port_num(port.port))
        _enum(port.protocol, f"{p}.protocol", PORT_PROTOCOLS, errs)
        target = _int_or_string(port.target_port, f"{p}.targetPort", errs)
        if target not in (None, 0, ""):
            _validate_port_num_or_name(target, f"{p}.targetPort", errs)
        if port.app_protocol is not None:
            _names(port.app_protocol, f"{p}.appProtocol", is_qualified_name, errs)
        protocol = port.protocol or "TCP"
        if (protocol, port.port) in seen_ports:
            errs.append(duplicate(p, Unquoted(f"{port.port}/{protocol}")))
        seen_ports.add((protocol, port.port))
        if port.node_port:
            if spec.type in (None, "ClusterIP"):
                errs.append(forbidden(f"{p}.nodePort", "may not be used when `type` is 'ClusterIP'"))
            elif not NODE_PORT_RANGE[0] <= port.node_port <= NODE_PORT_RANGE[1]:
                errs.append(
                    invalid(
                        f"{p}.nodePort",
                        port.node_port,
                        "provided port is not in the valid range. The range of valid ports is "
                        f"{NODE_PORT_RANGE[0]}-{NODE_PORT_RANGE[1]}",
                    )
                )
            if (protocol, port.node_port) in seen_node_ports:
                errs.append(duplicate(f"{p}.nodePort", port.node_port))
            seen_node_ports.add((protocol, port.node_port))

    if spec.selector is not None:
        validate_labels(spec.selector, "spec.selector", errs)
    _enum(spec.session_affinity, "spec.sessionAffinity", SESSION_AFFINITIES, errs)
    if spec.session_affinity == "None" and spec.session_affinity_config is not None:
        errs.append(forbidden("spec.sessionAffinityConfig", "must not be set when session affinity is None"))
    for i, ip in enumerate(spec.external_ips or []):
        if not _valid_ip(ip):
            errs.append(
                invalid(
                    f"spec.externalIPs[{i}]",
                    ip,
                    "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                )
            )


def _validate_service_update(new: k8s.Service, old: k8s.Service, errs: Errs) -> None:
    new_ip = new.spec.cluster_ip if new.spec else None
    old_ip = old.spec.cluster_ip if old.spec else None
    # An update that leaves clusterIP out keeps the allocated one (the server copies it over).
    if old_ip and new_ip and new_ip != old_ip:
        errs.append(invalid("spec.clusterIP", new_ip, "field is immutable"))
