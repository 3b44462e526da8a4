"""Carrying out a preemption: what DefaultPreemption (preemption.py, pure) chose is done here.

The preemptors are nominated to their nodes at once, so that the next cycles leave the room
to them; until a nominee binds, what it needs there is held against pods of lower priority
(``nominees`` are placed on the snapshot of those cycles). The victims are deleted in the
background, gracefully, each first marked DisruptionTarget=True/PreemptionByScheduler as
kube-scheduler does; Events say who was preempted for whom, and each preemptor's
``status.nominatedNodeName`` is written once its victims are on their way out.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from gpufleet.client.errors import ApiError, NotFound
from gpufleet.client.events import NORMAL, EventRecorder
from gpufleet.scheduler.framework import FrameworkHandle
from gpufleet.scheduler.snapshot import PodInfo
from gpufleet.utils.clock import Clock, rfc3339

log = logging.getLogger(__name__)

DISRUPTION_TARGET = "DisruptionTarget"
REASON_PREEMPTION = "PreemptionByScheduler"

Spawn = Callable[[Coroutine[Any, Any, Any], str], Any]


class Preemptor:
    """Nominations and evictions for one scheduler. ``spawn(coro, name)`` runs the API
    writes in the background (the scheduler's tasks, waited for and cancelled with it)."""

    def __init__(
        self,
        client: Any,
        handle: FrameworkHandle,
        recorder: EventRecorder,
        *,
        clock: Clock,
        scheduler_name: str,
        spawn: Spawn,
    ) -> None:
        self.client = client
        self.handle = handle
        self.recorder = recorder
        self.clock = clock
        self.scheduler_name = scheduler_name
        self.spawn = spawn
        # Pod queue key -> the pod placed on the node preemption nominated it for: what it
        # holds there (against pods of no higher priority) while its victims terminate.
        self._nominated: dict[str, PodInfo] = {}

    # -- nominations ------------------------------------------------------------------------

    def nominate(self, pod_info: PodInfo, node: str) -> None:
        key = pod_info.uid or pod_info.key
        self._nominated[key] = pod_info.assigned(node)
        self.handle.nominated_nodes[key] = node

    def is_nominated(self, key: str) -> bool:
        return key in self._nominated

    def forget(self, key: str) -> None:
        if self._nominated.pop(key, None) is not None:
            self.handle.nominated_nodes.pop(key, None)

    def nominees(self, pod_info: PodInfo, own_group: str = "") -> Iterator[PodInfo]:
        """The nominated pods a cycle of ``pod_info`` must leave their room to: those at
        least as important, other than itself and its own gang."""
        own = pod_info.uid or pod_info.key
        for key, nominee in self._nominated.items():
            if key == own or (own_group and nominee.pod_group == own_group):
                continue
            if nominee.priority < pod_info.priority:
                continue
            yield nominee

    # -- evictions --------------------------------------------------------------------------

    def start(self, preemptors: list[tuple[PodInfo, str]], victims: list[PodInfo], name: str) -> None:
        """Nominate every preemptor now and evict the victims in the background."""
        for pod_info, node in preemptors:
            self.nominate(pod_info, node)
        for victim in victims:
            self.handle.pending_victims.add(victim.key)
        self.spawn(self._preempt(preemptors, victims), f"preempt:{name}")

    async def _preempt(self, preemptors: list[tuple[PodInfo, str]], victims: list[PodInfo]) -> None:
        by = preemptors[0][0]
        group = by.pod_group
        who = f"pod group {group}" if group else by.key
        for victim in victims:
            await self._evict(victim, by, victim.node_name)
        for pod_info, node in preemptors:
            await self._set_nominated_node(pod_info, node)
        nodes = sorted({node for _, node in preemptors})
        names = ", ".join(v.key for v in victims)
        for pod_info, node in preemptors:
            await self.recorder.record(
                pod_info.pod,
                NORMAL,
                "Preempting",
                f"Preempting {len(victims)} pod(s) for {who} on node(s) {', '.join(nodes)}: {names}; nominated to {node}",
            )

    async def _evict(self, victim: PodInfo, by: PodInfo, node: str) -> None:
        message = f"Preempted by {by.key} on node {node}"
        condition = {
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": REASON_PREEMPTION,
            "message": f"{self.scheduler_name}: preempting to accommodate a higher priority pod",
            "lastTransitionTime": rfc3339(self.clock.now()),
        }
        with contextlib.suppress(ApiError):
            await self.client.patch(
                "pods",
                victim.name,
                {"status": {"conditions": [condition]}},
                victim.namespace,
                patch_type="strategic",
                subresource="status",
                raw=True,
            )
        spec = victim.pod.spec
        grace = spec.termination_grace_period_seconds if spec is not None else None
        try:
            await self.client.delete(
                "pods",
                victim.name,
                victim.namespace,
                grace_period_seconds=grace,
                preconditions_uid=victim.uid or None,
            )
        except NotFound:
            return
        except ApiError as exc:
            log.warning("could not preempt %s: %s", victim.key, exc)
            self.handle.pending_victims.discard(victim.key)
            return
        log.info("preempted %s on %s for %s", victim.key, node, by.key)
        await self.recorder.record(victim.pod, NORMAL, "Preempted", message)

    async def _set_nominated_node(self, pod_info: PodInfo, node: str) -> None:
        with contextlib.suppress(ApiError):
            await self.client.patch(
                "pods",
                pod_info.name,
                {"status": {"nominatedNodeName": node}},
                pod_info.namespace,
                patch_type="merge",
                subresource="status",
                raw=True,
            )
