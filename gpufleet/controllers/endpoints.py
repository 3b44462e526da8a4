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

Host ports (gpufleet-specific). With the process runtime, pods share the host's network, so
a container's port may be bound on a different port of the host. The node agent then
records the real one in the pod annotation ``gpufleet.io/host-ports``: JSON mapping the
container port's name or number (as a string) to the host port, e.g.
``{"http": 31080, "9090": 31090}``. When the pod's entry for the resolved port is there, the
endpoint carries the host port instead of the container port (and the address is the pod's
IP, which for such pods is the host's).

The decision is ``decide_endpoints`` (the Service, its pods and its Endpoints as stored in;
the create, update or delete out), applied with ``actions.apply``.

Not done: EndpointSlices, the 1000-address truncation, and the last-change-trigger-time
annotation.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from gpufleet.api.k8s import Endpoints, Pod, Service
from gpufleet.api.selectors import LabelSelector
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Controller, Requeue
from gpufleet.client.errors import AlreadyExists, ApiError
from gpufleet.client.informer import NAMESPACE_INDEX, SharedInformerFactory
from gpufleet.client.workqueue import WorkQueue
from gpufleet.controllers._common import is_being_deleted, pod_is_ready, pod_is_terminal
from gpufleet.controllers.actions import Actions, Create, Delete, Update, apply
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

HOST_PORTS_ANNOTATION = "gpufleet.io/host-ports"
HEADLESS_LABEL = "service.kubernetes.io/headless"


def _service_selector(svc: Any) -> LabelSelector | None:
    spec = svc.spec
    if spec is None or not spec.selector or spec.type == "ExternalName":
        return None
    return LabelSelector.from_set(spec.selector)


def _host_ports(pod: Any) -> dict[str, int]:
    raw = (objects.meta(pod, "annotations") or {}).get(HOST_PORTS_ANNOTATION)
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        log.warning("pod %s: %s is not JSON: %r", objects.object_key(pod), HOST_PORTS_ANNOTATION, raw)
        return {}
    out = {}
    for k, v in (data.items() if isinstance(data, dict) else ()):
        try:
            out[str(k)] = int(v)
        except (TypeError, ValueError):
            continue
    return out


def resolve_port(pod: Any, service_port: Any) -> int | None:
    """The port of ``pod`` a Service port leads to (Kubernetes' FindPort), host-port
    translated; None when the pod has no port of that name."""
    target = service_port.target_port if service_port.target_port not in (None, "", 0) else service_port.port
    protocol = service_port.protocol or "TCP"
    containers = (pod.spec.containers if pod.spec is not None else None) or []
    name: str | None = None
    number: int | None = None
    if isinstance(target, int) or (isinstance(target, str) and target.isdigit()):
        number = int(target)
        for c in containers:
            for p in c.ports or []:
                if p.container_port == number and (p.protocol or "TCP") == protocol and p.name:
                    name = p.name
    else:
        for c in containers:
            for p in c.ports or []:
                if p.name == target and (p.protocol or "TCP") == protocol:
                    name, number = p.name, p.container_port
                    break
            if number is not None:
                break
        if number is None:
            return None
    host = _host_ports(pod)
    if name and name in host:
        return host[name]
    return host.get(str(number), number)


def _address(pod: Any, svc: Any) -> dict[str, Any]:
    address: dict[str, Any] = {"ip": pod.status.pod_ip}
    spec = pod.spec
    if spec is not None and spec.hostname and spec.subdomain == objects.name_of(svc):
        address["hostname"] = spec.hostname
    if spec is not None and spec.node_name:
        address["nodeName"] = spec.node_name
    address["targetRef"] = {
        "kind": "Pod",
        "namespace": objects.namespace_of(pod),
        "name": objects.name_of(pod),
        "uid": objects.uid_of(pod),
    }
    return address


def endpoint_subsets(svc: Any, pods: list[Any]) -> list[dict[str, Any]]:
    """The subsets of a Service's Endpoints (pure: the Service and its selected pods)."""
    spec = svc.spec
    publish_not_ready = bool(spec.publish_not_ready_addresses)
    headless = spec.cluster_ip == "None"
    service_ports = spec.ports or []
    # The pods' resolved ports (canonical JSON) -> ports, ready addresses, not-ready ones.
    groups: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]] = {}
    for pod in pods:
        if pod.status is None or not pod.status.pod_ip or pod_is_terminal(pod):
            continue
        if is_being_deleted(pod) and not publish_not_ready:
            continue
        ports: list[dict[str, Any]] = []
        for sp in service_ports:
            number = resolve_port(pod, sp)
            if number is None:
                continue
            port: dict[str, Any] = {"port": number, "protocol": sp.protocol or "TCP"}
            if sp.name:
                port["name"] = sp.name
            if sp.app_protocol:
                port["appProtocol"] = sp.app_protocol
            ports.append(port)
        if not ports and (service_ports or not headless):
            continue
        ports.sort(key=lambda p: (p.get("name", ""), p["port"], p["protocol"]))
        _, ready, not_ready = groups.setdefault(json.dumps(ports, sort_keys=True), (ports, [], []))
        (ready if publish_not_ready or pod_is_ready(pod) else not_ready).append(_address(pod, svc))
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
    if _service_selector(svc) is None:
        return Actions(reason="NoSelector")
    subsets = endpoint_subsets(svc, pods)
    labels = dict(objects.labels_of(svc))
    if svc.spec.cluster_ip == "None":
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


