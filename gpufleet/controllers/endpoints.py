"""Endpoints: for every Service with a selector, an Endpoints object of the same name that
lists where its pods can be reached.

As Kubernetes' endpoints controller: each pod the selector matches and that has an IP
(status.podIP) becomes an address (ip, nodeName, targetRef to the Pod; hostname when the
pod's spec.hostname is set and its subdomain is the Service) in ``addresses`` when its Ready
condition is True, else in ``notReadyAddresses`` (all in ``addresses`` with
``publishNotReadyAddresses``). Finished pods and pods being deleted are left out. Each
Service port is resolved per pod: a number targetPort as is, a named one through the pod's
containerPort of that name (a pod without such a port is not an endpoint of that port).
Addresses with the same resolved ports share a subset. A headless Service without ports
lists addresses with no ports. Services without a selector are left alone (their Endpoints
are written by hand); the Endpoints of a deleted Service are deleted.

The rules shared with the EndpointSlice controller (which pods, which ports, host ports)
are in ``gpufleet.api.endpoints``.

The decision is ``decide_endpoints`` (the Service, its pods and its Endpoints as stored in;
the create, update or delete out), applied with ``actions.apply``.

Not done: the 1000-address truncation, and the last-change-trigger-time
annotation.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from gpufleet.api.endpoints import (
    HEADLESS_LABEL,
    endpoint_ports,
    hostname_for,
    is_endpoint,
    is_headless,
    pod_ready,
    service_selector,
    target_ref,
)
from gpufleet.api.k8s import Endpoints, Pod, Service
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import AlreadyExists, ApiError
from gpufleet.client.informer import NAMESPACE_INDEX, SharedInformerFactory
from gpufleet.controllers.actions import Actions, Create, Delete, Update
from gpufleet.controllers.base import KeyedController

log = logging.getLogger(__name__)

__all__ = ["HEADLESS_LABEL", "EndpointsController", "decide_endpoints", "ServicePodsController", "endpoint_subsets"]


def _address(pod: Any, svc: Any) -> dict[str, Any]:
    address: dict[str, Any] = {"ip": pod.status.pod_ip}
    hostname = hostname_for(pod, svc)
    if hostname:
        address["hostname"] = hostname
    if pod.spec is not None and pod.spec.node_name:
        address["nodeName"] = pod.spec.node_name
    address["targetRef"] = target_ref(pod)
    return address


def endpoint_subsets(svc: Any, pods: list[Any]) -> list[dict[str, Any]]:
    """The subsets of a Service's Endpoints (pure: the Service and its selected pods)."""
    spec = svc.spec
    publish_not_ready = bool(spec.publish_not_ready_addresses)
    headless = is_headless(svc)
    service_ports = spec.ports or []
    # The pods' resolved ports (canonical JSON) -> ports, ready addresses, not-ready ones.
    groups: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]] = {}
    for pod in pods:
        if not is_endpoint(pod, include_terminating=publish_not_ready):
            continue
        ports = endpoint_ports(svc, pod)
        if not ports and (service_ports or not headless):
            continue
        _, ready, not_ready = groups.setdefault(json.dumps(ports, sort_keys=True), (ports, [], []))
        (ready if publish_not_ready or pod_ready(pod) else not_ready).append(_address(pod, svc))
    subsets = []
    for key in sorted(groups):
        ports, ready, not_ready = groups[key]
        subset: dict[str, Any] = {}
        if ready:
            subset["addresses"] = sorted(ready, key=_address_order)
        if not_ready:
            subset["notReadyAddresses"] = sorted(not_ready, key=_address_order)
        if ports:
            subset["ports"] = ports
        subsets.append(subset)
    return subsets


def _address_order(address: dict[str, Any]) -> tuple:
    return (address["ip"], address["targetRef"]["name"])


