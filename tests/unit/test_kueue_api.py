"""The Kueue kinds' models, defaults and validation, and the one Job rule queues rely on:
a suspended Job's scheduling directives may change."""

from __future__ import annotations

from gpufleet.api import validation
from gpufleet.api.defaults import apply_defaults
from gpufleet.api.k8s import Job
from gpufleet.api.kueue import ClusterQueue, LocalQueue, Workload
from gpufleet.api.registry import REGISTRY

GPU = "nvidia.com/gpu"


def cq(**spec) -> ClusterQueue:
    body = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": "team-a"},
            "spec": {"resourceGroups": [{"coveredResources": [GPU], "flavors": [
                {"name": "h100", "resources": [{"name": GPU, "nominalQuota": 8}]}]}], **spec}}
    return ClusterQueue.from_dict(body)


def errors(obj) -> dict[str, str]:
    return {e.field: e.detail for e in validation.validate(obj)}


def test_registered_with_kueue_short_names():
    assert REGISTRY.resolve("queues").kind == "LocalQueue"
    assert REGISTRY.resolve("cq").kind == "ClusterQueue"
    assert REGISTRY.resolve("flavors").kind == "ResourceFlavor"
    assert REGISTRY.resolve("wl").kind == "Workload"
    assert not REGISTRY.resolve("clusterqueues").namespaced


def test_cluster_queue_defaults_as_kueue():
    q = cq()
    apply_defaults(q)
    d = q.to_dict()["spec"]
    assert d["queueingStrategy"] == "BestEffortFIFO"
    assert d["namespaceSelector"] == {}
    assert d["preemption"] == {"reclaimWithinCohort": "Never", "withinClusterQueue": "Never",
                               "borrowWithinCohort": {"policy": "Never"}}
    assert d["flavorFungibility"] == {"whenCanBorrow": "Borrow", "whenCanPreempt": "TryNextFlavor"}
    # Quantities written as numbers come back as strings, as on Kubernetes.
    assert d["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] == "8"


def test_cluster_queue_valid():
    assert errors(cq(cohort="lab")) == {}


def test_cluster_queue_reports_every_problem_with_its_field():
    q = cq(queueingStrategy="Random", preemption={"reclaimWithinCohort": "Sometimes"})
    q.spec.resource_groups[0].flavors[0].resources[0].lending_limit = "10"
    q.spec.resource_groups[0].flavors[0].resources[0].borrowing_limit = "2"
    errs = errors(q)
    assert "spec.queueingStrategy" in errs
    assert "spec.preemption.reclaimWithinCohort" in errs
    assert errs["spec.resourceGroups[0].flavors[0].resources[0].lendingLimit"] in (
        "must be less than or equal to the nominalQuota", "must be nil when cohort is empty")
    assert "spec.resourceGroups[0].flavors[0].resources[0].borrowingLimit" in errs


def test_cluster_queue_flavor_resources_must_match_covered_resources():
    q = cq()
    q.spec.resource_groups[0].covered_resources = [GPU, "cpu"]
    assert "spec.resourceGroups[0].flavors[0].resources" in errors(q)


def test_local_queue_needs_its_cluster_queue_and_keeps_it():
    lq = LocalQueue.from_dict({"metadata": {"name": "a", "namespace": "default"}, "spec": {}})
    assert "spec.clusterQueue" in errors(lq)
    old = LocalQueue.from_dict({"metadata": {"name": "a", "namespace": "default"}, "spec": {"clusterQueue": "x"}})
    new = LocalQueue.from_dict({"metadata": {"name": "a", "namespace": "default"}, "spec": {"clusterQueue": "y"}})
    assert "spec.clusterQueue" in {e.field for e in validation.validate(new, old)}


def test_workload_pod_sets():
    wl = Workload.from_dict({"metadata": {"name": "w", "namespace": "default"}, "spec": {"podSets": [
        {"name": "main", "count": 2, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}},
        {"name": "main", "count": -1, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}]}})
    errs = errors(wl)
    assert "spec.podSets[1].name" in errs and "spec.podSets[1].count" in errs


def job(suspend: bool, node_selector: dict | None = None, image: str = "i") -> Job:
    spec = {"containers": [{"name": "c", "image": image}], "restartPolicy": "Never"}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return Job.from_dict({"metadata": {"name": "j", "namespace": "default"},
                          "spec": {"suspend": suspend, "template": {"spec": spec}}})


def test_a_suspended_job_may_change_where_its_pods_go_but_not_what_they_run():
    fields = {e.field for e in validation.validate(job(False, {"gpu": "h100"}), job(True))}
    assert "spec.template" not in fields
    fields = {e.field for e in validation.validate(job(True, {"gpu": "h100"}, image="other"), job(True))}
    assert "spec.template" in fields
    fields = {e.field for e in validation.validate(job(False, {"gpu": "h100"}), job(False))}
    assert "spec.template" in fields
