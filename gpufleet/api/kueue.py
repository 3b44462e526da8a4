"""Models of the Kueue kinds (kueue.x-k8s.io/v1beta1): ResourceFlavor, ClusterQueue,
LocalQueue and Workload, with their defaults and validation.

Field names and meanings follow Kueue's v1beta1 API, so manifests written for a cluster
running Kueue apply here unchanged:

- a ResourceFlavor names a kind of capacity (a GPU model, a rack) through the node labels
  its pods get (``spec.nodeLabels``);
- a ClusterQueue holds quota per flavor and resource (``spec.resourceGroups``), may share
  its unused quota with the other ClusterQueues of its ``cohort`` (up to ``lendingLimit``)
  and borrow theirs (up to ``borrowingLimit``), and says whom it may preempt;
- a LocalQueue is a namespace's door to one ClusterQueue; jobs name it in the label
  ``kueue.x-k8s.io/queue-name``;
- a Workload is the queue's view of one job: its pod sets (count x pod template) and, once
  admitted, the flavors it was given (``status.admission``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from gpufleet.api import defaults, validation
from gpufleet.api.intorstring import IntOrStringQuantity, KeepsTemplateNumbers
from gpufleet.api.k8s import (
    Condition,
    K8sModel,
    LabelSelector,
    ObjectMeta,
    PodTemplateSpec,
    Quantity,
    Taint,
    Toleration,
)
from gpufleet.api.quantity import parse_quantity

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"

QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
# Workload conditions.
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
PREEMPTED = "Preempted"
FINISHED = "Finished"

QUEUEING_STRATEGIES = ("StrictFIFO", "BestEffortFIFO")
STOP_POLICIES = ("None", "Hold", "HoldAndDrain")
RECLAIM_POLICIES = ("Never", "LowerPriority", "Any")
BORROW_POLICIES = ("Never", "LowerPriority")
WITHIN_QUEUE_POLICIES = ("Never", "LowerPriority", "LowerOrNewerEqualPriority")
FUNGIBILITY_BORROW = ("Borrow", "TryNextFlavor")
FUNGIBILITY_PREEMPT = ("Preempt", "TryNextFlavor")


# --- ResourceFlavor ----------------------------------------------------------------------


class ResourceFlavorSpec(K8sModel):
    node_labels: dict[str, str] | None = Field(
        default=None, alias="nodeLabels",
        description="The labels of the nodes that provide this flavor; admitted pods get them as a node "
                    "selector.")
    node_taints: list[Taint] | None = Field(
        default=None, alias="nodeTaints",
        description="Taints of those nodes; a workload is admitted to the flavor only if it tolerates them.")
    tolerations: list[Toleration] | None = Field(
        default=None, description="Tolerations added to the pods admitted to this flavor.")
    topology_name: str | None = Field(default=None, alias="topologyName",
                                      description="The Topology that describes these nodes.")


class ResourceFlavor(K8sModel):
    """A kind of capacity, told apart by the labels of the nodes that provide it."""

    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "ResourceFlavor"

    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: ResourceFlavorSpec | None = None


# --- ClusterQueue ------------------------------------------------------------------------


class ResourceQuota(K8sModel):
    """The quota of one resource in one flavor. The quantities are kept as sent (2 stays 2,
    "2" stays "2"), as Kueue's CRD (int-or-string) keeps them."""

    name: str = Field(description="The resource, such as cpu, memory or nvidia.com/gpu.")
    nominal_quota: IntOrStringQuantity = Field(
        alias="nominalQuota",
        description="How much of the resource the queue's admitted workloads may use without borrowing.")
    borrowing_limit: IntOrStringQuantity | None = Field(
        default=None, alias="borrowingLimit",
        description="How much more the queue may borrow from its cohort; unlimited when unset. "
                    "Only valid in a cohort.")
    lending_limit: IntOrStringQuantity | None = Field(
        default=None, alias="lendingLimit",
        description="How much of the nominal quota the cohort may borrow; all of it when unset. "
                    "Only valid in a cohort.")


