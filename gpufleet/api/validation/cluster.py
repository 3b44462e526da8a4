"""Cluster and configuration objects: PriorityClass, Namespace, Node, Endpoints, Lease, Event, ConfigMap, Secret, ServiceAccount."""

from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Iterable
from typing import Any

from gpufleet.api import k8s
from gpufleet.api.validation.containers import PREEMPTION_POLICIES
from gpufleet.api.validation.core import (
    STANDARD_FINALIZERS,
    Errs,
    _enum,
    _immutable,
    _names,
    _nonneg,
    _validate_quantity_value,
    _validate_resource_name,
    validate_object_meta,
)
from gpufleet.api.validation.errors import FieldError, duplicate, forbidden, invalid, required, too_long
from gpufleet.api.validation.names import (
    HIGHEST_USER_PRIORITY,
    MAX_SECRET_SIZE,
    SYSTEM_PRIORITY_CLASSES,
    is_config_map_key,
    is_dns1123_label,
    is_label_value,
    is_qualified_name,
    is_valid_port_num,
    name_is_dns_label,
)
from gpufleet.api.validation.pods import _validate_taint_effect
from gpufleet.api.validation.services import _valid_ip


def _validate_priority_class(pc: k8s.PriorityClass, errs: Errs) -> None:
    validate_object_meta(pc.metadata, errs, namespaced=False)
    name = pc.metadata.name if pc.metadata is not None else None
    value = pc.value or 0
    if name and name.startswith("system-"):
        known = SYSTEM_PRIORITY_CLASSES.get(name)
        if known is None:
            problem = f"{name} is not a known system priority class"
        elif known != value:
            problem = f"value of {name} PriorityClass must be {known}"
        else:
            problem = ""
        if problem:
            errs.append(
                forbidden(
                    "metadata.name",
                    f"priority class names with 'system-' prefix are reserved for system use only. error: {problem}",
                )
            )
    elif value > HIGHEST_USER_PRIORITY:
        errs.append(
            forbidden("value", f"maximum allowed value of a user defined priority is {HIGHEST_USER_PRIORITY}")
        )
    if pc.preemption_policy is not None:
        _enum(pc.preemption_policy, "preemptionPolicy", PREEMPTION_POLICIES, errs)


def _validate_priority_class_update(new: k8s.PriorityClass, old: k8s.PriorityClass, errs: Errs) -> None:
    if (new.value or 0) != (old.value or 0):
        errs.append(forbidden("value", "may not be changed in an update."))
    if new.preemption_policy is not None:
        _immutable(new.preemption_policy, old.preemption_policy, "preemptionPolicy", errs)


def _validate_namespace(ns: k8s.Namespace, errs: Errs) -> None:
    validate_object_meta(ns.metadata, errs, name_fn=name_is_dns_label, namespaced=False)
    for i, name in enumerate(ns.spec.finalizers or [] if ns.spec else []):
        p = f"spec.finalizers[{i}]"
        _names(name, p, is_qualified_name, errs)
        if "/" not in name and name not in STANDARD_FINALIZERS:
            errs.append(
                invalid(p, name, "name is neither a standard finalizer name nor is it fully qualified")
            )


def _validate_node(node: k8s.Node, errs: Errs) -> None:
    validate_object_meta(node.metadata, errs, namespaced=False)
    seen: set[tuple[str, str]] = set()
    for i, taint in enumerate(node.spec.taints or [] if node.spec else []):
        p = f"spec.taints[{i}]"
        _names(taint.key, f"{p}.key", is_qualified_name, errs)
        msgs = is_label_value(taint.value or "")
        if msgs:
            errs.append(invalid(f"{p}.value", taint.value, ";".join(msgs)))
        _validate_taint_effect(taint.effect, f"{p}.effect", errs)
        key = (taint.key, taint.effect)
        if key in seen:
            errs.append(duplicate(p, taint, "taints must be unique by key and effect pair"))
        seen.add(key)
    if node.status is not None:
        for attr in ("capacity", "allocatable"):
            for name, raw in (getattr(node.status, attr) or {}).items():
                p = f"status.{attr}[{name}]"
                _validate_resource_name(name, p, errs)
                _validate_quantity_value(name, raw, p, errs)


