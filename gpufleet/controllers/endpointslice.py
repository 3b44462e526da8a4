"""EndpointSlices: for every Service with a selector, discovery.k8s.io/v1 EndpointSlices that
list its pods, as Kubernetes' EndpointSlice controller writes them.

Which pods and ports: the rules of ``gpufleet.api.endpoints``, shared with the Endpoints
controller, except that pods being deleted stay, marked terminating. Each pod with an IP
that has not finished becomes an endpoint: ``addresses`` (its IPv4 address),
``conditions`` (``serving``: its Ready condition is True; ``terminating``: it is being
deleted; ``ready``: serving and not terminating, or always with
``publishNotReadyAddresses``), ``nodeName``, ``targetRef`` to the Pod, ``zone`` (its node's
``topology.kubernetes.io/zone`` label) when the node has one, and ``hostname`` when the pod's
spec.hostname is set and its subdomain is the Service.

Endpoints whose resolved ports are the same share slices, at most ``max_endpoints_per_slice``
(100, Kubernetes' default) in each; every port carries its name ("" for an unnamed Service
port), protocol and appProtocol. A Service that selects no pod keeps one slice without
endpoints or ports (Kubernetes' placeholder). Slices are named ``<service>-<random>``
(generateName) and labelled ``kubernetes.io/service-name``,
``endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io`` and the
Service's own labels (``service.kubernetes.io/headless`` for a headless one); their
controller ownerReference is the Service, so the garbage collector deletes them with it.

To keep writes few, as Kubernetes' reconciler does, an endpoint stays in the slice that holds
it while it is unchanged; new endpoints fill the slices with room first, then new slices;
slices left empty are deleted. Slices of other managers (no managed-by label of this
controller) are left alone.

The decision is ``decide_endpoint_slices``; the controller waits until the slices it created
show in its cache before deciding again for that Service (Kubernetes' slice tracker), so a
stale cache does not create a slice twice.

Unlike Kubernetes, a pod on a node the cache does not know (yet) is listed, without a zone,
rather than left out until the node shows.

Not done: IPv6 and dual-stack (addressType is IPv4 only), topology hints, trafficDistribution,
and the endpoints.kubernetes.io/last-change-trigger-time annotation.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from gpufleet.api.endpoints import (
    HEADLESS_LABEL,
    ZONE_LABEL,
    endpoint_ports,
    hostname_for,
    is_endpoint,
    is_headless,
    pod_ready,
    pod_terminating,
    service_selector,
    target_ref,
)
from gpufleet.api.k8s import EndpointSlice, Node
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import ApiError
from gpufleet.client.informer import NAMESPACE_INDEX, SharedInformerFactory
from gpufleet.controllers.actions import Actions, Create, Delete, Update
from gpufleet.controllers.endpoints import ServicePodsController

log = logging.getLogger(__name__)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
CONTROLLER_NAME = "endpointslice-controller.k8s.io"
MAX_ENDPOINTS_PER_SLICE = 100
API_VERSION = "discovery.k8s.io/v1"


def pod_endpoint(pod: Any, svc: Any, zones: dict[str, str]) -> dict[str, Any]:
    """Kubernetes' podToEndpoint, in wire form."""
    serving = pod_ready(pod)
    terminating = pod_terminating(pod)
    ready = bool(svc.spec.publish_not_ready_addresses) or (serving and not terminating)
    ep: dict[str, Any] = {"addresses": [pod.status.pod_ip],
                          "conditions": {"ready": ready, "serving": serving, "terminating": terminating}}
    hostname = hostname_for(pod, svc)
    if hostname:
        ep["hostname"] = hostname
    node = pod.spec.node_name if pod.spec is not None else None
    if node:
        ep["nodeName"] = node
        if zones.get(node):
            ep["zone"] = zones[node]
    ep["targetRef"] = target_ref(pod)
    return ep


def _endpoint_key(ep: dict[str, Any]) -> str:
    ref = ep.get("targetRef") or {}
    return ref.get("uid") or json.dumps(ep.get("addresses") or [])


def _ports_key(ports: list[dict[str, Any]] | None) -> str:
    norm = [{"name": p.get("name") or "", "port": p.get("port"), "protocol": p.get("protocol") or "TCP",
             **({"appProtocol": p["appProtocol"]} if p.get("appProtocol") else {})} for p in ports or []]
    norm.sort(key=lambda p: (p["name"], p["port"] or 0, p["protocol"]))
    return json.dumps(norm, sort_keys=True)