class FlavorQuotas(K8sModel):
    """The quotas a ClusterQueue holds in one ResourceFlavor."""

    name: str = Field(description="The ResourceFlavor's name.")
    resources: list[ResourceQuota] = Field(
        description="The quota of each covered resource.")


class ResourceGroup(K8sModel):
    """Resources whose quota is given together, flavor by flavor: a workload gets all of them
    from the same flavor, tried in the order listed."""

    covered_resources: list[str] = Field(
        alias="coveredResources", description="The resources this group covers, such as cpu and nvidia.com/gpu.")
    flavors: list[FlavorQuotas] = Field(
        description="The flavors, in the order in which workloads try them, with their quotas.")


class BorrowWithinCohort(K8sModel):
    policy: str | None = None
    max_priority_threshold: int | None = Field(default=None, alias="maxPriorityThreshold")


class ClusterQueuePreemption(K8sModel):
    reclaim_within_cohort: str | None = Field(default=None, alias="reclaimWithinCohort")
    borrow_within_cohort: BorrowWithinCohort | None = Field(default=None, alias="borrowWithinCohort")
    within_cluster_queue: str | None = Field(default=None, alias="withinClusterQueue")


class FlavorFungibility(K8sModel):
    when_can_borrow: str | None = Field(default=None, alias="whenCanBorrow")
    when_can_preempt: str | None = Field(default=None, alias="whenCanPreempt")


class FairSharing(K8sModel):
    weight: IntOrStringQuantity | None = None


class AdmissionCheckStrategyRule(K8sModel):
    name: str
    on_flavors: list[str] | None = Field(default=None, alias="onFlavors")


class AdmissionChecksStrategy(K8sModel):
    admission_checks: list[AdmissionCheckStrategyRule] | None = Field(default=None, alias="admissionChecks")


class ClusterQueueSpec(K8sModel):
    resource_groups: list[ResourceGroup] | None = Field(
        default=None, alias="resourceGroups",
        description="The quota, per group of resources and per flavor. A resource may be in one group only.")
    cohort: str | None = Field(
        default=None,
        description="The cohort whose ClusterQueues lend each other their unused quota.")
    queueing_strategy: str | None = Field(
        default=None, alias="queueingStrategy",
        description="StrictFIFO or BestEffortFIFO (the default): whether a workload that does not fit "
                    "blocks the ones behind it.")
    namespace_selector: LabelSelector | None = Field(default=None, alias="namespaceSelector")
    flavor_fungibility: FlavorFungibility | None = Field(default=None, alias="flavorFungibility")
    preemption: ClusterQueuePreemption | None = None
    admission_checks: list[str] | None = Field(default=None, alias="admissionChecks")
    admission_checks_strategy: AdmissionChecksStrategy | None = Field(default=None, alias="admissionChecksStrategy")
    stop_policy: str | None = Field(default=None, alias="stopPolicy")
    fair_sharing: FairSharing | None = Field(default=None, alias="fairSharing")


class ResourceUsage(K8sModel):
    name: str
    total: Quantity | None = None
    borrowed: Quantity | None = None


class FlavorUsage(K8sModel):
    name: str
    resources: list[ResourceUsage]


class FairSharingStatus(K8sModel):
    weighted_share: int = Field(alias="weightedShare")


class ClusterQueueStatus(K8sModel):
    flavors_reservation: list[FlavorUsage] | None = Field(default=None, alias="flavorsReservation")
    flavors_usage: list[FlavorUsage] | None = Field(default=None, alias="flavorsUsage")
    pending_workloads: int | None = Field(default=None, alias="pendingWorkloads")
    reserving_workloads: int | None = Field(default=None, alias="reservingWorkloads")
    admitted_workloads: int | None = Field(default=None, alias="admittedWorkloads")
    conditions: list[Condition] | None = None
    pending_workloads_status: dict[str, Any] | None = Field(default=None, alias="pendingWorkloadsStatus")
    fair_sharing: FairSharingStatus | None = Field(default=None, alias="fairSharing")
    # gpufleet's addition: how many pending workloads wait for what (Quota, Shape, Priority,
    # Preempting, Queued, Inadmissible), for `get clusterqueues` and `get queues`.
    pending_reasons: dict[str, int] | None = Field(default=None, alias="pendingReasons")