def validate_non_special_ip(ip: str, path: str) -> list[FieldError]:
    """Kubernetes' ValidateNonSpecialIP: an address that is not node-centric (unspecified,
    loopback, link-local unicast or multicast: the node itself, its metadata service)."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return [invalid(path, ip, "must be a valid IP address")]
    out = []
    if addr.is_unspecified:
        out.append(invalid(path, ip, f"may not be unspecified ({ip})"))
    if addr.is_loopback or (addr.version == 6 and addr.ipv4_mapped is not None and addr.ipv4_mapped.is_loopback):
        out.append(invalid(path, ip, "may not be in the loopback range (127.0.0.0/8, ::1/128)"))
    if addr.is_link_local and not addr.is_multicast:
        out.append(invalid(path, ip, "may not be in the link-local range (169.254.0.0/16, fe80::/10)"))
    if addr.is_multicast and addr in (_LL_MULTICAST_V4 if addr.version == 4 else _LL_MULTICAST_V6):
        out.append(invalid(path, ip, "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"))
    return out


_LL_MULTICAST_V4 = ipaddress.ip_network("224.0.0.0/24")
_LL_MULTICAST_V6 = ipaddress.ip_network("ff02::/16")


def endpoints_addresses(ep: dict[str, Any]) -> list[tuple[str, str]]:
    """(field path, ip) of every address of an Endpoints object (ready and not ready)."""
    out = []
    for i, subset in enumerate(ep.get("subsets") or [] if isinstance(ep.get("subsets"), list) else []):
        if not isinstance(subset, dict):
            continue
        for attr in ("addresses", "notReadyAddresses"):
            for j, addr in enumerate(subset.get(attr) or [] if isinstance(subset.get(attr), list) else []):
                if isinstance(addr, dict):
                    out.append((f"subsets[{i}].{attr}[{j}].ip", str(addr.get("ip") or "")))
    return out


def _validate_endpoints(ep: k8s.Endpoints, errs: Errs) -> None:
    """As Kubernetes' validateEndpointAddress and validateEndpointPort, less the node-centric
    ranges: those the EndpointsAddresses admission plugin refuses (its docstring says why)."""
    validate_object_meta(ep.metadata, errs)
    for i, subset in enumerate(ep.subsets or []):
        for attr, addresses in (("addresses", subset.addresses), ("notReadyAddresses", subset.not_ready_addresses)):
            for j, addr in enumerate(addresses or []):
                p = f"subsets[{i}].{attr}[{j}]"
                if not _valid_ip(addr.ip):
                    errs.append(invalid(f"{p}.ip", addr.ip, "must be a valid IP address"))
                if addr.hostname:
                    for msg in is_dns1123_label(addr.hostname):
                        errs.append(invalid(f"{p}.hostname", addr.hostname, msg))
        for k, port in enumerate(subset.ports or []):
            for msg in is_valid_port_num(port.port):
                errs.append(invalid(f"subsets[{i}].ports[{k}].port", port.port, msg))


def _validate_lease(lease: k8s.Lease, errs: Errs) -> None:
    validate_object_meta(lease.metadata, errs)
    spec = lease.spec
    if spec is None:
        return
    if spec.lease_duration_seconds is not None and spec.lease_duration_seconds <= 0:
        errs.append(
            invalid("spec.leaseDurationSeconds", spec.lease_duration_seconds, "must be greater than 0")
        )
    _nonneg(spec.lease_transitions, "spec.leaseTransitions", errs)


def _validate_event(event: k8s.Event, errs: Errs) -> None:
    validate_object_meta(event.metadata, errs)
    ref = event.involved_object
    if ref is None:
        errs.append(required("involvedObject"))
    else:
        namespace = event.metadata.namespace if event.metadata is not None else None
        # An event about a cluster-scoped object lives in "default" (or nowhere), as in Kubernetes.
        if namespace:
            if ref.namespace and ref.namespace != namespace:
                errs.append(
                    invalid("involvedObject.namespace", ref.namespace, "does not match event.namespace")
                )
            if not ref.namespace and namespace != "default":
                errs.append(invalid("involvedObject.namespace", "", "does not match event.namespace"))
    if event.type is not None:
        _enum(event.type, "type", ["Normal", "Warning"], errs)
    _nonneg(event.count, "count", errs)


def _validate_config_map(cm: k8s.ConfigMap, errs: Errs) -> None:
    validate_object_meta(cm.metadata, errs)
    total = 0
    for key, value in (cm.data or {}).items():
        _names(key, f"data[{key}]", is_config_map_key, errs)
        if key in (cm.binary_data or {}):
            errs.append(invalid(f"data[{key}]", key, "duplicate of key present in binaryData"))
        total += len(value.encode())
    for key, value in (cm.binary_data or {}).items():
        _names(key, f"binaryData[{key}]", is_config_map_key, errs)
        total += len(value)
    if total > MAX_SECRET_SIZE:
        errs.append(too_long("", MAX_SECRET_SIZE))


def _validate_immutable_data(new: Any, old: Any, attrs: Iterable[tuple[str, str]], errs: Errs) -> None:
    if not old.immutable:
        return
    if not new.immutable:
        errs.append(forbidden("immutable", "field is immutable when `immutable` is set"))
    for attr, alias in attrs:
        if (getattr(new, attr) or {}) != (getattr(old, attr) or {}):
            errs.append(forbidden(alias, "field is immutable when `immutable` is set"))


_SECRET_REQUIRED_KEYS = {
    "kubernetes.io/tls": ["tls.crt", "tls.key"],
    "kubernetes.io/dockerconfigjson": [".dockerconfigjson"],
    "kubernetes.io/ssh-auth": ["ssh-privatekey"],
}


def _validate_secret(secret: k8s.Secret, errs: Errs) -> None:
    validate_object_meta(secret.metadata, errs)
    total = 0
    data = secret.data or {}
    for key, value in data.items():
        _names(key, f"data[{key}]", is_config_map_key, errs)
        try:
            total += len(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            errs.append(invalid(f"data[{key}]", "<secret contents redacted>", "must be base64-encoded"))
    for key, value in (secret.string_data or {}).items():
        _names(key, f"stringData[{key}]", is_config_map_key, errs)
        total += len(value.encode())
    if total > MAX_SECRET_SIZE:
        errs.append(too_long("data", MAX_SECRET_SIZE))
    keys = set(data) | set(secret.string_data or {})
    for needed in _SECRET_REQUIRED_KEYS.get(secret.type or "", []):
        if needed not in keys:
            errs.append(required(f"data[{needed}]"))


def _validate_secret_update(new: k8s.Secret, old: k8s.Secret, errs: Errs) -> None:
    _immutable(new.type, old.type, "type", errs)
    _validate_immutable_data(new, old, [("data", "data")], errs)


def _validate_config_map_update(new: k8s.ConfigMap, old: k8s.ConfigMap, errs: Errs) -> None:
    _validate_immutable_data(new, old, [("data", "data"), ("binary_data", "binaryData")], errs)


def _validate_service_account(sa: k8s.ServiceAccount, errs: Errs) -> None:
    validate_object_meta(sa.metadata, errs)
