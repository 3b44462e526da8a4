"""networking.k8s.io/v1: Ingress, IngressClass and NetworkPolicy, as
pkg/apis/networking/validation words them."""

from __future__ import annotations

import ipaddress
import re

from gpufleet.api import k8s
from gpufleet.api.validation.containers import _validate_port_num_or_name
from gpufleet.api.validation.core import (
    Errs,
    _immutable,
    _int_or_string,
    _names,
    validate_label_selector,
    validate_object_meta,
)
from gpufleet.api.validation.errors import Unquoted, forbidden, invalid, not_supported, required
from gpufleet.api.validation.names import (
    DNS1123_SUBDOMAIN_FMT,
    DNS1123_SUBDOMAIN_MAX,
    is_dns1035_label,
    is_dns1123_subdomain,
    is_valid_port_name,
    is_valid_port_num,
    max_len_error,
    regex_error,
)

PATH_TYPES = ["Exact", "ImplementationSpecific", "Prefix"]
POLICY_TYPES = ["Ingress", "Egress"]
NETWORK_POLICY_PROTOCOLS = ["TCP", "UDP", "SCTP"]
_INVALID_PATH_SEQUENCES = ("//", "/./", "/../", "%2f", "%2F")
_INVALID_PATH_SUFFIXES = ("/..", "/.")
_WILDCARD_FMT = "\\*\\." + DNS1123_SUBDOMAIN_FMT
_WILDCARD_RE = re.compile(_WILDCARD_FMT)
_HTTP_PATH_FMT = "[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+"
_HTTP_PATH_RE = re.compile(_HTTP_PATH_FMT)
MAX_CONTROLLER_LEN = 250


def is_wildcard_dns1123_subdomain(value: str) -> list[str]:
    errs = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        errs.append(max_len_error(DNS1123_SUBDOMAIN_MAX))
    if not _WILDCARD_RE.fullmatch(value):
        errs.append(regex_error(
            "a wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, which must "
            "consist of lower case alphanumeric characters, '-' or '.' and end with an alphanumeric character",
            _WILDCARD_FMT, "*.example.com"))
    return errs


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _host(value: str, path: str, errs: Errs) -> None:
    if _is_ip(value):
        errs.append(invalid(path, value, "must be a DNS name, not an IP address"))
    fn = is_wildcard_dns1123_subdomain if "*" in value else is_dns1123_subdomain
    _names(value, path, fn, errs)


# --- Ingress ------------------------------------------------------------------------------


def _validate_backend(backend: k8s.IngressBackend, path: str, errs: Errs) -> None:
    if backend.resource is not None and backend.service is not None:
        errs.append(invalid(path, "", "cannot set both resource and service backends"))
    elif backend.resource is not None:
        if not backend.resource.kind:
            errs.append(required(f"{path}.resource.kind"))
        if not backend.resource.name:
            errs.append(required(f"{path}.resource.name"))
    elif backend.service is not None:
        svc = backend.service
        if not svc.name:
            errs.append(required(f"{path}.service.name"))
        else:
            _names(svc.name, f"{path}.service.name", is_dns1035_label, errs)
        port = svc.port or k8s.ServiceBackendPort()
        if port.name and port.number:
            errs.append(invalid(path, "", "cannot set both port name & port number"))
        elif port.name:
            _names(port.name, f"{path}.service.port.name", is_valid_port_name, errs)
        elif port.number:
            errs.extend(invalid(f"{path}.service.port.number", port.number, m) for m in is_valid_port_num(port.number))
        else:
            errs.append(required(path, "port name or number is required"))
    else:
        errs.append(invalid(path, "", "resource or service backend is required"))


