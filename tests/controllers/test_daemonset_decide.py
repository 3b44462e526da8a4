"""The DaemonSet's decisions as plain functions: no API server, no informers."""

from __future__ import annotations

import copy
from typing import Any

from gpufleet.api.defaults import apply_defaults
from gpufleet.api.k8s import ControllerRevision, DaemonSet, Node, Pod
from gpufleet.controllers import history
from gpufleet.controllers.actions import Instant
from gpufleet.controllers.daemonset import Observed, decide
from gpufleet.controllers.daemonset.model import should_run, target_node

NOW = Instant(1_000_000.0, "1970-01-12T13:46:40Z", 50.0)
LONG_AGO = "1970-01-12T13:00:00Z"


def ds(image: str = "agent:v1", *, node_selector: dict | None = None, strategy: dict | None = None,
       tolerations: list | None = None) -> DaemonSet:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": image}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if tolerations:
        spec["tolerations"] = tolerations
    obj = DaemonSet.from_dict({
        "metadata": {"name": "logs", "namespace": "kube-system", "uid": "ds-uid", "generation": 1},
        "spec": {"selector": {"matchLabels": {"app": "logs"}},
                 "template": {"metadata": {"labels": {"app": "logs"}}, "spec": spec},
                 **({"updateStrategy": strategy} if strategy else {})}})
    apply_defaults(obj)
    return obj


def node(name: str, labels: dict | None = None, taints: list | None = None) -> Node:
    return Node.from_dict({"metadata": {"name": name, "labels": labels or {}},
                           "spec": {"taints": taints} if taints else {}})


def revision(d: DaemonSet, number: int = 1) -> ControllerRevision:
    create = history.update_revision(d, "DaemonSet", d.spec.template.to_dict(), [], 0, hash_data=False).actions.creates[0]
    body = copy.deepcopy(create.body)
    body["revision"] = number
    body["metadata"]["uid"] = f"rev-{number}"
    return ControllerRevision.from_dict(body)


def hash_of(rev: ControllerRevision) -> str:
    return rev.metadata.labels["controller.kubernetes.io/hash"]


def pod(name: str, node_name: str, rev: ControllerRevision, *, ready: bool = True, phase: str = "Running",
        created: str = LONG_AGO, scheduled: bool = True) -> Pod:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}], "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}}}}
    if scheduled:
        spec["nodeName"] = node_name
    return Pod.from_dict({
        "metadata": {"name": name, "namespace": "kube-system", "uid": f"uid-{name}", "creationTimestamp": created,
                     "labels": {"app": "logs", "controller-revision-hash": hash_of(rev)}},
        "spec": spec,
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                                   "lastTransitionTime": LONG_AGO}]}})


def created_for(actions) -> list[str]:
    return sorted(target_node(Pod.from_dict(c.body)) for c in actions.creates if c.body["kind"] == "Pod")


def deleted(actions) -> list[str]:
    return sorted(d.name for d in actions.deletes if d.kind is Pod)


def test_every_matching_node_gets_a_pod_pinned_to_it_with_the_daemon_tolerations():
    d = ds(node_selector={"role": "gpu"})
    rev = revision(d)
    nodes = [node("a", {"role": "gpu"}), node("b", {"role": "cpu"}), node("c", {"role": "gpu"})]
    actions = decide(Observed(d, nodes, {}, [rev]), NOW)
    assert created_for(actions) == ["a", "c"]
    body = actions.creates[0].body
    assert body["metadata"]["generateName"] == "logs-"
    assert body["metadata"]["labels"] == {"app": "logs", "controller-revision-hash": hash_of(rev)}
    assert body["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}]}
    assert "nodeName" not in body["spec"]  # the scheduler places it
    keys = {(t["key"], t["effect"]) for t in body["spec"]["tolerations"]}
    assert keys == {("node.kubernetes.io/not-ready", "NoExecute"), ("node.kubernetes.io/unreachable", "NoExecute"),
                    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
                    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
                    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
                    ("node.kubernetes.io/unschedulable", "NoSchedule")}
    assert actions.status["desiredNumberScheduled"] == 2 and actions.status["currentNumberScheduled"] == 0


def test_taints_decide_where_daemons_run_and_stay():
    d = ds()
    assert should_run(d, node("n", taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}])) == (
        True, True)
    assert should_run(d, node("n", taints=[{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}])) \
        == (True, True)
    assert should_run(d, node("n", taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}])) == (False, True)
    assert should_run(d, node("n", taints=[{"key": "gpu", "value": "yes", "effect": "NoExecute"}])) == (False, False)
    tolerant = ds(tolerations=[{"key": "gpu", "operator": "Exists"}])
    assert should_run(tolerant, node("n", taints=[{"key": "gpu", "value": "yes", "effect": "NoExecute"}])) == (
        True, True)

    rev = revision(d)
    here = {"a": [pod("logs-a", "a", rev)], "b": [pod("logs-b", "b", rev)]}
    nodes = [node("a", taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]),
             node("b", taints=[{"key": "gpu", "value": "yes", "effect": "NoExecute"}])]
    actions = decide(Observed(d, nodes, here, [rev]), NOW)
    assert deleted(actions) == ["logs-b"] and not actions.creates
    assert actions.status["numberMisscheduled"] == 2 and actions.status["desiredNumberScheduled"] == 0