class ClusterQueue(K8sModel):
    """Quota per flavor and resource, shared with a cohort, and the rules of preemption."""

    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "ClusterQueue"

    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: ClusterQueueSpec | None = None
    status: ClusterQueueStatus | None = None


# --- LocalQueue --------------------------------------------------------------------------


class LocalQueueSpec(K8sModel):
    cluster_queue: str | None = Field(
        default=None, alias="clusterQueue", description="The ClusterQueue this queue's workloads are admitted by.")
    stop_policy: str | None = Field(
        default=None, alias="stopPolicy",
        description="None, Hold (admit no new workloads) or HoldAndDrain (also evict the admitted ones).")


class LocalQueueFlavorUsage(K8sModel):
    name: str
    resources: list[ResourceUsage]


class LocalQueueStatus(K8sModel):
    pending_workloads: int | None = Field(default=None, alias="pendingWorkloads")
    reserving_workloads: int | None = Field(default=None, alias="reservingWorkloads")
    admitted_workloads: int | None = Field(default=None, alias="admittedWorkloads")
    conditions: list[Condition] | None = None
    flavors_reservation: list[LocalQueueFlavorUsage] | None = Field(default=None, alias="flavorsReservation")
    flavor_usage: list[LocalQueueFlavorUsage] | None = Field(default=None, alias="flavorUsage")
    # gpufleet's addition, as on ClusterQueue.
    pending_reasons: dict[str, int] | None = Field(default=None, alias="pendingReasons")


class LocalQueue(K8sModel):
    """A namespace's queue: the jobs labelled with its name wait in its ClusterQueue."""

    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "LocalQueue"

    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: LocalQueueSpec | None = None
    status: LocalQueueStatus | None = None


# --- Workload ----------------------------------------------------------------------------


class PodSet(KeepsTemplateNumbers):
    name: str
    count: int
    template: PodTemplateSpec
    min_count: int | None = Field(default=None, alias="minCount")
    topology_request: dict[str, Any] | None = Field(default=None, alias="topologyRequest")


class WorkloadSpec(K8sModel):
    pod_sets: list[PodSet] = Field(alias="podSets")
    queue_name: str | None = Field(default=None, alias="queueName")
    priority_class_name: str | None = Field(default=None, alias="priorityClassName")
    priority: int | None = None
    priority_class_source: str | None = Field(default=None, alias="priorityClassSource")
    active: bool | None = None
    maximum_execution_time_seconds: int | None = Field(default=None, alias="maximumExecutionTimeSeconds")


class PodSetAssignment(K8sModel):
    name: str
    flavors: dict[str, str] | None = None
    resource_usage: dict[str, Quantity] | None = Field(default=None, alias="resourceUsage")
    count: int | None = None


class Admission(K8sModel):
    cluster_queue: str = Field(alias="clusterQueue")
    pod_set_assignments: list[PodSetAssignment] = Field(alias="podSetAssignments")


class RequeueState(K8sModel):
    count: int | None = None
    requeue_at: str | None = Field(default=None, alias="requeueAt")


class ReclaimablePod(K8sModel):
    name: str
    count: int


class WorkloadStatus(K8sModel):
    conditions: list[Condition] | None = None
    admission: Admission | None = None
    requeue_state: RequeueState | None = Field(default=None, alias="requeueState")
    reclaimable_pods: list[ReclaimablePod] | None = Field(default=None, alias="reclaimablePods")
    admission_checks: list[dict[str, Any]] | None = Field(default=None, alias="admissionChecks")
    resource_requests: list[dict[str, Any]] | None = Field(default=None, alias="resourceRequests")