def _validate_path(p: k8s.HTTPIngressPath, path: str, errs: Errs) -> None:
    value = p.path or ""
    if not p.path_type:
        errs.append(required(f"{path}.pathType", "pathType must be specified"))
        return
    if p.path_type in ("Exact", "Prefix"):
        if not value.startswith("/"):
            errs.append(invalid(f"{path}.path", value, "must be an absolute path"))
        for seq in _INVALID_PATH_SEQUENCES:
            if seq in value:
                errs.append(invalid(f"{path}.path", value, f"must not contain '{seq}'"))
        for suffix in _INVALID_PATH_SUFFIXES:
            if value.endswith(suffix):
                errs.append(invalid(f"{path}.path", value, f"cannot end with '{suffix}'"))
    elif p.path_type == "ImplementationSpecific":
        if value and not value.startswith("/"):
            errs.append(invalid(f"{path}.path", value, "must be an absolute path"))
    else:
        errs.append(not_supported(f"{path}.pathType", p.path_type, PATH_TYPES))
    _validate_backend(p.backend, f"{path}.backend", errs)


def _validate_ingress(ing: k8s.Ingress, errs: Errs) -> None:
    validate_object_meta(ing.metadata, errs)
    spec = ing.spec or k8s.IngressSpec()
    if not spec.rules and spec.default_backend is None:
        errs.append(invalid("spec", Unquoted("[]networking.IngressRule(nil)"),
                            "either `defaultBackend` or `rules` must be specified"))
    if spec.default_backend is not None:
        _validate_backend(spec.default_backend, "spec.defaultBackend", errs)
    for i, rule in enumerate(spec.rules or []):
        if rule.host:
            _host(rule.host, f"spec.rules[{i}].host", errs)
        if rule.http is not None:
            if not rule.http.paths:
                errs.append(required(f"spec.rules[{i}].http.paths"))
            for j, p in enumerate(rule.http.paths or []):
                _validate_path(p, f"spec.rules[{i}].http.paths[{j}]", errs)
    for i, tls in enumerate(spec.tls or []):
        for j, host in enumerate(tls.hosts or []):
            fn = is_wildcard_dns1123_subdomain if "*" in host else is_dns1123_subdomain
            _names(host, f"spec.tls[{i}].hosts[{j}]", fn, errs)
    if spec.ingress_class_name is not None:
        _names(spec.ingress_class_name, "spec.ingressClassName", is_dns1123_subdomain, errs)


# --- IngressClass -------------------------------------------------------------------------


def _domain_prefixed_path(value: str, path: str, errs: Errs) -> None:
    if not value:
        errs.append(required(path))
        return
    host, _, rest = value.partition("/")
    if not host or not rest:
        errs.append(invalid(path, value, 'must be a domain-prefixed path (such as "acme.io/foo")'))
        return
    _names(host, path, is_dns1123_subdomain, errs)
    if not _HTTP_PATH_RE.fullmatch(rest):
        errs.append(invalid(path, rest, regex_error("must be a valid path", _HTTP_PATH_FMT)))


def _validate_ingress_class(ic: k8s.IngressClass, errs: Errs) -> None:
    validate_object_meta(ic.metadata, errs, namespaced=False)
    spec = ic.spec or k8s.IngressClassSpec()
    controller = spec.controller or ""
    if len(controller) > MAX_CONTROLLER_LEN:
        errs.append(invalid("spec.controller", controller, max_len_error(MAX_CONTROLLER_LEN)))
    _domain_prefixed_path(controller, "spec.controller", errs)
    params = spec.parameters
    if params is not None:
        if not params.kind:
            errs.append(required("spec.parameters.kind"))
        if not params.name:
            errs.append(required("spec.parameters.name"))
        if params.scope is not None and params.scope not in ("Cluster", "Namespace"):
            errs.append(not_supported("spec.parameters.scope", params.scope, ["Cluster", "Namespace"]))
        if params.scope == "Namespace" and not params.namespace:
            errs.append(required("spec.parameters.namespace", "`parameters.scope` is set to 'Namespace'"))
        if params.scope != "Namespace" and params.namespace:
            errs.append(forbidden("spec.parameters.namespace", "`parameters.scope` is set to 'Cluster'"))


