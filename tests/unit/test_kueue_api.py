"""The Kueue kinds' models, defaults and validation, and the one Job rule queues rely on:
a suspended Job's scheduling directives may change."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from gpufleet.api import validation
from gpufleet.api.defaults import apply_defaults
from gpufleet.api.k8s import Job
from gpufleet.api.kubeflow import PyTorchJob
from gpufleet.api.kueue import ClusterQueue, LocalQueue, Workload
from gpufleet.api.registry import REGISTRY
from gpufleet.apiserver.server import ApiServer
from gpufleet.controllers._common import pod_from_template
from gpufleet.store.base import open_store
from gpufleet.utils.http import RawRequest

GPU = "nvidia.com/gpu"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


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
    # A custom resource keeps its quantities as sent (Kueue's CRD says int-or-string).
    assert d["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] == 8


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


# --- custom resources keep the JSON types of their quantities ---------------------------------


def example(path: str, kind: str, name: str) -> dict[str, Any]:
    docs = yaml.safe_load_all((EXAMPLES / path).read_text())
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def limits(job: dict[str, Any], rtype: str) -> dict[str, Any]:
    spec = job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]
    return spec["containers"][0]["resources"]["limits"]


def quotas(cq: dict[str, Any]) -> dict[str, Any]:
    return cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]


class Wire:
    """The API server behind the same request objects the HTTP adapter hands it."""

    def __init__(self, server: ApiServer) -> None:
        self.server = server

    async def call(self, method: str, path: str, body: Any = None,
                   content_type: str = "application/json") -> tuple[int, Any]:
        data = orjson.dumps(body) if body is not None else b""
        headers = {"content-type": content_type} if data else {}
        resp = await self.server.handle(RawRequest(method, path, [], headers, data))
        return resp.status, orjson.loads(resp.body)


@pytest.fixture
async def wire(tmp_path: Path):
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    await store.start()
    server = ApiServer(store)
    await server.start()
    yield Wire(server)
    await store.close()


async def test_numeric_quantities_of_custom_resources_round_trip_through_the_api(wire: Wire) -> None:
    jobs = "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs"
    cqs = "/apis/kueue.x-k8s.io/v1beta1/clusterqueues"
    pgs = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/default/podgroups"
    manifest = example("training/pytorchjob.yaml", "PyTorchJob", "mlp")
    assert limits(manifest, "Worker") == {GPU: 1}  # the example as a user writes it
    queue = example("queues/teams.yaml", "ClusterQueue", "team-a")
    queue["metadata"]["name"] = "mixed"
    quotas(queue)["lendingLimit"] = "1"  # a string stays a string
    group = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "g"},
             "spec": {"minMember": 2, "minResources": {GPU: 4, "cpu": "500m"}}}

    for path, body in ((jobs, manifest), (cqs, queue), (pgs, group)):
        status, created = await wire.call("POST", path, copy.deepcopy(body))
        assert status == 201, created

    status, job = await wire.call("GET", f"{jobs}/mlp")
    assert status == 200, job
    assert limits(job, "Master") == {GPU: 1} and limits(job, "Worker") == {GPU: 1}
    _, cq = await wire.call("GET", f"{cqs}/mixed")
    assert quotas(cq) == {"name": GPU, "nominalQuota": 2, "borrowingLimit": 2, "lendingLimit": "1"}
    _, pg = await wire.call("GET", f"{pgs}/g")
    assert pg["spec"]["minResources"] == {GPU: 4, "cpu": "500m"}

    # Sending the manifest again (what `kubectl apply` patches when it sees a difference)
    # changes nothing: no new resourceVersion, no new generation.
    for path, body, before in ((f"{jobs}/mlp", manifest, job), (f"{cqs}/mixed", queue, cq)):
        status, after = await wire.call("PATCH", path, {"spec": body["spec"]}, "application/merge-patch+json")
        assert status == 200, after
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert after["metadata"]["generation"] == before["metadata"]["generation"]

    # What the controllers read is still a quantity; the pods made from the template are
    # built-in Pods, whose quantities are strings as on Kubernetes.
    model = PyTorchJob.from_dict(job)
    assert model.spec.pytorch_replica_specs["Worker"].template.spec.containers[0].resources.limits == {GPU: "1"}
    assert model.to_dict() == job
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "mlp",
             "uid": job["metadata"]["uid"], "controller": True}
    pod = pod_from_template(model.spec.pytorch_replica_specs["Worker"].template, namespace="default",
                            generate_name="mlp-worker-", owner_ref=owner)
    status, created = await wire.call("POST", "/api/v1/namespaces/default/pods", pod)
    assert status == 201, created
    assert created["spec"]["containers"][0]["resources"]["limits"] == {GPU: "1"}


def test_a_quantity_must_be_a_number_or_a_quantity_string() -> None:
    body = example("queues/teams.yaml", "ClusterQueue", "team-a")
    quotas(body)["nominalQuota"] = "lots"
    assert [e.message() for e in validation.validate(ClusterQueue.from_dict(body))] == [
        'spec.resourceGroups[0].flavors[0].resources[0].nominalQuota: Invalid value: "lots": '
        "must be a quantity, e.g. 8 or 500m"]
    for wrong in (True, [2]):
        quotas(body)["nominalQuota"] = wrong
        with pytest.raises(ValueError, match="a quantity is a number or a string"):
            ClusterQueue.from_dict(body)
