"""VolumeBinding over a snapshot: where a pod's claims let it go, Kubernetes' reasons when
they do not, and the PreBind that hands a WaitForFirstConsumer claim its node and waits
for the volume."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sched_factories import make_node, make_pod, node_info

from gpufleet.api import storage
from gpufleet.scheduler.framework import (
    Code,
    CycleState,
    FitError,
    Framework,
    FrameworkHandle,
    ScheduleResult,
)
from gpufleet.scheduler.plugins.volumebinding import (
    BIND_CONFLICT,
    NODE_CONFLICT,
    PV_NOT_EXIST,
    UNBOUND_IMMEDIATE,
    VolumeBinding,
)
from gpufleet.scheduler.snapshot import PodInfo, Snapshot
from gpufleet.scheduler.volumes import StorageState, StorageTracker
from gpufleet.utils.clock import FakeClock

NS = "default"


def pod_with_claims(name: str = "train", *claims: str, gpus: int = 0, ephemeral: str | None = None) -> PodInfo:
    data = make_pod(name, gpus=gpus).to_dict()
    data["spec"]["volumes"] = [{"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}}
                               for i, c in enumerate(claims)]
    if ephemeral:
        data["spec"]["volumes"].append({"name": ephemeral, "ephemeral": {"volumeClaimTemplate": {"spec": {}}}})
    return PodInfo(data)


def claim(name: str = "data", *, cls: str | None = "local-path", volume: str = "", phase: str = "Pending",
          selected: str = "", deleting: bool = False, rv: int = 1) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": str(rv)}
    annotations = {}
    if volume:
        annotations[storage.ANN_BIND_COMPLETED] = "yes"
    if selected:
        annotations[storage.ANN_SELECTED_NODE] = selected
    if annotations:
        meta["annotations"] = annotations
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}},
                            "volumeMode": "Filesystem"}
    if cls is not None:
        spec["storageClassName"] = cls
    if volume:
        spec["volumeName"] = volume
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec,
            "status": {"phase": phase}}


def volume(name: str, node: str | None = None, *, cls: str = "local-path", phase: str = "Available",
           claim_ref: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "10Gi"},
                            "hostPath": {"path": f"/data/{name}"}, "storageClassName": cls,
                            "volumeMode": "Filesystem"}
    if node:
        spec["nodeAffinity"] = storage.node_affinity_for(node)
    if claim_ref:
        spec["claimRef"] = {"namespace": NS, "name": claim_ref, "uid": f"uid-{claim_ref}"}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec,
            "status": {"phase": phase}}


def storage_class(name: str = "local-path", *, wffc: bool = True, provisioner: str = storage.LOCAL_PATH_PROVISIONER,
                  **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": provisioner, "reclaimPolicy": "Delete",
            "volumeBindingMode": "WaitForFirstConsumer" if wffc else "Immediate", **extra}


def snapshot(*, claims=(), volumes=(), classes=(storage_class(),), gpus: dict[str, int] | None = None) -> Snapshot:
    gpus = gpus if gpus is not None else {"n1": 8, "n2": 8}
    snap = Snapshot([node_info(make_node(name, gpus=count)) for name, count in gpus.items()])
    snap.storage = StorageState.of(claims, volumes, classes)
    return snap


def schedule(pod: PodInfo, snap: Snapshot) -> ScheduleResult | FitError:
    return Framework().schedule(pod, snap)


def feasible(pod: PodInfo, snap: Snapshot) -> list[str]:
    return sorted(n.name for n in Framework().feasible_nodes(pod, snap))


# --- where a pod may go ------------------------------------------------------------------------


def test_a_pod_without_claims_is_not_looked_at() -> None:
    plugin = VolumeBinding()
    state = CycleState()
    assert plugin.pre_filter(state, PodInfo(make_pod("p")), snapshot()).is_skip


def test_a_missing_claim_keeps_the_pod_off_every_node_with_kubernetes_message() -> None:
    result = schedule(pod_with_claims("train", "data"), snapshot())
    assert isinstance(result, FitError)
    assert result.message.startswith('0/2 nodes are available: persistentvolumeclaim "data" not found.')
    assert result.diagnosis.unschedulable_plugins == {"VolumeBinding"}
    assert all(s.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE for s in result.diagnosis.node_statuses.values())


@pytest.mark.parametrize(("pvc", "message"), [
    (claim(cls="fast"), UNBOUND_IMMEDIATE),
    (claim(cls=""), UNBOUND_IMMEDIATE),
    (claim(deleting=True), 'persistentvolumeclaim "data" is being deleted'),
    (claim(volume="gone", phase="Lost"), 'persistentvolumeclaim "data" bound to non-existent persistentvolume "gone"'),
])
def test_claims_that_no_node_can_help(pvc: dict[str, Any], message: str) -> None:
    snap = snapshot(claims=[pvc], classes=[storage_class(), storage_class("fast", wffc=False)])
    result = schedule(pod_with_claims("train", "data"), snap)
    assert isinstance(result, FitError)
    assert result.diagnosis.pre_filter_msg == message


def test_an_ephemeral_volumes_claim_is_waited_for() -> None:
    result = schedule(pod_with_claims("train", ephemeral="scratch"), snapshot())
    assert isinstance(result, FitError)
    assert result.diagnosis.pre_filter_msg == ('waiting for ephemeral volume controller to create the '
                                               'persistentvolumeclaim "train-scratch"')


def test_a_bound_claims_volume_pins_the_pod_to_its_node() -> None:
    snap = snapshot(claims=[claim(volume="pv-1", phase="Bound")], volumes=[volume("pv-1", "n2", phase="Bound",
                                                                                claim_ref="data")])
    pod = pod_with_claims("train", "data")
    assert feasible(pod, snap) == ["n2"]
    result = schedule(pod, snap)
    assert isinstance(result, ScheduleResult) and result.node == "n2"


def test_the_volume_node_conflict_is_reported_beside_other_reasons() -> None:
    snap = snapshot(claims=[claim(volume="pv-1", phase="Bound")],
                    volumes=[volume("pv-1", "n2", phase="Bound", claim_ref="data")], gpus={"n1": 8, "n2": 0})
    result = schedule(pod_with_claims("train", "data", gpus=4), snap)
    assert isinstance(result, FitError)
    assert result.message.startswith(f"0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 {NODE_CONFLICT}.")


def test_a_claim_bound_to_a_missing_volume_fits_nowhere() -> None:
    snap = snapshot(claims=[claim(volume="pv-1", phase="Bound")])
    result = schedule(pod_with_claims("train", "data"), snap)
    assert isinstance(result, FitError)
    assert result.message.startswith(f"0/2 nodes are available: 2 {PV_NOT_EXIST}.")


def test_a_claim_waiting_for_its_first_consumer_allows_every_node_its_class_provisions_on() -> None:
    pod = pod_with_claims("train", "data")
    assert feasible(pod, snapshot(claims=[claim()])) == ["n1", "n2"]
    zoned = storage_class(allowedTopologies=[{"matchLabelExpressions": [
        {"key": storage.HOSTNAME_LABEL, "values": ["n1"]}]}])
    assert feasible(pod, snapshot(claims=[claim()], classes=[zoned])) == ["n1"]


def test_without_a_provisioner_only_nodes_with_a_free_volume_fit() -> None:
    manual = storage_class("manual", provisioner=storage.NO_PROVISIONER)
    pod = pod_with_claims("train", "data")
    snap = snapshot(claims=[claim(cls="manual")], volumes=[volume("pv-1", "n2", cls="manual")], classes=[manual])
    assert feasible(pod, snap) == ["n2"]
    snap = snapshot(claims=[claim(cls="manual")], volumes=[volume("pv-1", "n2", cls="manual", claim_ref="other")],
                    classes=[manual])
    result = schedule(pod, snap)
    assert isinstance(result, FitError)
    assert result.message.startswith(f"0/2 nodes are available: 2 {BIND_CONFLICT}.")


def test_two_claims_of_one_pod_do_not_count_one_volume_twice() -> None:
    manual = storage_class("manual", provisioner=storage.NO_PROVISIONER)
    claims = [claim("a", cls="manual"), claim("b", cls="manual")]
    one = snapshot(claims=claims, volumes=[volume("pv-1", "n1", cls="manual")], classes=[manual])
    assert feasible(pod_with_claims("train", "a", "b"), one) == []
    two = snapshot(claims=claims, volumes=[volume("pv-1", "n1", cls="manual"), volume("pv-2", "n1", cls="manual")],
                   classes=[manual])
    assert feasible(pod_with_claims("train", "a", "b"), two) == ["n1"]


def test_a_claim_already_promised_to_a_node_keeps_its_pods_there() -> None:
    snap = snapshot(claims=[claim(selected="n1")])
    assert feasible(pod_with_claims("train", "data"), snap) == ["n1"]


# --- PreBind: the claim gets its node, the binding waits for its volume --------------------------


class Provisioner:
    """The API as the plugin's PreBind meets it, and what the PV controller and the
    provisioner then do to the claim: shown to the tracker the plugin waits on a moment
    later, as the informers would."""

    def __init__(self, tracker: StorageTracker, *, succeed: bool = True) -> None:
        self.tracker = tracker
        self.succeed = succeed
        self.revision = 10
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self._tasks: list[asyncio.Task] = []

    async def patch(self, kind: str, name: str, body: dict[str, Any], namespace: str, **_: Any) -> dict[str, Any]:
        self.patches.append((name, body))
        self.revision += 1
        node = body["metadata"]["annotations"][storage.ANN_SELECTED_NODE]
        if node is not None and self.succeed:
            self._tasks.append(asyncio.ensure_future(self._provision(name, node, self.revision)))
        return {"metadata": {"name": name, "resourceVersion": str(self.revision)}}

    async def _provision(self, name: str, node: str, rv: int) -> None:
        await asyncio.sleep(0)
        self.tracker.put_claim(claim(name, selected=node, rv=rv))
        await asyncio.sleep(0)
        self.tracker.put_volume(volume(f"pvc-{name}", node, phase="Bound", claim_ref=name))
        self.tracker.put_claim(claim(name, selected=node, volume=f"pvc-{name}", phase="Bound", rv=rv + 2))


def pre_bind_setup(*pvcs: dict[str, Any], timeout: float = 60.0, clock: Any = None,
                   succeed: bool = True) -> tuple[VolumeBinding, Provisioner, CycleState, PodInfo]:
    tracker = StorageTracker()
    tracker.put_class(storage_class())
    for pvc in pvcs:
        tracker.put_claim(pvc)
    provisioner = Provisioner(tracker, succeed=succeed)
    handle = FrameworkHandle(client=provisioner, volumes=tracker, **({"clock": clock} if clock else {}))
    handle.snapshot = snapshot()
    plugin = VolumeBinding({"bindTimeoutSeconds": timeout}, handle)
    pod = pod_with_claims("train", *[p["metadata"]["name"] for p in pvcs])
    state = CycleState()
    snap = snapshot(claims=list(pvcs))
    assert plugin.pre_filter(state, pod, snap).is_success
    return plugin, provisioner, state, pod


async def test_prebind_names_the_node_and_waits_until_the_claim_is_bound() -> None:
    plugin, provisioner, state, pod = pre_bind_setup(claim("data"))
    status = await plugin.pre_bind(state, pod, "n2")
    assert status.is_success, status
    assert provisioner.patches == [("data", {"metadata": {"annotations": {storage.ANN_SELECTED_NODE: "n2"}}})]
    bound = plugin.handle.volumes.state().claim(NS, "data")
    assert bound["spec"]["volumeName"] == "pvc-data"


async def test_prebind_gives_the_claim_back_when_no_volume_comes() -> None:
    plugin, provisioner, state, pod = pre_bind_setup(claim("data"), timeout=5.0, clock=FakeClock(), succeed=False)
    status = await plugin.pre_bind(state, pod, "n1")
    assert status.code is Code.UNSCHEDULABLE
    assert status.message == 'running PreBind plugin "VolumeBinding": binding volumes: timed out waiting for the condition'
    # Nothing was bound: the node named is taken back, so the next attempt may choose again.
    assert [body for _, body in provisioner.patches] == [
        {"metadata": {"annotations": {storage.ANN_SELECTED_NODE: "n1"}}},
        {"metadata": {"annotations": {storage.ANN_SELECTED_NODE: None}}}]


async def test_prebind_stops_when_the_provisioner_gives_the_claim_back() -> None:
    plugin, provisioner, state, pod = pre_bind_setup(claim("data", selected="n1"), succeed=False)
    tracker = plugin.handle.volumes

    async def give_back() -> None:
        await asyncio.sleep(0)
        tracker.put_claim(claim("data", rv=2))

    task = asyncio.ensure_future(give_back())
    status = await plugin.pre_bind(state, pod, "n1")
    await task
    assert provisioner.patches == []
    assert status.message == 'running PreBind plugin "VolumeBinding": binding volumes: provisioning failed for PVC "data"'


async def test_prebind_has_nothing_to_do_for_bound_claims() -> None:
    plugin, provisioner, state, pod = pre_bind_setup(claim("data", volume="pv-1", phase="Bound"))
    assert (await plugin.pre_bind(state, pod, "n1")).is_success
    assert provisioner.patches == []