def _validate_ingress_class_update(new: k8s.IngressClass, old: k8s.IngressClass, errs: Errs) -> None:
    _immutable((new.spec or k8s.IngressClassSpec()).controller, (old.spec or k8s.IngressClassSpec()).controller,
               "spec.controller", errs)


# --- NetworkPolicy ------------------------------------------------------------------------


def _cidr(value: str, path: str, errs: Errs) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        errs.append(invalid(path, value, "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"))
        return None


def _validate_peer(peer: k8s.NetworkPolicyPeer, path: str, errs: Errs) -> None:
    count = 0
    if peer.pod_selector is not None:
        count += 1
        validate_label_selector(peer.pod_selector, f"{path}.podSelector", errs)
    if peer.namespace_selector is not None:
        count += 1
        validate_label_selector(peer.namespace_selector, f"{path}.namespaceSelector", errs)
    if peer.ip_block is not None:
        count += 1
        block = peer.ip_block
        if not block.cidr:
            errs.append(required(f"{path}.ipBlock.cidr"))
        else:
            net = _cidr(block.cidr, f"{path}.ipBlock.cidr", errs)
            for i, ex in enumerate(block.except_ or []):
                sub = _cidr(ex, f"{path}.ipBlock.except[{i}]", errs)
                if net is not None and sub is not None and (
                        sub.version != net.version or not sub.subnet_of(net) or sub.prefixlen <= net.prefixlen):
                    errs.append(invalid(f"{path}.ipBlock.except[{i}]", ex, "must be a strict subset of `cidr`"))
    if count == 0:
        errs.append(required(path, "must specify a peer"))
    elif count > 1 and peer.ip_block is not None:
        errs.append(forbidden(path, "may not specify both ipBlock and another peer"))


def _validate_policy_port(port: k8s.NetworkPolicyPort, path: str, errs: Errs) -> None:
    if port.protocol is not None and port.protocol not in NETWORK_POLICY_PROTOCOLS:
        errs.append(not_supported(f"{path}.protocol", port.protocol, NETWORK_POLICY_PROTOCOLS))
    value = _int_or_string(port.port, f"{path}.port", errs)
    if value is None:
        if port.end_port is not None:
            errs.append(invalid(f"{path}.endPort", port.end_port, "may not be specified when `port` is not specified"))
        return
    if isinstance(value, int):
        _validate_port_num_or_name(value, f"{path}.port", errs)
        if port.end_port is not None:
            if port.end_port < value:
                errs.append(invalid(f"{path}.endPort", value, "must be greater than or equal to `port`"))
            errs.extend(invalid(f"{path}.endPort", port.end_port, m) for m in is_valid_port_num(port.end_port))
    else:
        if port.end_port is not None:
            errs.append(invalid(f"{path}.endPort", port.end_port, "may not be specified when `port` is non-numeric"))
        _names(value, f"{path}.port", is_valid_port_name, errs)


def _validate_network_policy(np: k8s.NetworkPolicy, errs: Errs) -> None:
    validate_object_meta(np.metadata, errs)
    spec = np.spec or k8s.NetworkPolicySpec()
    validate_label_selector(spec.pod_selector, "spec.podSelector", errs)
    for kind, rules, peers in (("ingress", spec.ingress or [], "from_"), ("egress", spec.egress or [], "to")):
        for i, rule in enumerate(rules):
            for j, port in enumerate(rule.ports or []):
                _validate_policy_port(port, f"spec.{kind}[{i}].ports[{j}]", errs)
            for j, peer in enumerate(getattr(rule, peers) or []):
                _validate_peer(peer, f"spec.{kind}[{i}].{peers.rstrip('_')}[{j}]", errs)
    types = spec.policy_types or []
    if len(types) > len(POLICY_TYPES):
        errs.append(invalid("spec.policyTypes", Unquoted(f"{types}"), "may not specify more than two policyTypes"))
        return
    for i, t in enumerate(types):
        if t not in POLICY_TYPES:
            errs.append(not_supported(f"spec.policyTypes[{i}]", t, POLICY_TYPES))
