"""Quota arithmetic: what a workload uses per (flavor, resource), what each ClusterQueue uses
now, and how much it may still take, nominal, lent and borrowed, within its cohort."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from gpufleet.queueing.workloads import Assignment, ClusterQueueInfo, FlavorResource, WorkloadInfo

Usage = dict[str, dict[FlavorResource, int]]  # cluster queue -> (flavor, resource) -> amount


def workload_usage(wl: WorkloadInfo, assignment: Assignment | None = None) -> dict[FlavorResource, int]:
    """What the workload counts against its queue's quota under ``assignment`` (default: its own)."""
    assignment = assignment if assignment is not None else wl.admission or {}
    out: dict[FlavorResource, int] = {}
    for ps in wl.pod_sets:
        flavors = assignment.get(ps.name) or {}
        for res, amount in ps.requests.items():
            flavor = flavors.get(res)
            if flavor is not None and amount:
                out[(flavor, res)] = out.get((flavor, res), 0) + amount * ps.count
    return out


def usage_of(workloads: Iterable[WorkloadInfo], exclude: set[str] = frozenset()) -> Usage:  # type: ignore[assignment]
    usage: Usage = {}
    for wl in workloads:
        if wl.admission is None or wl.key in exclude:
            continue
        per = usage.setdefault(wl.cluster_queue, {})
        for fr, amount in workload_usage(wl).items():
            per[fr] = per.get(fr, 0) + amount
    return usage


class Quotas:
    """The ClusterQueues and their cohorts, answering 'how much more may this queue use'."""

    def __init__(self, queues: Mapping[str, ClusterQueueInfo]) -> None:
        self.queues = queues
        self.cohorts: dict[str, list[ClusterQueueInfo]] = {}
        for cq in queues.values():
            if cq.cohort:
                self.cohorts.setdefault(cq.cohort, []).append(cq)

    def members(self, cq: ClusterQueueInfo) -> list[ClusterQueueInfo]:
        return self.cohorts.get(cq.cohort, [cq]) if cq.cohort else [cq]

    def available(self, cq: ClusterQueueInfo, fr: FlavorResource, usage: Usage) -> int:
        """Kueue's ``available``: unused guaranteed quota plus what the cohort can still lend,
        capped by the queue's borrowingLimit. Negative when the queue is over its share."""
        quota = cq.quotas.get(fr)
        if quota is None:
            return 0
        used = usage.get(cq.name, {}).get(fr, 0)
        if not cq.cohort:
            return quota.nominal - used
        local = max(0, quota.guaranteed - used)
        pool = 0
        pool_used = 0
        for member in self.members(cq):
            q = member.quotas.get(fr)
            if q is None:
                continue
            pool += q.nominal - q.guaranteed
            pool_used += max(0, usage.get(member.name, {}).get(fr, 0) - q.guaranteed)
        parent = pool - pool_used
        if quota.borrowing_limit is not None:
            stored = quota.nominal - quota.guaranteed
            used_in_parent = max(0, used - quota.guaranteed)
            parent = min(stored - used_in_parent + quota.borrowing_limit, parent)
        return local + parent

    def borrowing(self, cq: ClusterQueueInfo, usage: Usage, frs: Iterable[FlavorResource] | None = None) -> bool:
        """Whether the queue uses more than its nominal quota (of ``frs``, or of anything)."""
        used = usage.get(cq.name, {})
        keys = list(frs) if frs is not None else list(used)
        return any(used.get(fr, 0) > cq.quotas[fr].nominal for fr in keys if fr in cq.quotas)

    def share(self, cq: ClusterQueueInfo, usage: Usage) -> float:
        """Kueue's dominant resource share: for each resource, what the queue borrows as a
        part (per mille) of what the cohort can lend, the largest of them, over the weight."""
        if not cq.cohort:
            return 0.0
        borrowed: dict[str, int] = {}
        for fr, amount in usage.get(cq.name, {}).items():
            quota = cq.quotas.get(fr)
            nominal = quota.nominal if quota is not None else 0
            if amount > nominal:
                borrowed[fr[1]] = borrowed.get(fr[1], 0) + amount - nominal
        if not borrowed:
            return 0.0
        lendable: dict[str, int] = {}
        for member in self.members(cq):
            for (_f, res), q in member.quotas.items():
                lendable[res] = lendable.get(res, 0) + (q.lending_limit if q.lending_limit is not None else q.nominal)
        drs = max(amount * 1000 / lendable[res] if lendable.get(res) else math.inf
                  for res, amount in borrowed.items())
        if cq.weight <= 0:
            return math.inf
        return drs / cq.weight
