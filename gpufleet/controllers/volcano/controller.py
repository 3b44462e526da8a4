"""The Volcano Job controller's wiring: which events bring a job back, the snapshot a sync
decides on (``decide.Observed``), applying the decision and remembering what it says."""

from __future__ import annotations

from typing import Any

from gpufleet.api import volcano as vc
from gpufleet.api.k8s import Node, Pod, Secret
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.controllers._common import CONTROLLER_UID_INDEX, index_by_controller
from gpufleet.controllers.actions import Actions, Outcome
from gpufleet.controllers.base import OwnerController
from gpufleet.controllers.volcano.decide import Memory, Observed, decide
from gpufleet.controllers.volcano.model import JOB_NAME_KEY, KIND, podgroup_name, ssh_secret_name


class VolcanoJobController(OwnerController):
    name = "volcanojob"
    kind = KIND
    owner_model = vc.VolcanoJob

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.memory: dict[str, Memory] = {}
        self.pod_informer = informers.informer(Pod)
        self.node_informer = informers.informer(Node)
        self.podgroup_informer = informers.informer(vc.VolcanoPodGroup)
        self.secret_informer = informers.informer(Secret)
        index_by_controller(self.pod_informer)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self._pod_deleted)
        self.podgroup_informer.add_event_handler(self._pg_event, lambda old, new: self._pg_event(new), self._pg_event)

    # -- events ---------------------------------------------------------------------------

    def _pod_added(self, pod: Any) -> None:
        self.child_created(pod)

    def _pod_updated(self, old: Any, new: Any) -> None:
        self.enqueue_owner(new)

    def _pod_deleted(self, pod: Any) -> None:
        self._deleting.discard(objects.uid_of(pod))
        self.child_deleted(pod)

    def _pg_event(self, pg: Any) -> None:
        # The PodGroup is admitted (Inqueue) or changes: its job looks again.
        name = (objects.meta(pg, "labels") or {}).get(JOB_NAME_KEY)
        if name:
            self.queue.add(f"{objects.namespace_of(pg)}/{name}")

    # -- sync -----------------------------------------------------------------------------

    def forget(self, key: str) -> None:
        self.memory.pop(key, None)
        ns, _, name = key.rpartition("/")
        for kind in ("pg", "svc", "secret"):
            self.known.pop((kind, ns, name), None)
        self.known.pop(("cm", ns, f"{name}-svc"), None)
        self.known.pop(("secret", ns, f"{name}-ssh"), None)

    def observe(self, key: str, job: Any) -> Observed:
        ns = objects.namespace_of(job)
        pg = self.podgroup_informer.get(f"{ns}/{podgroup_name(job)}")
        memory = self.memory.get(key, Memory())
        return Observed(
            job=job,
            pods=self.pod_informer.by_index(CONTROLLER_UID_INDEX, objects.uid_of(job)),
            podgroup=pg if pg is None or isinstance(pg, vc.VolcanoPodGroup) else vc.VolcanoPodGroup.model_validate(pg),
            nodes=self.node_informer.list(),
            ssh_secret_exists=self.secret_informer.get(f"{ns}/{ssh_secret_name(job)}") is not None,
            memory=Memory(memory.created, frozenset(self._deleting), memory.pending_reason),
        )

    async def sync(self, key: str, job: Any) -> Requeue | None:
        return await self.decide_pods(key, job, lambda: decide(self.observe(key, job), self.now()),
                                      lambda a, o: self._remember(key, a, o))

    def _remember(self, key: str, actions: Actions, outcome: Outcome) -> None:
        m = self.memory.get(key, Memory())
        pending = actions.memo.get("pending_reason", m.pending_reason)
        created = m.created
        deleted = {d.name for d in actions.deletes if d.kind is Pod}
        if created is not None:
            created = (created[0], created[1] - deleted)
        made = [tag for tag in outcome.created if isinstance(tag, tuple)]
        for version, name in made:
            if created is None or created[0] != version:
                created = (version, frozenset())
            created = (created[0], created[1] | {name})
        self.memory[key] = Memory(created, frozenset(), pending)