def slice_labels(svc: Any) -> dict[str, str]:
    """The Service's labels (less the two this controller sets) and its own."""
    labels = {k: v for k, v in objects.labels_of(svc).items() if k not in (SERVICE_NAME_LABEL, MANAGED_BY_LABEL)}
    if is_headless(svc):
        labels[HEADLESS_LABEL] = ""
    labels[SERVICE_NAME_LABEL] = objects.name_of(svc)
    labels[MANAGED_BY_LABEL] = CONTROLLER_NAME
    return labels


def owner_reference(svc: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "name": objects.name_of(svc), "uid": objects.uid_of(svc),
            "controller": True, "blockOwnerDeletion": True}


def desired_endpoints(svc: Any, pods: list[Any], zones: dict[str, str]) -> dict[str, tuple[list, dict]]:
    """Port key -> (ports, endpoint key -> endpoint) for the pods the Service selects."""
    out: dict[str, tuple[list, dict]] = {}
    for pod in pods:
        if not is_endpoint(pod, include_terminating=True):
            continue
        ports = endpoint_ports(svc, pod, always_name=True)
        ep = pod_endpoint(pod, svc, zones)
        out.setdefault(_ports_key(ports), (ports, {}))[1][_endpoint_key(ep)] = ep
    return out


def _slice_body(svc: Any, ports: list[dict[str, Any]], endpoints: list[dict[str, Any]]) -> dict[str, Any]:
    name = objects.name_of(svc)
    return {"apiVersion": API_VERSION, "kind": "EndpointSlice",
            "metadata": {"generateName": f"{name[:57]}-", "namespace": objects.namespace_of(svc),
                         "labels": slice_labels(svc), "ownerReferences": [owner_reference(svc)]},
            "addressType": "IPv4", "endpoints": endpoints, "ports": ports}


def decide_endpoint_slices(key: str, svc: Any | None, pods: list[Any], slices: list[Any],
                           zones: dict[str, str] | None = None,
                           max_endpoints: int = MAX_ENDPOINTS_PER_SLICE) -> Actions:
    """The creates, updates and deletes that make the Service ``key``'s slices list its
    endpoints (``pods``: those it selects; ``slices``: the slices this controller manages for
    it, as stored; ``zones``: node name -> zone)."""
    if svc is None:
        return Actions(reason="Gone")  # the garbage collector deletes the slices it owned
    if service_selector(svc) is None:
        return Actions(reason="NoSelector")
    zones = zones or {}
    desired = desired_endpoints(svc, pods, zones)
    labels = slice_labels(svc)
    owner = owner_reference(svc)
    current = sorted((s.to_dict() for s in slices), key=lambda d: d["metadata"]["name"])
    by_ports: dict[str, list[dict[str, Any]]] = {}
    for data in current:
        by_ports.setdefault(_ports_key(data.get("ports")), []).append(data)

    bodies: list[dict[str, Any]] = []
    # Each stored slice with the ports and endpoints it should have; None: to be deleted.
    outcome: list[tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]] | None]] = []
    for pk, (ports, wanted) in sorted(desired.items()):
        placed: set[str] = set()
        filled: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
        for data in by_ports.get(pk, []):
            keep = []
            for ep in data.get("endpoints") or []:
                k = _endpoint_key(ep)
                if k in wanted and k not in placed and len(keep) < max_endpoints:
                    keep.append(wanted[k])
                    placed.add(k)
            filled.append((data, keep))
        rest = [wanted[k] for k in sorted(wanted, key=lambda k: (wanted[k]["addresses"], k)) if k not in placed]
        for _, keep in filled:
            room = max_endpoints - len(keep)
            if room > 0 and rest:
                keep.extend(rest[:room])
                rest = rest[room:]
        outcome.extend((data, ports, keep or None) for data, keep in filled)
        bodies.extend(_slice_body(svc, ports, rest[i:i + max_endpoints]) for i in range(0, len(rest), max_endpoints))
    unwanted = [data for pk, existing in by_ports.items() if pk not in desired for data in existing]
    if not desired:
        # No endpoints at all: one placeholder slice without ports, the first stored one if any.
        if unwanted:
            outcome.append((unwanted.pop(0), [], []))
        else:
            bodies.append(_slice_body(svc, [], []))
    outcome.extend((data, [], None) for data in unwanted)

    updates: list[Update] = []
    deletes: list[Delete] = []
    for data, ports, endpoints in outcome:
        meta = data["metadata"]
        if endpoints is None:
            deletes.append(Delete(EndpointSlice, meta["name"], meta.get("namespace"), uid=meta.get("uid")))
            continue
        refs = meta.get("ownerReferences") or []
        if ((data.get("endpoints") or []) == endpoints and (meta.get("labels") or {}) == labels
                and owner in refs and (data.get("ports") or []) == ports):
            continue
        body = dict(data, endpoints=endpoints, ports=ports)
        body["metadata"] = dict(meta, labels=labels,
                                ownerReferences=[r for r in refs if not r.get("controller")] + [owner])
        updates.append(Update(body))
    creates = [Create(body, tag=i) for i, body in enumerate(bodies)]
    if not (creates or updates or deletes):
        return Actions(reason="InSync")
    return Actions(creates=creates, updates=updates, deletes=deletes, reason="Reconcile")