class Workload(K8sModel):
    """One job as the queues see it."""

    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "Workload"

    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: WorkloadSpec | None = None
    status: WorkloadStatus | None = None


# --- defaults ------------------------------------------------------------------------------


def _default_cluster_queue(cq: ClusterQueue) -> None:
    if cq.spec is None:
        cq.spec = ClusterQueueSpec()
    spec = cq.spec
    if spec.queueing_strategy is None:
        spec.queueing_strategy = "BestEffortFIFO"
    if spec.namespace_selector is None:
        spec.namespace_selector = LabelSelector()
    if spec.stop_policy is None:
        spec.stop_policy = "None"
    if spec.flavor_fungibility is None:
        spec.flavor_fungibility = FlavorFungibility()
    if spec.flavor_fungibility.when_can_borrow is None:
        spec.flavor_fungibility.when_can_borrow = "Borrow"
    if spec.flavor_fungibility.when_can_preempt is None:
        spec.flavor_fungibility.when_can_preempt = "TryNextFlavor"
    if spec.preemption is None:
        spec.preemption = ClusterQueuePreemption()
    p = spec.preemption
    if p.reclaim_within_cohort is None:
        p.reclaim_within_cohort = "Never"
    if p.within_cluster_queue is None:
        p.within_cluster_queue = "Never"
    if p.borrow_within_cohort is None:
        p.borrow_within_cohort = BorrowWithinCohort(policy="Never")
    elif p.borrow_within_cohort.policy is None:
        p.borrow_within_cohort.policy = "Never"


def _default_local_queue(lq: LocalQueue) -> None:
    if lq.spec is None:
        lq.spec = LocalQueueSpec()
    if lq.spec.stop_policy is None:
        lq.spec.stop_policy = "None"


def _default_workload(wl: Workload) -> None:
    if wl.spec is None:
        return
    if wl.spec.active is None:
        wl.spec.active = True
    for ps in wl.spec.pod_sets:
        if not ps.name:
            ps.name = "main"


defaults.register_defaulter(ClusterQueue, _default_cluster_queue)
defaults.register_defaulter(LocalQueue, _default_local_queue)
defaults.register_defaulter(Workload, _default_workload)


# --- validation ----------------------------------------------------------------------------

Errs = list[validation.FieldError]
_MAX_RESOURCE_GROUPS = 16
_MAX_FLAVORS = 16


def _cluster_scoped_meta(obj: Any, errs: Errs) -> None:
    validation.validate_object_meta(obj.metadata, errs, namespaced=False)


def _quantity(value: Any, path: str, errs: Errs) -> float | None:
    if value is None:
        return None
    try:
        q = parse_quantity(value)
    except ValueError:
        errs.append(validation.invalid(path, value, "must be a quantity, e.g. 8 or 500m"))
        return None
    if q < 0:
        errs.append(validation.invalid(path, value, "must be greater than or equal to 0"))
        return None
    return float(q)


def _validate_resource_flavor(rf: ResourceFlavor, errs: Errs) -> None:
    _cluster_scoped_meta(rf, errs)
    spec = rf.spec or ResourceFlavorSpec()
    if spec.node_labels:
        validation.validate_labels(spec.node_labels, "spec.nodeLabels", errs)
    if spec.tolerations:
        validation.validate_tolerations(spec.tolerations, "spec.tolerations", errs)