def test_nodes_leaving_or_relabelled_lose_their_daemon():
    d = ds(node_selector={"role": "gpu"})
    rev = revision(d)
    by_node = {"a": [pod("logs-a", "a", rev)], "gone": [pod("logs-gone", "gone", rev, scheduled=False)],
               "b": [pod("logs-b", "b", rev)]}
    actions = decide(Observed(d, [node("a", {"role": "gpu"}), node("b", {"role": "cpu"})], by_node, [rev]), NOW)
    assert deleted(actions) == ["logs-b", "logs-gone"]
    assert actions.status["numberMisscheduled"] == 1 and actions.status["numberReady"] == 1


def test_extra_pods_on_a_node_lose_all_but_the_oldest():
    d = ds()
    rev = revision(d)
    pods = [pod("young", "a", rev, created="1970-01-12T13:30:00Z"), pod("old", "a", rev)]
    assert deleted(decide(Observed(d, [node("a")], {"a": pods}, [rev]), NOW)) == ["young"]


def test_a_failed_pod_is_replaced_after_a_back_off():
    d = ds()
    rev = revision(d)
    failed = {"a": [pod("logs-a", "a", rev, phase="Failed", ready=False)]}
    first = decide(Observed(d, [node("a")], failed, [rev]), NOW)
    assert deleted(first) == ["logs-a"] and not first.creates
    backoff = first.memo["backoff"]
    assert backoff["a"][0] > NOW.monotonic
    again = decide(Observed(d, [node("a")], failed, [rev], backoff=backoff), NOW)
    assert not deleted(again) and again.requeue_after is not None
    # Gone: a new one.
    assert created_for(decide(Observed(d, [node("a")], {}, [rev], backoff=backoff), NOW)) == ["a"]


def test_rolling_update_with_max_unavailable_replaces_one_node_at_a_time():
    old_ds = ds()
    old = revision(old_ds, 1)
    d = ds("agent:v2")
    new = revision(d, 2)
    nodes = [node("a"), node("b"), node("c")]
    pods = {n: [pod(f"old-{n}", n, old)] for n in "abc"}
    first = decide(Observed(d, nodes, pods, [old, new]), NOW)
    assert first.reason == "RollingUpdate" and deleted(first) == ["old-a"]
    assert "updatedNumberScheduled" not in first.status  # zero: omitted, as Kubernetes omits it
    # a's new pod is not available yet: nothing more. An unavailable old pod may go at once.
    pods["a"] = [pod("new-a", "a", new, ready=False)]
    pods["c"] = [pod("old-c", "c", old, ready=False)]
    second = decide(Observed(d, nodes, pods, [old, new]), NOW)
    assert deleted(second) == ["old-c"]
    pods["a"] = [pod("new-a", "a", new)]
    pods["c"] = [pod("new-c", "c", new)]
    third = decide(Observed(d, nodes, pods, [old, new]), NOW)
    assert deleted(third) == ["old-b"] and third.status["updatedNumberScheduled"] == 2


def test_rolling_update_with_max_surge_starts_the_new_pod_beside_the_old_one():
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    old = revision(ds(strategy=strategy), 1)
    d = ds("agent:v2", strategy=strategy)
    new = revision(d, 2)
    nodes = [node("a"), node("b")]
    pods = {n: [pod(f"old-{n}", n, old)] for n in "ab"}
    first = decide(Observed(d, nodes, pods, [old, new]), NOW)
    assert created_for(first) == ["a"] and not deleted(first)
    pods["a"] = [pods["a"][0], pod("new-a", "a", new, ready=False, created="1970-01-12T13:40:00Z")]
    waiting = decide(Observed(d, nodes, pods, [old, new]), NOW)
    assert not deleted(waiting) and not created_for(waiting)
    pods["a"][1] = pod("new-a", "a", new, created="1970-01-12T13:40:00Z")
    done = decide(Observed(d, nodes, pods, [old, new]), NOW)
    assert deleted(done) == ["old-a"]


def test_on_delete_leaves_old_pods_and_a_new_pod_is_new():
    old = revision(ds(strategy={"type": "OnDelete"}), 1)
    d = ds("agent:v2", strategy={"type": "OnDelete"})
    new = revision(d, 2)
    actions = decide(Observed(d, [node("a"), node("b")], {"a": [pod("old-a", "a", old)]}, [old, new]), NOW)
    assert not deleted(actions) and created_for(actions) == ["b"]
    assert actions.creates[-1].body["metadata"]["labels"]["controller-revision-hash"] == hash_of(new)
