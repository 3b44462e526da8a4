"""The admission cycle: read queues, flavors, nodes, pods and Workloads from the informers,
run ``gpufleet.queueing.admission.schedule``, and write what it decided (admissions,
evictions, why the others wait) and the queues' status."""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from gpufleet.api import kueue as kq
from gpufleet.api.gpu import (
    DEFAULT_GROUP,
    GPU_INDICES_ANNOTATION,
    GPU_RESOURCE,
    GPU_TOPOLOGY_ANNOTATION,
    GPUS_ANNOTATION,
    SAME_GROUP,
    parse_gpu_indices,
    parse_gpus_annotation,
)
from gpufleet.api.k8s import PodSpec
from gpufleet.api.podresources import pod_gpu_request, pod_requests
from gpufleet.api.quantity import parse_quantity, whole_amount
from gpufleet.api.selectors import LabelSelector
from gpufleet.api.taints import NO_EXECUTE, NO_SCHEDULE, taint_tuples, toleration_tuples
from gpufleet.client import objects
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import Conflict, NotFound
from gpufleet.client.events import NORMAL
from gpufleet.controllers._common import (
    controller_uid,
    find_condition,
    is_being_deleted,
    now_text,
    pod_is_terminal,
    status_dict,
    timestamp,
)
from gpufleet.controllers.kueue.kinds import _conditions, _is_true, _rv, _set, _wire
from gpufleet.queueing import admission as adm
from gpufleet.queueing import policies
from gpufleet.utils.clock import rfc3339


def _amounts(requests: Mapping[str, Fraction]) -> dict[str, int]:
    """A pod's requests as the queue counts them (cpu in millicores), zero ones left out."""
    return {k: n for k, v in requests.items() if (n := whole_amount(k, v))}


def _node_ready(node: Any) -> bool:
    status = getattr(node, "status", None)
    for c in (status.conditions if status is not None else None) or []:
        if c.type == "Ready":
            return c.status == "True"
    return False


def _node_groups(node: Any) -> dict[str, int]:
    annotations = objects.meta(node, "annotations") or {}
    devices = parse_gpus_annotation(annotations[GPUS_ANNOTATION]) if GPUS_ANNOTATION in annotations else None
    if devices:
        groups: dict[str, int] = {}
        for d in devices:
            if d.healthy:
                groups[d.group] = groups.get(d.group, 0) + 1
        return groups
    status = getattr(node, "status", None)
    alloc = (status.allocatable if status is not None else None) or {}
    gpus = int(parse_quantity(alloc.get(GPU_RESOURCE, "0")))
    return {DEFAULT_GROUP: gpus} if gpus else {}


def _pod_gpu_groups(pod: Any, node: Any | None) -> dict[str, int]:
    gpus = pod_gpu_request(pod)
    if not gpus:
        return {}
    annotations = objects.meta(pod, "annotations") or {}
    devices = None
    if node is not None:
        node_ann = objects.meta(node, "annotations") or {}
        if GPUS_ANNOTATION in node_ann:
            devices = parse_gpus_annotation(node_ann[GPUS_ANNOTATION])
    indices = parse_gpu_indices(annotations.get(GPU_INDICES_ANNOTATION, ""))
    if devices and indices:
        by_index = {d.index: d.group for d in devices}
        out: dict[str, int] = {}
        for i in indices:
            g = by_index.get(i, DEFAULT_GROUP)
            out[g] = out.get(g, 0) + 1
        return out
    if devices:
        # Not yet told which GPUs: charge the largest group (what the scheduler fills first).
        groups: dict[str, int] = {}
        for d in devices:
            groups[d.group] = groups.get(d.group, 0) + 1
        return {max(groups, key=lambda g: groups[g]): gpus}
    return {DEFAULT_GROUP: gpus}


# Pending workloads whose reason stands but whose message changed (the quota short by a
# different amount, say), or that still wait for room but now for another kind of it (quota,
# a node's shape, or room only preemption could make and its priority or rank may not), are
# rewritten at most this many per pass, the first in queue order: with hundreds waiting, every
# admission would otherwise rewrite every one of them.
PENDING_REFRESHES_PER_PASS = 4
_ROOM = frozenset({adm.WAIT_QUOTA, adm.WAIT_SHAPE, adm.WAIT_PRIORITY})