def _validate_cluster_queue(cq: ClusterQueue, errs: Errs) -> None:
    _cluster_scoped_meta(cq, errs)
    spec = cq.spec or ClusterQueueSpec()
    if spec.cohort and validation.is_dns1123_subdomain(spec.cohort):
        errs.append(validation.invalid("spec.cohort", spec.cohort,
                                       "a lowercase RFC 1123 subdomain must consist of lower case "
                                       "alphanumeric characters, '-' or '.'"))
    if spec.queueing_strategy is not None and spec.queueing_strategy not in QUEUEING_STRATEGIES:
        errs.append(validation.not_supported("spec.queueingStrategy", spec.queueing_strategy, QUEUEING_STRATEGIES))
    if spec.stop_policy is not None and spec.stop_policy not in STOP_POLICIES:
        errs.append(validation.not_supported("spec.stopPolicy", spec.stop_policy, STOP_POLICIES))
    if spec.namespace_selector is not None:
        validation.validate_label_selector(spec.namespace_selector, "spec.namespaceSelector", errs)
    p = spec.preemption
    if p is not None:
        if p.reclaim_within_cohort is not None and p.reclaim_within_cohort not in RECLAIM_POLICIES:
            errs.append(validation.not_supported("spec.preemption.reclaimWithinCohort", p.reclaim_within_cohort,
                                                 RECLAIM_POLICIES))
        if p.within_cluster_queue is not None and p.within_cluster_queue not in WITHIN_QUEUE_POLICIES:
            errs.append(validation.not_supported("spec.preemption.withinClusterQueue", p.within_cluster_queue,
                                                 WITHIN_QUEUE_POLICIES))
        b = p.borrow_within_cohort
        if b is not None and b.policy is not None and b.policy not in BORROW_POLICIES:
            errs.append(validation.not_supported("spec.preemption.borrowWithinCohort.policy", b.policy,
                                                 BORROW_POLICIES))
        if (b is not None and b.policy not in (None, "Never") and p.reclaim_within_cohort == "Never"):
            errs.append(validation.invalid("spec.preemption", "",
                                           "reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never"))
    ff = spec.flavor_fungibility
    if ff is not None:
        if ff.when_can_borrow is not None and ff.when_can_borrow not in FUNGIBILITY_BORROW:
            errs.append(validation.not_supported("spec.flavorFungibility.whenCanBorrow", ff.when_can_borrow,
                                                 FUNGIBILITY_BORROW))
        if ff.when_can_preempt is not None and ff.when_can_preempt not in FUNGIBILITY_PREEMPT:
            errs.append(validation.not_supported("spec.flavorFungibility.whenCanPreempt", ff.when_can_preempt,
                                                 FUNGIBILITY_PREEMPT))
    if spec.fair_sharing is not None:
        _quantity(spec.fair_sharing.weight, "spec.fairSharing.weight", errs)
    groups = spec.resource_groups or []
    if len(groups) > _MAX_RESOURCE_GROUPS:
        errs.append(_too_many("spec.resourceGroups", len(groups), _MAX_RESOURCE_GROUPS))
    seen_resources: set[str] = set()
    seen_flavors: set[str] = set()
    for i, group in enumerate(groups):
        gpath = f"spec.resourceGroups[{i}]"
        if not group.covered_resources:
            errs.append(validation.required(f"{gpath}.coveredResources", "list at least one resource"))
        for j, res in enumerate(group.covered_resources):
            if res in seen_resources:
                errs.append(validation.duplicate(f"{gpath}.coveredResources[{j}]", res))
            seen_resources.add(res)
        if not group.flavors:
            errs.append(validation.required(f"{gpath}.flavors", "list at least one flavor"))
        if len(group.flavors) > _MAX_FLAVORS:
            errs.append(_too_many(f"{gpath}.flavors", len(group.flavors), _MAX_FLAVORS))
        for j, flavor in enumerate(group.flavors):
            fpath = f"{gpath}.flavors[{j}]"
            if validation.is_dns1123_subdomain(flavor.name):
                errs.append(validation.invalid(f"{fpath}.name", flavor.name,
                                               "must be the name of a ResourceFlavor (a DNS-1123 subdomain)"))
            if flavor.name in seen_flavors:
                errs.append(validation.duplicate(f"{fpath}.name", flavor.name))
            seen_flavors.add(flavor.name)
            names = [r.name for r in flavor.resources]
            if names != list(group.covered_resources):
                errs.append(validation.invalid(
                    f"{fpath}.resources", names,
                    f"must list the group's coveredResources in the same order: {list(group.covered_resources)}"))
            for k, rq in enumerate(flavor.resources):
                rpath = f"{fpath}.resources[{k}]"
                nominal = _quantity(rq.nominal_quota, f"{rpath}.nominalQuota", errs)
                _quantity(rq.borrowing_limit, f"{rpath}.borrowingLimit", errs)
                lending = _quantity(rq.lending_limit, f"{rpath}.lendingLimit", errs)
                if (rq.borrowing_limit is not None or rq.lending_limit is not None) and not spec.cohort:
                    which = "borrowingLimit" if rq.borrowing_limit is not None else "lendingLimit"
                    errs.append(validation.invalid(f"{rpath}.{which}", getattr(rq, _SNAKE[which]),
                                                   "must be nil when cohort is empty"))
                if nominal is not None and lending is not None and lending > nominal:
                    errs.append(validation.invalid(f"{rpath}.lendingLimit", rq.lending_limit,
                                                   "must be less than or equal to the nominalQuota"))