class EndpointSliceController(ServicePodsController):
    """Keyed by Service: each Service's EndpointSlices list its pods and their conditions."""

    name = "endpointslice"

    def __init__(self, client: Client, informers: SharedInformerFactory,
                 max_endpoints_per_slice: int = MAX_ENDPOINTS_PER_SLICE, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.max_endpoints = max_endpoints_per_slice
        self.slice_informer = informers.informer(EndpointSlice)
        self.node_informer = informers.informer(Node)
        self.slice_informer.add_event_handler(self._slice_event, lambda _old, new: self._slice_event(new),
                                              self._slice_event)
        self.node_informer.add_event_handler(self._node_event, self._node_updated)
        # Service key -> names of the slices created and not yet seen in the cache.
        self.pending: dict[str, set[str]] = {}

    def _slice_event(self, es: Any) -> None:
        labels = objects.labels_of(es)
        if labels.get(MANAGED_BY_LABEL) == CONTROLLER_NAME and labels.get(SERVICE_NAME_LABEL):
            self.queue.add(f"{objects.namespace_of(es)}/{labels[SERVICE_NAME_LABEL]}")

    def _node_event(self, node: Any) -> None:
        if objects.labels_of(node).get(ZONE_LABEL):
            for svc in self.svc_informer.list():
                self.queue.add(objects.object_key(svc))

    def _node_updated(self, old: Any, new: Any) -> None:
        if objects.labels_of(old).get(ZONE_LABEL) != objects.labels_of(new).get(ZONE_LABEL):
            for svc in self.svc_informer.list():
                self.queue.add(objects.object_key(svc))

    def _slices_of(self, ns: str, name: str) -> list[Any]:
        out = []
        for es in self.slice_informer.by_index(NAMESPACE_INDEX, ns):
            labels = objects.labels_of(es)
            if labels.get(SERVICE_NAME_LABEL) == name and labels.get(MANAGED_BY_LABEL) == CONTROLLER_NAME:
                out.append(es)
        return out

    def _zones(self, pods: list[Any]) -> dict[str, str]:
        """Node name -> zone, for the nodes of ``pods`` that have one."""
        out = {}
        for node_name in {p.spec.node_name for p in pods if p.spec is not None and p.spec.node_name}:
            node = self.node_informer.get(node_name)
            zone = objects.labels_of(node).get(ZONE_LABEL) if node is not None else None
            if zone:
                out[node_name] = zone
        return out

    async def sync(self, key: str, svc: Any | None) -> Requeue | None:
        ns, _, name = key.partition("/")
        slices = self._slices_of(ns, name)
        pending = self.pending.get(key)
        if pending:
            pending -= {objects.name_of(s) for s in slices}
            if pending:
                return Requeue(after=0.05)  # the cache has not shown what was created yet
            self.pending.pop(key, None)
        pods = self.selected_pods(svc, ns)
        actions = decide_endpoint_slices(key, svc, pods, slices, self._zones(pods), self.max_endpoints)
        try:
            outcome = await self.act(key, None, actions)
        except ApiError as e:
            log.info("endpointslices %s: %s", key, e)
            return Requeue()
        created = {(answer.get("metadata") or {}).get("name") for answer in outcome.answers.values()}
        if created:
            self.pending[key] = created
        return None
