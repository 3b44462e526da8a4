"""The RayCluster and RayJob controllers' wiring: which events bring an object back, the
snapshot a sync decides on, and applying the decision (``cluster.decide_cluster``,
``job.decide_job``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx

from gpufleet.api.k8s import ConfigMap, Node, Pod, Service
from gpufleet.api.k8s import Job as BatchJob
from gpufleet.api.ray import RayCluster, RayJob
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.controllers._common import CONTROLLER_UID_INDEX, index_by_controller
from gpufleet.controllers.actions import Actions
from gpufleet.controllers.base import OwnerController
from gpufleet.controllers.ray import pods as rp
from gpufleet.controllers.ray.cluster import ClusterObserved, decide_cluster
from gpufleet.controllers.ray.job import JobObserved, decide_job

log = logging.getLogger(__name__)


class RayClusterController(OwnerController):
    name = "raycluster"
    kind = "RayCluster"
    owner_model = RayCluster

    def __init__(self, client: Client, informers: SharedInformerFactory, *,
                 room: Callable[..., tuple[int, str | None]] | None = None, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        # ControllerOptions.worker_room: how many new workers the scheduler could place now.
        self.room = room
        self._last_wait: dict[str, str | None] = {}
        self._last_held: dict[str, str | None] = {}
        self.pod_informer = informers.informer(Pod)
        self.node_informer = informers.informer(Node)
        self.service_informer = informers.informer(Service)
        index_by_controller(self.pod_informer)
        self.pod_informer.add_event_handler(self._pod_changed, self._pod_updated, self._pod_deleted)
        self.service_informer.add_event_handler(self._child, lambda old, new: self._child(new), self._child)

    def _child(self, obj: Any) -> None:
        self.enqueue_owner(obj)

    def _pod_changed(self, pod: Any) -> None:
        self.child_created(pod)

    def _pod_updated(self, old: Any, new: Any) -> None:
        self.enqueue_owner(new)

    def _pod_deleted(self, pod: Any) -> None:
        self._deleting.discard(objects.uid_of(pod))
        self.child_deleted(pod)

    def forget(self, key: str) -> None:
        self._last_wait.pop(key, None)
        self._last_held.pop(key, None)
        ns, _, name = key.rpartition("/")
        for kind in ("svc", "pg", "cm", "ServiceAccount", "Role", "RoleBinding"):
            self.known.pop((kind, ns, name), None)
        self.known.pop(("cm", ns, f"{name}-head"), None)

    def _room(self, body: dict[str, Any], want: int, unbound: list[Any]) -> tuple[int, str | None]:
        """How many of ``want`` new workers the scheduler could place now (the manager's
        ``worker_room``: gpufleet.scheduler.placement.room)."""
        assert self.room is not None
        return self.room(body, want, self.node_informer.list(), self.pod_informer.list(), unbound)

    async def sync(self, key: str, cluster: Any) -> Requeue | None:
        if cluster is None:
            return None
        return await self.decide_pods(key, cluster, lambda: self._decide(key, cluster))

    def _decide(self, key: str, cluster: Any) -> Actions:
        ns = objects.namespace_of(cluster)
        observed = ClusterObserved(
            cluster=cluster,
            pods=self.pod_informer.by_index(CONTROLLER_UID_INDEX, objects.uid_of(cluster)),
            service=self.service_informer.get(f"{ns}/{rp.head_service_name(cluster)}"),
            deleting=frozenset(self._deleting),
            last_wait=self._last_wait.get(key),
            room=self._room if self.room is not None else None,
            last_held=self._last_held.get(key),
        )
        actions = decide_cluster(observed, self.now())
        self._last_wait[key] = actions.memo.get("last_wait")
        self._last_held[key] = actions.memo.get("last_held")
        return actions


class RayJobController(OwnerController):
    name = "rayjob"
    kind = "RayJob"
    owner_model = RayJob

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.cluster_informer = informers.informer(RayCluster)
        self.batch_informer = informers.informer(BatchJob)
        self.config_informer = informers.informer(ConfigMap)
        for informer in (self.cluster_informer, self.batch_informer):
            informer.add_event_handler(self._child, lambda old, new: self._child(new), self._child)
        # A cluster picked by clusterSelector is not the job's child: its changes wake every
        # job of its namespace that is not done yet.
        self.cluster_informer.add_event_handler(self._any_cluster, lambda old, new: self._any_cluster(new),
                                                self._any_cluster)
        self._http: httpx.AsyncClient | None = None

    def _child(self, obj: Any) -> None:
        self.enqueue_owner(obj)

    def _any_cluster(self, cluster: Any) -> None:
        for job in self.owners.list():
            if objects.namespace_of(job) == objects.namespace_of(cluster) and job.spec is not None \
                    and job.spec.cluster_selector:
                self.queue.add(objects.object_key(job))

    async def stop(self) -> None:
        await super().stop()
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def _dashboard(self, ns: str, cluster: Any) -> str | None:
        """host:port of the cluster's dashboard, from the head-address ConfigMap."""
        if cluster is None:
            return None
        cm = self.config_informer.get(f"{ns}/{rp.head_config_name(cluster)}")
        data = (cm.data if cm is not None else None) or {}
        if not data.get(rp.IP_KEY):
            return None
        return f"{data[rp.IP_KEY]}:{data.get(rp.DASHBOARD_PORT_KEY, '8265')}"

    async def _ray_job(self, dashboard: str | None, job: Any) -> dict[str, Any] | None:
        """The dashboard's job API about the job's submission id, None when it cannot say."""
        status = (job.status.to_dict() if job.status is not None else {})
        if not dashboard or status.get("jobDeploymentStatus") != "Running" or not status.get("jobId"):
            return None
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=5.0)
        try:
            r = await self._http.get(f"http://{dashboard}/api/jobs/{status['jobId']}")
        except httpx.HTTPError as e:
            log.debug("rayjob %s: dashboard %s: %s", objects.name_of(job), dashboard, e)
            return None
        if r.status_code != 200:
            return None
        try:
            body = r.json()
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    async def sync(self, key: str, job: Any) -> Requeue | None:
        if job is None:
            return None
        from gpufleet.controllers.ray.job import cluster_name

        ns = objects.namespace_of(job)
        cluster = self.cluster_informer.get(f"{ns}/{cluster_name(job)}")
        submitter = self.batch_informer.get(f"{ns}/{objects.name_of(job)}")
        dashboard = self._dashboard(ns, cluster)
        observed = JobObserved(
            job=job,
            cluster=cluster.to_dict() if cluster is not None else None,
            submitter=submitter.to_dict() if submitter is not None else None,
            dashboard=dashboard,
            ray_job=await self._ray_job(dashboard, job),
        )
        actions = decide_job(observed, self.now())
        if actions.empty:
            return self.requeue(actions)
        return await self.apply_decision(key, job, actions)