def _too_many(path: str, count: int, limit: int) -> validation.FieldError:
    return validation.invalid(path, count, f"must have at most {limit} items")


_SNAKE = {"borrowingLimit": "borrowing_limit", "lendingLimit": "lending_limit"}


def _validate_local_queue(lq: LocalQueue, errs: Errs) -> None:
    validation.validate_object_meta(lq.metadata, errs)
    spec = lq.spec or LocalQueueSpec()
    if not spec.cluster_queue:
        errs.append(validation.required("spec.clusterQueue", "name the ClusterQueue this queue feeds"))
    elif validation.is_dns1123_subdomain(spec.cluster_queue):
        errs.append(validation.invalid("spec.clusterQueue", spec.cluster_queue,
                                       "must be the name of a ClusterQueue (a DNS-1123 subdomain)"))
    if spec.stop_policy is not None and spec.stop_policy not in STOP_POLICIES:
        errs.append(validation.not_supported("spec.stopPolicy", spec.stop_policy, STOP_POLICIES))


def _validate_local_queue_update(new: LocalQueue, old: LocalQueue, errs: Errs) -> None:
    if (new.spec and old.spec and new.spec.cluster_queue != old.spec.cluster_queue):
        errs.append(validation.invalid("spec.clusterQueue", new.spec.cluster_queue, "field is immutable"))


def _validate_workload(wl: Workload, errs: Errs) -> None:
    validation.validate_object_meta(wl.metadata, errs)
    if wl.spec is None:
        errs.append(validation.required("spec", ""))
        return
    if not wl.spec.pod_sets:
        errs.append(validation.required("spec.podSets", "list at least one pod set"))
    names: set[str] = set()
    for i, ps in enumerate(wl.spec.pod_sets):
        path = f"spec.podSets[{i}]"
        if ps.name in names:
            errs.append(validation.duplicate(f"{path}.name", ps.name))
        names.add(ps.name)
        if ps.count < 0:
            errs.append(validation.invalid(f"{path}.count", ps.count, "must be greater than or equal to 0"))
        if ps.min_count is not None and not 0 < ps.min_count <= ps.count:
            errs.append(validation.invalid(f"{path}.minCount", ps.min_count,
                                           "must be greater than 0 and at most count"))


def _validate_workload_update(new: Workload, old: Workload, errs: Errs) -> None:
    admitted = old.status is not None and old.status.admission is not None
    if admitted and new.spec is not None and old.spec is not None and new.spec.pod_sets != old.spec.pod_sets:
        errs.append(validation.invalid("spec.podSets", "", "field is immutable while the workload holds quota"))


validation.register_validator(ResourceFlavor, _validate_resource_flavor)
validation.register_validator(ClusterQueue, _validate_cluster_queue)
validation.register_validator(LocalQueue, _validate_local_queue, _validate_local_queue_update)
validation.register_validator(Workload, _validate_workload, _validate_workload_update)
