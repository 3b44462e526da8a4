"""The RayService controller's wiring: which events bring a RayService back, what a sync
reads (its RayClusters, their head pods, its Services and the Serve Service's Endpoints from
the informers; the Serve applications and the head's proxy health from the heads over HTTP),
the decision (``service.decide_service``) and applying it, then the Serve deployments it
asked for (PUT to the head's dashboard)."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import string
from typing import Any

import httpx

from gpufleet.api.k8s import Endpoints, Pod, Service
from gpufleet.api.ray import RayCluster
from gpufleet.api.rayservice import RayService
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.informer import NAMESPACE_INDEX, SharedInformerFactory
from gpufleet.controllers._common import CONTROLLER_UID_INDEX, index_by_controller, is_being_deleted
from gpufleet.controllers.base import OwnerController
from gpufleet.controllers.ray import pods as rp
from gpufleet.controllers.ray.service import (
    PROXY_HEALTH_PATH,
    SERVE_API_PATH,
    ServeDeploy,
    ServiceObserved,
    decide_service,
    head_service_name,
    probes,
    serve_service_name,
)

log = logging.getLogger(__name__)

_SUFFIX_CHARS = string.ascii_lowercase + string.digits


def _suffix() -> str:
    return "".join(secrets.choice(_SUFFIX_CHARS) for _ in range(5))


class RayServiceController(OwnerController):
    name = "rayservice"
    kind = "RayService"
    owner_model = RayService

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.cluster_informer = informers.informer(RayCluster)
        self.pod_informer = informers.informer(Pod)
        self.service_informer = informers.informer(Service)
        self.endpoints_informer = informers.informer(Endpoints)
        index_by_controller(self.cluster_informer)
        for informer in (self.cluster_informer, self.service_informer):
            informer.add_event_handler(self._child, lambda old, new: self._child(new), self._child)
        self.pod_informer.add_event_handler(self._pod, lambda old, new: self._pod(new), self._pod)
        self.endpoints_informer.add_event_handler(self._endpoints, lambda old, new: self._endpoints(new),
                                                  self._endpoints)
        self._deployed: dict[str, dict[str, str]] = {}  # RayService key -> cluster -> serveConfigV2
        self._doomed: dict[str, dict[str, float]] = {}
        self._http: httpx.AsyncClient | None = None

    # -- events -----------------------------------------------------------------------------

    def _child(self, obj: Any) -> None:
        self.enqueue_owner(obj)

    def _pod(self, pod: Any) -> None:
        """A Ray head pod of a RayService's cluster: the RayService looks again."""
        labels = objects.labels_of(pod)
        if labels.get(rp.NODE_TYPE_LABEL) != rp.HEAD or not labels.get(rp.CLUSTER_LABEL):
            return
        cluster = self.cluster_informer.get(f"{objects.namespace_of(pod)}/{labels[rp.CLUSTER_LABEL]}")
        if cluster is not None:
            self.enqueue_owner(cluster)

    def _endpoints(self, ep: Any) -> None:
        name = objects.name_of(ep)
        if name.endswith("-serve-svc"):
            key = f"{objects.namespace_of(ep)}/{name[:-len('-serve-svc')]}"
            if self.owners.get(key) is not None:
                self.queue.add(key)

    def forget(self, key: str) -> None:
        self._deployed.pop(key, None)
        self._doomed.pop(key, None)

    async def stop(self) -> None:
        await super().stop()
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # -- reading the heads ------------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=5.0)
        return self._http

    async def _serve_status(self, dashboard: str) -> dict[str, Any] | None:
        try:
            r = await self._client().get(f"http://{dashboard}{SERVE_API_PATH}")
            body = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as e:
            log.debug("rayservice: dashboard %s: %s", dashboard, e)
            return None
        return body if isinstance(body, dict) else None

    async def _proxy_healthy(self, proxy: str | None) -> bool:
        if not proxy:
            return False
        try:
            r = await self._client().get(f"http://{proxy}{PROXY_HEALTH_PATH}", timeout=2.0)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    async def _deploy(self, key: str, service: Any, d: ServeDeploy) -> None:
        """PUT serveConfigV2 on the cluster's dashboard; remembered once Serve accepted it."""
        try:
            r = await self._client().put(f"http://{d.dashboard}{SERVE_API_PATH}", content=json.dumps(d.body),
                                         headers={"Content-Type": "application/json"}, timeout=30.0)
            error = None if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:500]}"
        except httpx.HTTPError as e:
            error = f"{type(e).__name__}: {e}"
        if error is None:
            self._deployed.setdefault(key, {})[d.cluster] = d.config
            await self.recorder.record(service, "Normal", "UpdatedServeApplications",
                                       f"Updated serve applications to the RayCluster {d.cluster}")
        else:
            await self.recorder.record(service, "Warning", "FailedToUpdateServeApplications",
                                       f"Failed to update serve applications to the RayCluster {d.cluster}: {error}")

    # -- sync -------------------------------------------------------------------------------

    def _observe_children(self, service: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        uid, ns = objects.uid_of(service), objects.namespace_of(service)
        clusters = {objects.name_of(c): c for c in self.cluster_informer.by_index(CONTROLLER_UID_INDEX, uid)}
        heads: dict[str, Any] = {}
        for pod in self.pod_informer.by_index(NAMESPACE_INDEX, ns):
            labels = objects.labels_of(pod)
            cname = labels.get(rp.CLUSTER_LABEL, "")
            if cname in clusters and labels.get(rp.NODE_TYPE_LABEL) == rp.HEAD and not is_being_deleted(pod) \
                    and (pod.status is None or pod.status.phase not in ("Succeeded", "Failed")):
                heads.setdefault(cname, pod)
        return clusters, heads

    async def sync(self, key: str, service: Any) -> Requeue | None:
        if service is None or is_being_deleted(service):
            return None
        ns = objects.namespace_of(service)
        clusters, heads = self._observe_children(service)
        # What was deployed on clusters that are gone is forgotten.
        self._deployed[key] = {k: v for k, v in self._deployed.get(key, {}).items() if k in clusters}
        where = probes(service, clusters, heads)
        names = list(where)
        answers = await asyncio.gather(*(self._serve_status(where[n].dashboard) for n in names))
        health = await asyncio.gather(*(self._proxy_healthy(where[n].proxy) for n in names))
        observed = ServiceObserved(
            service=service, clusters=clusters, heads=heads,
            serve=dict(zip(names, answers, strict=True)), proxy=dict(zip(names, health, strict=True)),
            deployed=dict(self._deployed[key]),
            head_service=self.service_informer.get(f"{ns}/{head_service_name(service)}"),
            serve_service=self.service_informer.get(f"{ns}/{serve_service_name(service)}"),
            endpoints=self.endpoints_informer.get(f"{ns}/{serve_service_name(service)}"),
            doomed=self._doomed.get(key, {}), suffix=_suffix())
        actions = decide_service(observed, self.now())
        self._doomed[key] = actions.memo.get("doomed", {})
        deploys: list[ServeDeploy] = actions.memo.get("deploy") or []
        result = self.requeue(actions) if actions.empty else await self.apply_decision(key, service, actions)
        for d in deploys:
            await self._deploy(key, service, d)
        return result