_PREEMPTOR = re.compile(r"accommodate a workload \(([^)\s]+)\)")


def _preemptor(cond: dict[str, Any] | None) -> str:
    """The workload named in a Preempted=True condition's message (written by adm)."""
    if cond is None or cond.get("status") != "True":
        return ""
    m = _PREEMPTOR.search(cond.get("message") or "")
    return m.group(1) if m else ""


def _float_annotation(obj: Any, key: str) -> float:
    try:
        return max(0.0, float((objects.meta(obj, "annotations") or {}).get(key) or 0.0))
    except ValueError:
        return 0.0


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _same_status(old: dict[str, Any], new: dict[str, Any]) -> bool:
    def strip(s: dict[str, Any]) -> dict[str, Any]:
        out = dict(s)
        out["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                             for c in s.get("conditions") or []]
        return out

    return strip(old) == strip(new)


def _format(resource: str, amount: int) -> str:
    if resource == "cpu":
        return str(amount // 1000) if amount % 1000 == 0 else f"{amount}m"
    return str(amount)


class AdmissionCycle:
    """The admission cycle of KueueController (which holds the informers and queues it reads)."""

    pending_refreshes = PENDING_REFRESHES_PER_PASS

    # -- the admission cycle ------------------------------------------------------------------------

    async def run_cycle(self, _key: str) -> Requeue | None:
        if not self.cluster_queues.list() and not self.workloads.list():
            return None  # nothing to admit, nothing waiting: no pass at all
        self.passes += 1
        try:
            return await self._cycle()
        except (Conflict, NotFound):
            return Requeue(after=0.05)

    def _snapshot(self) -> tuple[dict[str, adm.ClusterQueueInfo], dict[str, adm.FlavorInfo],
                                 list[adm.WorkloadInfo], list[adm.NodeInfo], dict[str, Any]]:
        flavors = {}
        for rf in self.flavors.list():
            labels = dict(rf.spec.node_labels or {}) if rf.spec is not None else {}
            tolerations = toleration_tuples(rf.spec.tolerations if rf.spec is not None else None)
            flavors[objects.name_of(rf)] = adm.FlavorInfo(objects.name_of(rf), labels, tolerations)
        queues = {objects.name_of(cq): self._queue_info(cq, flavors) for cq in self.cluster_queues.list()}

        nodes: dict[str, adm.NodeInfo] = {}
        node_objs = {objects.name_of(n): n for n in self.nodes.list()}
        for name, n in node_objs.items():
            if not _node_ready(n) or (n.spec is not None and n.spec.unschedulable):
                continue
            groups = _node_groups(n)
            if groups:
                taints = taint_tuples(n.spec.taints if n.spec else None, (NO_SCHEDULE, NO_EXECUTE))
                nodes[name] = adm.NodeInfo(name, objects.labels_of(n), groups, taints=taints)
        placed: dict[str, list[adm.Placement]] = {}
        bound_per_set: dict[str, dict[str, int]] = {}
        for pod in self.pods.list():
            node_name = pod.spec.node_name
            if not node_name or pod_is_terminal(pod):
                continue
            groups = _pod_gpu_groups(pod, node_objs.get(node_name))
            owner = controller_uid(pod)
            if node_name in nodes:
                used = nodes[node_name].used
                for g, n in groups.items():
                    used[g] = used.get(g, 0) + n
            if owner:
                if groups:
                    placed.setdefault(owner, []).append(adm.Placement(node_name, groups))
                ref = objects.controller_ref(pod)
                kind = self.kinds.get(objects.field(ref, "kind"))
                if kind is not None:
                    per = bound_per_set.setdefault(owner, {})
                    ps = kind.pod_set_of(pod)
                    per[ps] = per.get(ps, 0) + 1

        workloads: list[adm.WorkloadInfo] = []
        models: dict[str, Any] = {}
        infos: dict[str, tuple[tuple[Any, ...], adm.WorkloadInfo]] = {}
        parsed: dict[str, tuple[int, Any, Any, Any]] = {}
        finished: dict[str, Any] = {}
        queue_inputs: dict[tuple[str, str], tuple[Any, ...]] = {}
        for key, cached in self.workloads.items():
            if self._finished.get(key) is cached and key not in self._written:
                finished[key] = cached  # the very object found finished before: still is
                continue
            wl = self._fresh(self.workloads, key)
            seen = self._parsed.get(key)
            if seen is None or seen[2] is not wl:
                # A Workload object not seen at the last pass.
                if wl is None or wl.spec is None or is_being_deleted(wl):
                    continue
                # What a Workload says is read once per resourceVersion: a pass over hundreds
                # of waiting Workloads, most unchanged since the last pass, parses only the
                # changed.
                rv = _rv(wl)
                if seen is None or seen[0] != rv:
                    seen = (rv, self._parse(wl), wl, (self._job_ref(wl), controller_uid(wl) or ""))
                else:
                    seen = (rv, seen[1], wl, seen[3])
            parsed[key] = seen
            part = seen[1]
            if part is None:
                # Finished, or deactivated: not queued until spec.active is true again.
                if wl is cached:
                    finished[key] = cached
                continue
            info = self._queued_info(key, wl, part, seen[3], placed, bound_per_set, infos, queue_inputs)
            workloads.append(info)
            models[key] = wl
        self._parsed = parsed
        self._finished = finished
        self._infos = infos
        return queues, flavors, workloads, list(nodes.values()), models

    def _queued_info(self, key: str, wl: Any, part: adm.WorkloadInfo,
                     owners: tuple[tuple[Any, str] | None, str],
                     placed: dict[str, list[adm.Placement]], bound_per_set: dict[str, dict[str, int]],
                     infos: dict[str, tuple[tuple[Any, ...], adm.WorkloadInfo]],
                     queue_inputs: dict[tuple[str, str], tuple[Any, ...]]) -> adm.WorkloadInfo:
        """``_workload_info``, reused from the last pass for a workload without quota whose
        inputs are what they were then: the Workload, its LocalQueue's and ClusterQueue's specs
        (their generations, not the status each pass writes), its namespace, its job and the
        pods it has placed. Hundreds wait unchanged from one pass to the next."""
        if part.admission is not None:
            return self._workload_info(wl, part, placed, bound_per_set)
        ns, _, _ = key.partition("/")
        queue = wl.spec.queue_name or ""
        # What the queues and the namespace say, once per queue in a pass.
        around = queue_inputs.get((ns, queue))
        if around is None:
            lq = self.local_queues.get(f"{ns}/{queue}") if queue else None
            cq_name = (lq.spec.cluster_queue if lq is not None and lq.spec is not None else "") or ""
            cq = self.cluster_queues.get(cq_name) if cq_name else None
            around = queue_inputs[(ns, queue)] = (
                (objects.uid_of(lq), objects.meta(lq, "generation")) if lq is not None else None,
                (objects.uid_of(cq), objects.meta(cq, "generation")) if cq is not None else None,
                _rv(self.namespaces.get(ns)),
            )
        # A waiting job's progress does not move with time (only a running one's is counted on
        # from its last report): its steps are in the job object, what was measured of them
        # in self.progress, both inputs below. The job is compared as the object the informer
        # holds: a new object for every change.
        job_ref, owner = owners
        job = job_ref[0].get(job_ref[1]) if job_ref is not None else None
        held = placed.get(owner) if owner else None
        progress = self.progress.get(key)
        last = self._infos.get(key)
        if last is not None:
            was = last[0]
            if (was[0] is part and was[1] == around and was[2] is job and was[3] == (tuple(held) if held else ())
                    and was[4] is progress):
                infos[key] = last
                return last[1]
        info = self._workload_info(wl, part, placed, bound_per_set)
        infos[key] = ((part, around, job, tuple(held) if held else (), progress), info)
        return info

    def _job_ref(self, wl: Any) -> tuple[Any, str] | None:
        """The informer and key of the Workload's job (what ``_owner_job`` reads), or None."""
        ref = objects.controller_ref(wl)
        if ref is None:
            return None
        informer = self.job_informers.get(objects.field(ref, "kind"))
        if informer is None:
            return None
        return informer, f"{objects.namespace_of(wl)}/{objects.field(ref, 'name')}"

    def _queue_info(self, cq: Any, flavors: dict[str, adm.FlavorInfo]) -> adm.ClusterQueueInfo:
        spec = cq.spec or kq.ClusterQueueSpec()
        groups: list[adm.ResourceGroupInfo] = []
        quotas: dict[tuple[str, str], adm.Quota] = {}
        missing: list[str] = []
        for g in spec.resource_groups or []:
            groups.append(adm.ResourceGroupInfo(tuple(g.covered_resources), tuple(f.name for f in g.flavors)))
            for f in g.flavors:
                if f.name not in flavors:
                    missing.append(f.name)
                for r in f.resources:
                    quotas[(f.name, r.name)] = adm.Quota(
                        whole_amount(r.name, r.nominal_quota),
                        whole_amount(r.name, r.borrowing_limit) if r.borrowing_limit is not None else None,
                        whole_amount(r.name, r.lending_limit) if r.lending_limit is not None else None,
                    )
        p = spec.preemption or kq.ClusterQueuePreemption()
        bwc = p.borrow_within_cohort or kq.BorrowWithinCohort()
        weight = 1.0
        if spec.fair_sharing is not None and spec.fair_sharing.weight is not None:
            weight = float(parse_quantity(spec.fair_sharing.weight))
        inactive = ""
        annotations = objects.meta(cq, "annotations") or {}
        raw_policy = annotations.get(policies.POLICY_ANNOTATION)
        policy = policies.parse_policy(raw_policy)
        # The attained-service annotations; the first bad one makes such a queue inactive.
        levels, starvation, annotation_problem = None, None, ""
        try:
            levels = policies.parse_levels(annotations.get(policies.LEVELS_ANNOTATION))
        except ValueError as e:
            annotation_problem = f"metadata.annotations[{policies.LEVELS_ANNOTATION}]: Invalid value: {e}"
        try:
            starvation = policies.parse_starvation(annotations.get(policies.STARVATION_ANNOTATION))
        except ValueError as e:
            annotation_problem = annotation_problem or (
                f"metadata.annotations[{policies.STARVATION_ANNOTATION}]: Invalid value: {e}")
        within = None
        try:
            within = policies.parse_order(annotations.get(policies.ORDER_ANNOTATION))
        except ValueError as e:
            annotation_problem = annotation_problem or (
                f"metadata.annotations[{policies.ORDER_ANNOTATION}]: Unsupported value: {e}")
        if missing:
            inactive = "flavor(s) not found: " + ", ".join(sorted(set(missing)))
        elif spec.stop_policy not in (None, "None"):
            inactive = f"stopPolicy is {spec.stop_policy}"
        elif policy is None:
            inactive = (f"metadata.annotations[{policies.POLICY_ANNOTATION}]: Unsupported value: {raw_policy!r}: "
                        f"supported values: {', '.join(policies.POLICIES)}")
        elif annotation_problem and policy == policies.ATTAINED_SERVICE:
            inactive = annotation_problem
        return adm.ClusterQueueInfo(
            name=objects.name_of(cq),
            groups=groups,
            quotas=quotas,
            cohort=spec.cohort or "",
            weight=weight,
            strategy=spec.queueing_strategy or "BestEffortFIFO",
            reclaim_within_cohort=p.reclaim_within_cohort or "Never",
            borrow_within_cohort=bwc.policy or "Never",
            borrow_max_priority=bwc.max_priority_threshold,
            within_cluster_queue=p.within_cluster_queue or "Never",
            when_can_borrow=(spec.flavor_fungibility.when_can_borrow if spec.flavor_fungibility else None) or "Borrow",
            inactive=inactive,
            policy=policy or "",
            levels=levels,
            starvation_factor=starvation,
            within_level=within,
        )

    def _parse(self, wl: Any) -> adm.WorkloadInfo | None:
        """The parts of a Workload's WorkloadInfo that only the Workload decides; None when it
        is not queued (finished, or deactivated without holding quota)."""
        status = status_dict(wl)
        if _is_true(status, kq.FINISHED):
            return None
        admission = status.get("admission")
        if wl.spec.active is False and admission is None:
            return None
        pod_sets = []
        for ps in wl.spec.pod_sets:
            spec = ps.template.spec or PodSpec(containers=[])
            annotations = (ps.template.metadata.annotations if ps.template.metadata is not None else None) or {}
            pod_sets.append(adm.PodSetInfo(
                ps.name, ps.count, _amounts(pod_requests(spec)), dict(spec.node_selector or {}),
                annotations.get(GPU_TOPOLOGY_ANNOTATION) == SAME_GROUP, toleration_tuples(spec.tolerations)))
        conditions = status.get("conditions") or []
        evicted = find_condition(conditions, kq.EVICTED)
        ts = timestamp(objects.meta(wl, "creationTimestamp")) or 0.0
        if evicted is not None and evicted.get("status") == "True":
            ts = timestamp(evicted.get("lastTransitionTime")) or ts
        assignment = None
        if admission is not None:
            assignment = {psa["name"]: dict(psa.get("flavors") or {}) for psa in admission.get("podSetAssignments")
                          or []}
        reserved = find_condition(conditions, kq.QUOTA_RESERVED)
        return adm.WorkloadInfo(
            key=objects.object_key(wl),
            cluster_queue=admission.get("clusterQueue", "") if admission is not None else "",
            pod_sets=pod_sets,
            priority=wl.spec.priority or 0,
            timestamp=ts,
            admission=assignment,
            admitted_at=timestamp((reserved or {}).get("lastTransitionTime")) or 0.0,
            evicting=admission is not None and evicted is not None and evicted.get("status") == "True",
            preempted_by=_preemptor(find_condition(conditions, kq.PREEMPTED)),
            attained=_float_annotation(wl, policies.ATTAINED_ANNOTATION),
        )

    def _workload_info(self, wl: Any, part: adm.WorkloadInfo, placed: dict[str, list[adm.Placement]],
                       bound_per_set: dict[str, dict[str, int]]) -> adm.WorkloadInfo:
        """``part`` (from ``_parse``) completed with what other objects say: the queue (or why
        there is none), the pods bound, the job's progress."""
        ns = objects.namespace_of(wl)
        problem = ""
        cq_name = part.cluster_queue
        lq = self.local_queues.get(f"{ns}/{wl.spec.queue_name}") if wl.spec.queue_name else None
        if part.admission is not None:
            pass
        elif lq is None:
            problem = f"LocalQueue {wl.spec.queue_name} doesn't exist"
        else:
            cq_name = (lq.spec.cluster_queue if lq.spec is not None else "") or ""
            cq = self.cluster_queues.get(cq_name)
            if cq is None:
                problem = f"ClusterQueue {cq_name} doesn't exist"
            elif lq.spec is not None and lq.spec.stop_policy not in (None, "None"):
                problem = f"LocalQueue {wl.spec.queue_name} is stopped"
            else:
                ns_obj = self.namespaces.get(ns)
                sel = cq.spec.namespace_selector if cq.spec is not None else None
                if sel is not None and ns_obj is not None and sel.match_labels is None and \
                        sel.match_expressions is None:
                    pass  # the empty selector matches every namespace
                elif sel is not None and ns_obj is not None and not LabelSelector.from_dict(sel.to_dict()).matches(
                        objects.labels_of(ns_obj)):
                    problem = f"namespace {ns} doesn't match ClusterQueue {cq_name}'s namespaceSelector"
        owner = controller_uid(wl) or ""
        unbound: dict[str, int] = {}
        if part.admission is not None:
            bound = bound_per_set.get(owner, {})
            unbound = {ps.name: max(0, ps.count - bound.get(ps.name, 0)) for ps in part.pod_sets}
        running = part.admission is not None and not part.evicting
        total_steps, progress = self._job_progress(wl, part.admitted_at if running else None)
        return dataclasses.replace(part, cluster_queue=cq_name, placed=placed.get(owner, []), unbound=unbound,
                                   problem=problem, total_steps=total_steps, progress=progress)

    def _job_progress(self, wl: Any, run: float | None) -> tuple[int | None, policies.Progress | None]:
        """The steps the Workload's job declares, and its progress (the steps it reports,
        folded into what was measured before: a step's time)."""
        job = self._owner_job(wl)
        annotations = (objects.meta(job, "annotations") or {}) if job is not None else {}
        total = _int_or_none(annotations.get(policies.TOTAL_STEPS_ANNOTATION))
        key = objects.object_key(wl)
        prev = self.progress.get(key)
        done = _int_or_none(annotations.get(policies.STEPS_DONE_ANNOTATION))
        if done is None:
            return total, prev
        now = self.clock.now()
        known = policies.measure(prev, done, run, now)
        self.progress[key] = known
        return total, known

    async def _cycle(self) -> Requeue | None:
        queues, flavors, workloads, nodes, models = self._snapshot()
        # Declaring a fairSharing weight on any ClusterQueue turns fair sharing on, too.
        fair = self.fair_sharing or any(cq.spec is not None and cq.spec.fair_sharing is not None
                                        for cq in self.cluster_queues.list())
        result = adm.schedule(queues, flavors, workloads, nodes, fair_sharing=fair, now=self.clock.now(),
                              memo=self._ranks)
        now = now_text(self.clock)
        infos = {w.key: w for w in workloads}
        for key in set(self.progress) - set(infos):
            del self.progress[key]
        for key, wl in models.items():
            # Deactivated while holding quota: stopped like a preempted one.
            if wl.spec.active is False and not infos[key].evicting:
                await self._evict(wl, adm.Preemption("", "InactiveWorkload", "The workload is deactivated"), now,
                                  reason="InactiveWorkload", info=infos[key])
        for key, assignment in result.admitted.items():
            wl, info = models[key], infos[key]
            cq = queues.get(info.cluster_queue)
            if cq is not None and cq.policy == policies.ATTAINED_SERVICE and policies.promoted(
                    info.attained, info.gpus, info.timestamp, self.clock.now(), cq.levels, cq.starvation_factor):
                wl = await self._set_attained(wl, 0.0)  # promoted for starving: its service starts over
            await self._admit(wl, info, assignment, key in result.borrowing, now)
        for key, pre in result.preempted.items():
            await self._evict(models[key], pre, now, info=infos[key])
        refreshes = self.pending_refreshes
        for key, wait in result.waiting.items():
            last = self._pending_memo.get(key)
            if last is not None and last[1] == wait.kind and last[2] == wait.message and \
                    last[0] == self._parsed[key][0]:
                continue  # this very wait was already written (the test _pending begins with)
            refreshes -= await self._pending(models[key], wait, now, refresh=refreshes > 0)
        for key in set(self._pending_memo) - set(infos):
            del self._pending_memo[key]
        await self._queue_statuses(queues, workloads, result, models)
        if result.requeue_after is not None:
            return Requeue(after=max(result.requeue_after, 0.001))
        return None

    async def _admit(self, wl: Any, info: adm.WorkloadInfo, assignment: adm.Assignment, borrowing: bool,
                     now: str) -> None:
        status = status_dict(wl)
        conditions = _conditions(status)
        assignments = []
        for ps in info.pod_sets:
            flavors = assignment.get(ps.name) or {}
            usage = {r: _format(r, a * ps.count) for r, a in ps.requests.items() if r in flavors}
            assignments.append({"name": ps.name, "flavors": flavors, "resourceUsage": usage, "count": ps.count})
        waited = max(0.0, self.clock.now() - info.timestamp)
        message = f"Quota reserved in ClusterQueue {info.cluster_queue}, wait time since queued was {math.ceil(waited)}s"
        # To the microsecond: preemption gives up the most recently admitted first.
        _set(conditions, kq.QUOTA_RESERVED, "True", "QuotaReserved", message, rfc3339(self.clock.now(), micro=True))
        _set(conditions, kq.ADMITTED, "True", "Admitted", "The workload is admitted", now)
        if find_condition(conditions, kq.EVICTED) is not None:
            _set(conditions, kq.EVICTED, "False", "QuotaReserved", "Previously: evicted, now admitted again", now)
        if find_condition(conditions, kq.PREEMPTED) is not None:
            _set(conditions, kq.PREEMPTED, "False", "QuotaReserved", "Previously: preempted, now admitted again", now)
        new = {**status, "conditions": conditions,
               "admission": {"clusterQueue": info.cluster_queue, "podSetAssignments": assignments}}
        await self._write_status(wl, new)
        self._announced.pop(info.key, None)
        await self.recorder.record(wl, NORMAL, "QuotaReserved", message + (" (borrowing)" if borrowing else ""))
        await self.recorder.record(wl, NORMAL, "Admitted", f"Admitted by ClusterQueue {info.cluster_queue}")

    async def _evict(self, wl: Any, pre: adm.Preemption, now: str, *, reason: str = "Preempted",
                     info: adm.WorkloadInfo | None = None) -> None:
        if info is not None and info.admission is not None and not info.evicting and info.gpus:
            # The run ends: its GPU-time joins the Workload's attained service.
            wl = await self._set_attained(wl, policies.attained(info.gpus, info.attained, info.admitted_at,
                                                                self.clock.now()))
        status = status_dict(wl)
        conditions = _conditions(status)
        _set(conditions, kq.EVICTED, "True", reason, pre.message, now)
        if reason == "Preempted":
            _set(conditions, kq.PREEMPTED, "True", pre.reason, pre.message, now)
        await self._write_status(wl, {**status, "conditions": conditions})
        await self.recorder.record(wl, NORMAL, reason, pre.message)

    async def _set_attained(self, wl: Any, service: float) -> Any:
        """Write the Workload's attained service (GPU-seconds of its runs that are over)."""
        body = _wire(wl)
        body["metadata"].setdefault("annotations", {})[policies.ATTAINED_ANNOTATION] = f"{service:.3f}"
        wl = await self.client.update(body)
        self._written[objects.object_key(wl)] = wl
        return wl

    async def _pending(self, wl: Any, wait: adm.Wait, now: str, *, refresh: bool = True) -> int:
        """Write why ``wl`` waits. Returns 1 when that was only a new message for the same
        reason (a refresh, of which a pass makes at most ``pending_refreshes``, in
        queue order), else 0."""
        key = objects.object_key(wl)
        rv = _rv(wl)
        memo = (rv, wait.kind, wait.message)
        last = self._pending_memo.get(key)
        if last == memo:
            return 0  # this very wait was already written (or found there) and announced
        message_only = last is not None and last[0] == rv and (
            last[1] == wait.kind or {last[1], wait.kind} <= _ROOM)
        if message_only and not refresh:
            return 0  # the reason stands; its message is refreshed by a later pass
        await self._write_pending(wl, wait, now)
        self._pending_memo[key] = (_rv(self._fresh(self.workloads, key) or wl), wait.kind, wait.message)
        return 1 if message_only else 0

    async def _write_pending(self, wl: Any, wait: adm.Wait, now: str) -> None:
        status = status_dict(wl)
        conditions = _conditions(status)
        if _set(conditions, kq.QUOTA_RESERVED, "False", wait.kind, wait.message, now):
            await self._write_status(wl, {**status, "conditions": conditions})
        key = objects.object_key(wl)
        if self._announced.get(key) != wait.kind:
            self._announced[key] = wait.kind
            await self.recorder.record(wl, NORMAL, "Pending", wait.message)
            job = self._owner_job(wl)
            if job is not None:
                await self.recorder.record(job, NORMAL, "Pending", f"{wait.kind}: {wait.message}")

    def _owner_job(self, wl: Any) -> Any | None:
        ref = self._job_ref(wl)
        return ref[0].get(ref[1]) if ref is not None else None

    # -- queue status ---------------------------------------------------------------------------

    async def _queue_statuses(self, queues: dict[str, adm.ClusterQueueInfo], workloads: list[adm.WorkloadInfo],
                              result: adm.CycleResult, models: dict[str, Any]) -> None:
        holding = {w.key: (result.admitted.get(w.key) or w.admission) for w in workloads
                   if w.admission is not None or w.key in result.admitted}
        usage: adm.Usage = {}
        for w in workloads:
            assignment = holding.get(w.key)
            if assignment is None:
                continue
            per = usage.setdefault(w.cluster_queue, {})
            for fr, amount in adm.workload_usage(w, assignment).items():
                per[fr] = per.get(fr, 0) + amount
        quotas = adm.Quotas(queues)
        # (ClusterQueue, LocalQueue key, holding, why it waits) -> workloads: counted once,
        # then summed per queue (hundreds wait in a few queues).
        tally: collections.Counter[tuple[str, str, bool, str | None]] = collections.Counter()
        waiting = result.waiting
        for w in workloads:
            key = w.key
            wl = models.get(key)
            queue = (wl.spec.queue_name or "") if wl is not None else self._queue_name(key)
            held = key in holding
            reason = None if held else waiting.get(key)
            tally[(w.cluster_queue, f"{key.partition('/')[0]}/{queue}", held,
                   reason.kind if reason is not None else None)] += 1
        per_queue: dict[str, dict[str, Any]] = {}
        per_local: dict[str, dict[str, Any]] = {}
        for (cq_name, lq_key, held, kind), n in tally.items():
            for bucket in (per_queue.setdefault(cq_name, {}), per_local.setdefault(lq_key, {})):
                if held:
                    bucket["admitted"] = bucket.get("admitted", 0) + n
                else:
                    bucket["pending"] = bucket.get("pending", 0) + n
                    if kind is not None:
                        reasons = bucket.setdefault("reasons", {})
                        reasons[kind] = reasons.get(kind, 0) + n
        for cq in self.cluster_queues.list():
            name = objects.name_of(cq)
            info = queues.get(name)
            counts = per_queue.get(name, {})
            used = usage.get(name, {})
            flavors_usage = []
            if info is not None:
                for g in info.groups:
                    for f in g.flavors:
                        resources = []
                        for r in g.resources:
                            total = used.get((f, r), 0)
                            nominal = info.quotas[(f, r)].nominal if (f, r) in info.quotas else 0
                            resources.append({"name": r, "total": _format(r, total),
                                              "borrowed": _format(r, max(0, total - nominal))})
                        flavors_usage.append({"name": f, "resources": resources})
            status = status_dict(cq)
            conditions = _conditions(status)
            active = info is not None and not info.inactive
            _set(conditions, "Active", "True" if active else "False", "Ready" if active else "Inactive",
                 "Can admit new workloads" if active else (info.inactive if info else ""), now_text(self.clock))
            share = quotas.share(info, usage) if info is not None else 0.0
            new = {
                **status,
                "flavorsReservation": flavors_usage,
                "flavorsUsage": flavors_usage,
                "pendingWorkloads": counts.get("pending", 0),
                "reservingWorkloads": counts.get("admitted", 0),
                "admittedWorkloads": counts.get("admitted", 0),
                "pendingReasons": counts.get("reasons", {}),
                "fairSharing": {"weightedShare": int(share) if math.isfinite(share) else 2**62},
                "conditions": conditions,
            }
            if _same_status(status, new):
                continue
            try:
                await self.client.update_status({**_wire(cq), "status": new})
            except (Conflict, NotFound):
                self._poke()
        for lq in self.local_queues.list():
            key = objects.object_key(lq)
            counts = per_local.get(key, {})
            status = status_dict(lq)
            new = {
                **status,
                "pendingWorkloads": counts.get("pending", 0),
                "reservingWorkloads": counts.get("admitted", 0),
                "admittedWorkloads": counts.get("admitted", 0),
                "pendingReasons": counts.get("reasons", {}),
            }
            if _same_status(status, new):
                continue
            try:
                await self.client.update_status({**_wire(lq), "status": new})
            except (Conflict, NotFound):
                self._poke()

    def _queue_name(self, wl_key: str) -> str:
        wl = self._fresh(self.workloads, wl_key)
        return (wl.spec.queue_name if wl is not None and wl.spec is not None else "") or ""