def decide_endpoints(key: str, svc: Any | None, pods: list[Any], current: Any | None) -> Actions:
    """What to write for the Service ``key``: its Endpoints created, updated to the subsets and
    labels it should have, or deleted once the Service is gone (``pods``: those the Service
    selects; ``current``: its Endpoints as stored, None when there is none)."""
    ns, _, name = key.partition("/")
    if svc is None:
        if current is None:
            return Actions(reason="Gone")
        return Actions(deletes=[Delete(Endpoints, name, ns)], reason="ServiceDeleted")
    if service_selector(svc) is None:
        return Actions(reason="NoSelector")
    subsets = endpoint_subsets(svc, pods)
    labels = dict(objects.labels_of(svc))
    if is_headless(svc):
        labels[HEADLESS_LABEL] = ""
    if current is None:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": name, "namespace": ns, **({"labels": labels} if labels else {})},
        }
        if subsets:
            body["subsets"] = subsets
        return Actions(creates=[Create(body)], reason="Create")
    data = current.to_dict()
    if (data.get("subsets") or []) == subsets and (data["metadata"].get("labels") or {}) == labels:
        return Actions(reason="InSync")
    data["metadata"]["labels"] = labels or None
    if not labels:
        data["metadata"].pop("labels")
    data["subsets"] = subsets or None
    if not subsets:
        data.pop("subsets")
    return Actions(updates=[Update(data)], reason="Update")


class ServicePodsController(KeyedController):
    """Keyed by Service, woken by the pods its selector matches (before or after a change):
    what the Endpoints and the EndpointSlice controllers share."""

    model = Service

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.svc_informer = self.informer
        self.pod_informer = informers.informer(Pod)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self._pod_added)

    def _services_for(self, pod: Any) -> list[str]:
        labels = objects.labels_of(pod)
        out = []
        for svc in self.svc_informer.by_index(NAMESPACE_INDEX, objects.namespace_of(pod)):
            selector = service_selector(svc)
            if selector is not None and selector.matches(labels):
                out.append(objects.object_key(svc))
        return out

    def _pod_added(self, pod: Any) -> None:
        for key in self._services_for(pod):
            self.queue.add(key)

    def _pod_updated(self, old: Any, new: Any) -> None:
        if objects.resource_version_of(old) == objects.resource_version_of(new):
            return
        for key in set(self._services_for(old)) | set(self._services_for(new)):
            self.queue.add(key)

    def selected_pods(self, svc: Any | None, ns: str) -> list[Any]:
        """The pods of namespace ``ns`` the Service selects (none without a selector)."""
        selector = service_selector(svc) if svc is not None else None
        if selector is None:
            return []
        return [p for p in self.pod_informer.by_index(NAMESPACE_INDEX, ns) if selector.matches(objects.labels_of(p))]


class EndpointsController(ServicePodsController):
    """Keyed by Service: each Service's Endpoints list its Ready (and not-ready) pods."""

    name = "endpoints"

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.ep_informer = informers.informer(Endpoints)
        self.ep_informer.add_event_handler(on_update=self._ep_changed, on_delete=self._ep_deleted)

    def _ep_changed(self, old: Any, new: Any) -> None:
        # Someone else edited (or a relist changed) an Endpoints we own: put it right.
        if self.svc_informer.get(objects.object_key(new)) is not None:
            self.queue.add(objects.object_key(new))

    def _ep_deleted(self, ep: Any) -> None:
        if self.svc_informer.get(objects.object_key(ep)) is not None:
            self.queue.add(objects.object_key(ep))

    async def sync(self, key: str, svc: Any | None) -> Requeue | None:
        ns, _, _ = key.partition("/")
        pods = self.selected_pods(svc, ns)
        try:
            try:
                await self.act(key, None, decide_endpoints(key, svc, pods, self.ep_informer.get(key)))
            except AlreadyExists:
                # The cache had not shown it yet: decide again on the stored one.
                current = await self.client.get(Endpoints, objects.name_of(svc), ns)
                await self.act(key, None, decide_endpoints(key, svc, pods, current))
        except ApiError as e:
            log.info("endpoints %s: %s", key, e)
            return Requeue()
        return None