class EndpointsController:
    name = "endpoints"

    def __init__(
        self,
        client: Client,
        informers: SharedInformerFactory,
        *,
        clock: Clock = REAL_CLOCK,
        workers: int = 2,
    ) -> None:
        self.client = client
        self.clock = clock
        self.svc_informer = informers.informer(Service)
        self.pod_informer = informers.informer(Pod)
        self.ep_informer = informers.informer(Endpoints)
        self.queue = WorkQueue(self.name, clock=clock)
        self.controller = Controller(self.name, self.reconcile, self.queue, workers=workers)
        self.controller.watch(self.svc_informer)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self._pod_added)
        self.ep_informer.add_event_handler(on_update=self._ep_changed, on_delete=self._ep_deleted)

    async def start(self) -> None:
        await self.controller.start()

    async def stop(self) -> None:
        await self.controller.stop()

    def _services_for(self, pod: Any) -> list[str]:
        labels = objects.labels_of(pod)
        out = []
        for svc in self.svc_informer.by_index(NAMESPACE_INDEX, objects.namespace_of(pod)):
            selector = _service_selector(svc)
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

    def _ep_changed(self, old: Any, new: Any) -> None:
        # Someone else edited (or a relist changed) an Endpoints we own: put it right.
        if self.svc_informer.get(objects.object_key(new)) is not None:
            self.queue.add(objects.object_key(new))

    def _ep_deleted(self, ep: Any) -> None:
        if self.svc_informer.get(objects.object_key(ep)) is not None:
            self.queue.add(objects.object_key(ep))

    async def reconcile(self, key: str) -> Requeue | None:
        ns, _, _ = key.partition("/")
        svc = self.svc_informer.get(key)
        selector = _service_selector(svc) if svc is not None else None
        pods = [p for p in self.pod_informer.by_index(NAMESPACE_INDEX, ns)
                if selector is not None and selector.matches(objects.labels_of(p))]
        try:
            try:
                await apply(self.client, decide_endpoints(key, svc, pods, self.ep_informer.get(key)))
            except AlreadyExists:
                # The cache had not shown it yet: decide again on the stored one.
                current = await self.client.get(Endpoints, objects.name_of(svc), ns)
                await apply(self.client, decide_endpoints(key, svc, pods, current))
        except ApiError as e:
            log.info("endpoints %s: %s", key, e)
            return Requeue()
        return None
