"""The PyTorchJob controller's wiring: which events bring a job back, the snapshot a sync
decides on (``decide.Observed``), applying the decision and remembering what it says."""

from __future__ import annotations

import logging
from typing import Any

from gpufleet.api.k8s import Node, Pod
from gpufleet.api.kubeflow import PyTorchJob
from gpufleet.api.nodeheartbeat import heartbeat_only
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.controllers._common import CONTROLLER_UID_INDEX, index_by_controller, pod_phase
from gpufleet.controllers.actions import Actions, Outcome
from gpufleet.controllers.base import OwnerController
from gpufleet.controllers.pytorchjob.decide import Memory, Observed, Settings, decide
from gpufleet.controllers.pytorchjob.model import (
    KIND,
    autoscale_enabled,
    is_finished,
    leader,
    pod_name,
)

log = logging.getLogger(__name__)


class PyTorchJobController(OwnerController):
    name = "pytorchjob"
    kind = KIND
    owner_model = PyTorchJob
    # restart_backoff, restart_backoff_max, checkpoint_root, elastic_resize_interval
    settings_type = Settings

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        # Job key -> what the controller remembers of it between syncs.
        self.memory: dict[str, Memory] = {}
        # Uids of pods this controller deleted itself (scale-down, restarts, cleanup).
        self.job_informer = self.owners
        self.pod_informer = informers.informer(Pod)
        self.node_informer = informers.informer(Node)
        index_by_controller(self.pod_informer)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self._pod_deleted)
        self.node_informer.add_event_handler(self._node_changed, self._node_updated, self._node_changed)

    # -- events ---------------------------------------------------------------------------

    def _pod_added(self, pod: Any) -> None:
        if not self.child_created(pod) and pod_phase(pod) == "Pending":
            self._enqueue_autoscaled()

    def _pod_updated(self, old: Any, new: Any) -> None:
        key = self.enqueue_owner(new)
        if not key and pod_phase(new) != pod_phase(old):
            self._enqueue_autoscaled()

    def _pod_deleted(self, pod: Any) -> None:
        self._deleting.discard(objects.uid_of(pod))
        if not self.child_deleted(pod):
            self._enqueue_autoscaled()

    def _node_changed(self, node: Any) -> None:
        self._enqueue_autoscaled()

    def _node_updated(self, old: Any, new: Any) -> None:
        # A heartbeat frees no GPU and moves no member: only a node's readiness, addresses or
        # capacity matter here, and a heartbeat-only write leaves them as they were.
        if not heartbeat_only(old, new):
            self._enqueue_autoscaled()

    def _enqueue_autoscaled(self) -> None:
        # Free GPUs and waiting pods change with other workloads: elastic jobs look again.
        for job in self.job_informer.list():
            if autoscale_enabled(job) and not is_finished(job):
                self.queue.add(objects.object_key(job))

    # -- sync -----------------------------------------------------------------------------

    def forget(self, key: str) -> None:
        self.memory.pop(key, None)
        ns, _, name = key.rpartition("/")
        for kind in ("svc", "pg", "cm"):
            self.known.pop((kind, ns, name), None)
        self.known.pop(("cm", ns, f"{name}-rendezvous"), None)

    def observe(self, key: str, job: Any) -> Observed:
        pods = self.pod_informer.by_index(CONTROLLER_UID_INDEX, objects.uid_of(job))
        ns = objects.namespace_of(job)
        memory = self.memory.get(key, Memory())
        memory = Memory(memory.not_before, memory.last_resize, memory.created,
                        frozenset(self._deleting), memory.gang_wait)
        return Observed(
            job=job,
            pods=pods,
            nodes=self.node_informer.list(),
            cluster_pods=self.pod_informer.list() if autoscale_enabled(job) else [],
            lead_pod=self.pod_informer.get(f"{ns}/{pod_name(objects.name_of(job), *leader(job))}"),
            memory=memory,
            settings=self.settings,
        )

    async def sync(self, key: str, job: Any) -> Requeue | None:
        return await self.decide_pods(key, job, lambda: decide(self.observe(key, job), self.now()),
                                      lambda a, o: self._remember(key, a, o))

    def _remember(self, key: str, actions: Actions, outcome: Outcome) -> None:
        m = self.memory.get(key, Memory())
        not_before = actions.memo.get("not_before", m.not_before)
        last_resize = actions.memo.get("last_resize", m.last_resize)
        gang_wait = actions.memo.get("gang_wait", m.gang_wait)
        created = m.created
        attempts = [c.tag[0] for c in actions.creates if c.expect and c.tag is not None]
        if attempts:
            if created is None or created[0] != attempts[0]:
                created = (attempts[0], frozenset())
            created = (created[0], created[1] | {member for _, member in outcome.created})
        self.memory[key] = Memory(not_before, last_resize, created, frozenset(), gang_wait)
