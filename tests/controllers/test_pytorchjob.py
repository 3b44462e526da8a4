"""PyTorchJob controller on an in-process control plane; pod status is set by hand, as a
node agent would report it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ctrl_helpers import NS, events_for, eventually, node, set_pod_status

from gpufleet.client.api import Client
from gpufleet.client.errors import ApiError
from gpufleet.controllers.pytorchjob import CHECKPOINT_ENV, RESTARTS_ANNOTATION

FAST = {"enabled": ("pytorchjob",), "pytorchjob_restart_backoff": 0.0, "pytorchjob_resize_interval": 0.0}


def replica(replicas: int, restart_policy: str = "OnFailure", gpus: int = 0) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "pytorch", "image": "train:v1", "command": ["python", "train.py"]}
    if gpus:
        c["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {"replicas": replicas, "restartPolicy": restart_policy, "template": {"spec": {"containers": [c]}}}


def pytorchjob(name: str, workers: int = 2, master: bool = True, **spec: Any) -> dict[str, Any]:
    specs = {"Worker": replica(workers, **spec.pop("worker_opts", {}))}
    if master:
        specs["Master"] = replica(1)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": NS, **spec.pop("meta", {})},
        "spec": {"pytorchReplicaSpecs": specs, **spec},
    }


async def pods_of(client: Client, job: str) -> dict[str, dict[str, Any]]:
    items = (await client.list("pods", NS, label_selector=f"training.kubeflow.org/job-name={job}", raw=True)).items
    return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


async def condition(client: Client, name: str, type_: str) -> dict[str, Any] | None:
    job = await client.get("pytorchjobs", name, NS, raw=True)
    for c in (job.get("status") or {}).get("conditions") or []:
        if c["type"] == type_ and c["status"] == "True":
            return c
    return None


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


async def test_gang_pods_service_podgroup_and_env(client: Client, controllers) -> None:
    await client.create(node("n1"), raw=True)
    await controllers(**FAST)
    await client.create(pytorchjob("mnist", meta={"annotations": {"gpufleet.io/checkpoint-dir": "/shared/ck"}}),
                        raw=True)
    pods = await eventually(lambda: _count(client, "mnist", 3), what="3 pods")
    assert set(pods) == {"mnist-master-0", "mnist-worker-0", "mnist-worker-1"}
    master, w1 = pods["mnist-master-0"], pods["mnist-worker-1"]
    labels = w1["metadata"]["labels"]
    assert labels["training.kubeflow.org/job-name"] == "mnist"
    assert labels["training.kubeflow.org/replica-type"] == "worker"
    assert labels["training.kubeflow.org/replica-index"] == "1"
    assert labels["training.kubeflow.org/operator-name"] == "pytorchjob-controller"
    assert labels["scheduling.x-k8s.io/pod-group"] == "mnist"
    assert master["metadata"]["labels"]["training.kubeflow.org/job-role"] == "master"
    assert w1["spec"]["restartPolicy"] == "Never"

    menv, wenv = env_of(master), env_of(w1)
    assert menv["RANK"] == "0" and wenv["RANK"] == "2" and wenv["WORLD_SIZE"] == "3"
    assert wenv["PET_NNODES"] == "3" and wenv["PET_NODE_RANK"] == "2" and wenv["PET_NPROC_PER_NODE"] == "1"
    assert wenv["MASTER_PORT"] == menv["MASTER_PORT"]
    port = int(menv["MASTER_PORT"])
    assert {"name": "pytorchjob-port", "containerPort": port, "protocol": "TCP"} in \
        master["spec"]["containers"][0]["ports"]
    # The leader's port is pinned on its node by an annotation, not a hostPort, so the gang
    # passes Pod Security's baseline level; only the leader carries it.
    assert master["metadata"]["annotations"]["gpufleet.io/rendezvous-port"] == str(port)
    assert "gpufleet.io/rendezvous-port" not in (w1["metadata"].get("annotations") or {})
    assert wenv[CHECKPOINT_ENV] == menv[CHECKPOINT_ENV] == "/shared/ck"
    # No node reports an address yet: the leader reads its own, the others the ConfigMap.
    assert menv["MASTER_ADDR"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert wenv["MASTER_ADDR"] == {"configMapKeyRef": {"name": "mnist-rendezvous", "key": "MASTER_ADDR"}}

    svc = await client.get("services", "mnist", NS, raw=True)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"]["training.kubeflow.org/job-name"] == "mnist"
    pg = await eventually(lambda: _get(client, "podgroups", "mnist"))
    assert pg["spec"]["minMember"] == 3
    assert pg["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob"

    # Once the master is bound to a node with an address, the ConfigMap says where it is.
    n1 = await client.get("nodes", "n1", raw=True)
    n1["status"] = {"addresses": [{"type": "InternalIP", "address": "10.1.2.3"}]}
    await client.update_status(n1, raw=True)
    n2 = await client.create(node("n2"), raw=True)
    n2["status"] = {"addresses": [{"type": "InternalIP", "address": "10.1.2.4"}]}
    await client.update_status(n2, raw=True)
    await _bind(client, "mnist-master-0", "n1")
    cm = await eventually(lambda: _get(client, "configmaps", "mnist-rendezvous"))
    assert cm["data"]["MASTER_ADDR"] == "10.1.2.3" and cm["data"]["MASTER_PORT"] == str(port)

    for name in pods:
        await set_pod_status(client, name, phase="Running")
    cond = await eventually(lambda: condition(client, "mnist", "Running"))
    assert cond["reason"] == "PyTorchJobRunning"
    job = await client.get("pytorchjobs", "mnist", NS, raw=True)
    assert job["status"]["replicaStatuses"]["Worker"]["active"] == 2
    assert job["status"]["replicaStatuses"]["Master"]["active"] == 1

    await set_pod_status(client, "mnist-master-0", phase="Succeeded")
    cond = await eventually(lambda: condition(client, "mnist", "Succeeded"))
    assert cond["reason"] == "PyTorchJobSucceeded"


async def test_failed_member_restarts_whole_gang_until_backoff_limit(client: Client, controllers) -> None:
    await controllers(**FAST)
    await client.create(pytorchjob("flaky", runPolicy={"backoffLimit": 1}), raw=True)
    first = await eventually(lambda: _count(client, "flaky", 3))
    await set_pod_status(client, "flaky-worker-1", phase="Failed")
    cond = await eventually(lambda: condition(client, "flaky", "Restarting"))
    assert "pod flaky-worker-1 failed" in cond["message"] and "exit code 1" in cond["message"]
    second = await eventually(lambda: _new_gang(client, "flaky", first))
    assert all(p["metadata"]["annotations"]["gpufleet.io/gang-attempt"] == "1" for p in second.values())
    job = await client.get("pytorchjobs", "flaky", NS, raw=True)
    assert job["metadata"]["annotations"][RESTARTS_ANNOTATION] == "1"
    assert await events_for(client, "flaky", "PyTorchJobRestarting")

    await set_pod_status(client, "flaky-master-0", phase="Failed")
    cond = await eventually(lambda: condition(client, "flaky", "Failed"))
    assert cond["reason"] == "BackoffLimitExceeded"
    assert not await condition(client, "flaky", "Restarting")


async def test_restart_policy_never_fails_the_job(client: Client, controllers) -> None:
    await controllers(**FAST)
    await client.create(pytorchjob("once", worker_opts={"restart_policy": "Never"}), raw=True)
    await eventually(lambda: _count(client, "once", 3))
    await set_pod_status(client, "once-worker-0", phase="Failed")
    cond = await eventually(lambda: condition(client, "once", "Failed"))
    assert "restartPolicy is Never" in cond["message"]


async def test_suspend_deletes_pods_and_resume_recreates(client: Client, controllers) -> None:
    await controllers(**FAST)
    await client.create(pytorchjob("queued", runPolicy={"suspend": True}), raw=True)
    cond = await eventually(lambda: condition(client, "queued", "Suspended"))
    assert cond["reason"] == "PyTorchJobSuspended"
    assert await pods_of(client, "queued") == {}
    await client.patch("pytorchjobs", "queued", {"spec": {"runPolicy": {"suspend": False}}}, NS)
    await eventually(lambda: _count(client, "queued", 3))
    await eventually(lambda: _not(condition(client, "queued", "Suspended")), what="Suspended to clear")


async def test_scale_subresource_moves_workers_within_elastic_bounds(client: Client, controllers) -> None:
    await controllers(**FAST)
    body = pytorchjob("elastic", master=False, elasticPolicy={"minReplicas": 2, "maxReplicas": 4},
                      meta={"annotations": {"gpufleet.io/elastic-autoscale": "false"}})
    await client.create(body, raw=True)
    first = await eventually(lambda: _count(client, "elastic", 2))
    env = env_of(first["elastic-worker-1"])
    assert env["PET_NNODES"] == "2:4" and env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"].endswith(":" + env["MASTER_PORT"])
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert "is_host=false" in env["PET_RDZV_CONF"]
    assert "is_host=true" in env_of(first["elastic-worker-0"])["PET_RDZV_CONF"]
    assert "WORLD_SIZE" not in env
    pg = await eventually(lambda: _get(client, "podgroups", "elastic"))
    assert pg["spec"]["minMember"] == 2  # minReplicas: torchrun starts with those

    scale = await client.set_scale("pytorchjobs", "elastic", 4, NS, raw=True)
    assert scale["spec"]["replicas"] == 4
    job = await client.get("pytorchjobs", "elastic", NS, raw=True)
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4
    grown = await eventually(lambda: _count(client, "elastic", 4))
    # Added under the running group: the first Workers stay.
    assert grown["elastic-worker-0"]["metadata"]["uid"] == first["elastic-worker-0"]["metadata"]["uid"]

    with pytest.raises(ApiError) as err:
        await client.set_scale("pytorchjobs", "elastic", 5, NS)
    assert err.value.code == 422
    assert "spec.pytorchReplicaSpecs[Worker].replicas" in err.value.message
    assert "maxReplicas (4)" in err.value.message

    await client.set_scale("pytorchjobs", "elastic", 2, NS)
    shrunk = await eventually(lambda: _count(client, "elastic", 2))
    assert {p["metadata"]["uid"] for p in shrunk.values()} == {p["metadata"]["uid"] for p in first.values()}
    # Scale-down is not a failure: no gang restart.
    job = await client.get("pytorchjobs", "elastic", NS, raw=True)
    assert RESTARTS_ANNOTATION not in (job["metadata"].get("annotations") or {})


async def test_validation_reports_fields(client: Client) -> None:
    bad = pytorchjob("bad", workers=5, elasticPolicy={"minReplicas": 2, "maxReplicas": 4})
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    with pytest.raises(ApiError) as err:
        await client.create(bad, raw=True)
    msg = err.value.message
    assert "spec.pytorchReplicaSpecs[Master].replicas" in msg and "exactly 1 Master" in msg
    assert "spec.pytorchReplicaSpecs[Worker].replicas" in msg


async def test_autoscale_grows_into_idle_gpus(client: Client, controllers) -> None:
    n = await client.create(node("gpu1"), raw=True)
    n["status"] = {"allocatable": {"nvidia.com/gpu": "4", "cpu": "8"},
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}
    await client.update_status(n, raw=True)
    await controllers(**FAST)
    body = pytorchjob("grow", master=False, elasticPolicy={"minReplicas": 1, "maxReplicas": 3},
                      worker_opts={"gpus": 1})
    body["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 1
    await client.create(body, raw=True)
    pods = await eventually(lambda: _count(client, "grow", 1))
    env = env_of(pods["grow-worker-0"])
    assert env["MASTER_ADDR"] == "127.0.0.1"  # one address for the whole fleet
    for step in (2, 3):
        for name in await pods_of(client, "grow"):
            await _bind(client, name, "gpu1")
            await set_pod_status(client, name, phase="Running")
        # Growing restarts the group; the test stands in for the agent that stops the old pods.
        await eventually(lambda s=step: _count_finishing(client, "grow", s), what=f"{step} workers")
    job = await client.get("pytorchjobs", "grow", NS, raw=True)
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    assert "ElasticGrow" in job["metadata"]["annotations"]["gpufleet.io/elastic-reason"]
    assert await events_for(client, "grow", "ElasticGrow")


async def test_resize_by_restart_re_forms_the_gang_at_the_new_size(client: Client, controllers) -> None:
    await controllers(**FAST)
    body = pytorchjob("whole", master=False, elasticPolicy={"minReplicas": 2, "maxReplicas": 4},
                      meta={"annotations": {"gpufleet.io/elastic-autoscale": "false",
                                            "gpufleet.io/elastic-resize": "restart"}})
    await client.create(body, raw=True)
    first = await eventually(lambda: _count(client, "whole", 2))
    assert env_of(first["whole-worker-0"])["PET_NNODES"] == "2:2"
    await client.set_scale("pytorchjobs", "whole", 4, NS)
    grown = await eventually(lambda: _new_gang_of(client, "whole", first, 4))
    assert {p["metadata"]["annotations"]["gpufleet.io/gang-attempt"] for p in grown.values()} == {"1"}
    assert env_of(grown["whole-worker-3"])["PET_NNODES"] == "4:4"
    cond = await condition(client, "whole", "Restarting")
    assert cond["reason"] == "PyTorchJobResizing" and "with 4 members (was 2)" in cond["message"]
    # The whole gang of 4 is placed together; a resize is not a failure.
    await eventually(lambda: _min_member(client, "whole", 4), what="PodGroup minMember 4")
    job = await client.get("pytorchjobs", "whole", NS, raw=True)
    assert RESTARTS_ANNOTATION not in job["metadata"]["annotations"]


# -- helpers -------------------------------------------------------------------------------


async def _count(client: Client, job: str, n: int) -> dict[str, dict[str, Any]] | None:
    pods = await pods_of(client, job)
    return pods if len(pods) == n else None


async def _min_member(client: Client, name: str, n: int) -> bool:
    pg = await _get(client, "podgroups", name)
    return pg is not None and pg["spec"]["minMember"] == n


async def _not(value: Any) -> bool:
    return not await value


async def _count_finishing(client: Client, job: str, n: int) -> dict[str, dict[str, Any]] | None:
    items = (await client.list("pods", NS, label_selector=f"training.kubeflow.org/job-name={job}", raw=True)).items
    for p in items:
        if p["metadata"].get("deletionTimestamp"):
            await client.delete("pods", p["metadata"]["name"], NS, grace_period_seconds=0)
    return await _count(client, job, n)


async def _new_gang_of(client: Client, job: str, old: dict[str, Any], n: int) -> dict[str, Any] | None:
    pods = await pods_of(client, job)
    old_uids = {p["metadata"]["uid"] for p in old.values()}
    if len(pods) == n and not old_uids & {p["metadata"]["uid"] for p in pods.values()}:
        return pods
    return None


async def _new_gang(client: Client, job: str, old: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    pods = await pods_of(client, job)
    old_uids = {p["metadata"]["uid"] for p in old.values()}
    if len(pods) == len(old) and not old_uids & {p["metadata"]["uid"] for p in pods.values()}:
        return pods
    return None


async def _get(client: Client, kind: str, name: str) -> dict[str, Any] | None:
    try:
        return await client.get(kind, name, NS, raw=True)
    except ApiError:
        return None


async def _bind(client: Client, pod: str, node_name: str) -> None:
    current = await client.get("pods", pod, NS, raw=True)
    if current["spec"].get("nodeName"):
        return
    await client.raw_request(
        "POST", f"/api/v1/namespaces/{NS}/pods/{pod}/binding",
        content=json.dumps({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
                            "target": {"name": node_name}}),
        headers={"content-type": "application/json"})


async def test_lost_member_restarts_the_gang(client: Client, controllers) -> None:
    await controllers(**FAST)
    await client.create(pytorchjob("lossy", workers=1), raw=True)
    first = await eventually(lambda: _count(client, "lossy", 2))
    # Evicted with its node: deleted at once, nobody to report a failure.
    await client.delete("pods", "lossy-worker-0", NS, grace_period_seconds=0)
    cond = await eventually(lambda: condition(client, "lossy", "Restarting"))
    assert "lossy-worker-0 was lost" in cond["message"]
    await eventually(lambda: _new_gang(client, "lossy", first))


async def test_deadline_ttl_and_clean_pod_policy(client: Client, controllers) -> None:
    await controllers(**FAST)
    await client.create(pytorchjob("slow", workers=1, runPolicy={"activeDeadlineSeconds": 1}), raw=True)
    await client.create(pytorchjob("tidy", workers=1, runPolicy={"cleanPodPolicy": "All",
                                                                 "ttlSecondsAfterFinished": 0}), raw=True)
    await eventually(lambda: _count(client, "tidy", 2))
    await set_pod_status(client, "tidy-worker-0", phase="Running")
    await set_pod_status(client, "tidy-master-0", phase="Succeeded")
    # cleanPodPolicy All removes every pod; ttlSecondsAfterFinished 0 then the job itself.
    await eventually(lambda: _gone(client, "tidy"), what="the finished job deleted")
    cond = await eventually(lambda: condition(client, "slow", "Failed"), timeout=5)
    assert cond["reason"] == "DeadlineExceeded"
    await eventually(lambda: _none_left(client, "slow"), what="the pods of the late job stopped")


async def test_autoscale_shrinks_for_higher_priority_pods(client: Client, controllers) -> None:
    n = await client.create(node("gpu2"), raw=True)
    n["status"] = {"allocatable": {"nvidia.com/gpu": "2", "cpu": "8"},
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}
    await client.update_status(n, raw=True)
    await client.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                         "metadata": {"name": "urgent"}, "value": 1000}, raw=True)
    await controllers(**FAST)
    body = pytorchjob("shrink", master=False, elasticPolicy={"minReplicas": 1, "maxReplicas": 2},
                      worker_opts={"gpus": 1})
    await client.create(body, raw=True)
    pods = await eventually(lambda: _count(client, "shrink", 2))
    for name in pods:
        await _bind(client, name, "gpu2")
        await set_pod_status(client, name, phase="Running")
    urgent = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "urgent", "namespace": NS},
              "spec": {"priorityClassName": "urgent", "containers": [
                  {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    await client.create(urgent, raw=True)
    await eventually(lambda: _count_finishing(client, "shrink", 1), what="one worker left")
    job = await client.get("pytorchjobs", "shrink", NS, raw=True)
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    reason = job["metadata"]["annotations"]["gpufleet.io/elastic-reason"]
    assert reason.startswith("ElasticShrink") and "default/urgent" in reason


async def _gone(client: Client, name: str) -> bool:
    # Deleted in the foreground: without a garbage collector running it stays marked.
    job = await _get(client, "pytorchjobs", name)
    return job is None or bool(job["metadata"].get("deletionTimestamp"))


async def _none_left(client: Client, job: str) -> bool:
    return not await pods_of(client, job)


async def test_elastic_members_are_told_apart_and_reachable_without_cluster_dns(client: Client, controllers) -> None:
    async def shared_node(name: str, runtime: str) -> None:
        await client.create(node(name), raw=True)
        await client.patch("nodes", name, {"status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "nodeInfo": {"containerRuntimeVersion": f"{runtime}://", **{k: "x" for k in (
                "architecture", "bootID", "kernelVersion", "kubeProxyVersion", "kubeletVersion", "machineID",
                "operatingSystem", "osImage", "systemUUID")}}}}, subresource="status", raw=True)

    await shared_node("p1", "process")
    await shared_node("p2", "process")
    await controllers(**FAST)
    body = pytorchjob("twins", master=False, elasticPolicy={"minReplicas": 2, "maxReplicas": 3},
                      meta={"annotations": {"gpufleet.io/elastic-autoscale": "false"}})
    await client.create(body, raw=True)
    pods = await eventually(lambda: _count(client, "twins", 2))
    w1 = pods["twins-worker-1"]
    # One address for all: torchrun goes by each member's name, which every member resolves.
    assert env_of(w1)["PET_LOCAL_ADDR"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert w1["spec"]["hostAliases"] == [
        {"ip": "127.0.0.1", "hostnames": ["twins-worker-0", "twins-worker-1", "twins-worker-2"]}]

    # A node whose pods have their own IPs: each member goes by its pod IP.
    await shared_node("c1", "podman")
    await client.create(pytorchjob("apart", master=False, elasticPolicy={"minReplicas": 2, "maxReplicas": 3},
                                   meta={"annotations": {"gpufleet.io/elastic-autoscale": "false"}}), raw=True)
    pods = await eventually(lambda: _count(client, "apart", 2))
    assert env_of(pods["apart-worker-0"])["PET_LOCAL_ADDR"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert not pods["apart-worker-0"]["spec"].get("hostAliases")


def test_a_replica_templates_gpus_count_init_containers_and_sidecars() -> None:
    # What the elastic resize compares with a node's idle GPUs: Kubernetes' pod request.
    # The controller used to sum the regular containers only (1 here for both templates).
    from gpufleet.api.k8s import PodTemplateSpec
    from gpufleet.controllers import pytorchjob

    def gpus(n: int) -> dict[str, Any]:
        return {"limits": {"nvidia.com/gpu": str(n)}}

    warm = PodTemplateSpec.model_validate({"spec": {
        "containers": [{"name": "pytorch", "image": "t", "resources": gpus(1)}],
        "initContainers": [{"name": "warmup", "image": "t", "resources": gpus(4)}]}})
    assert pytorchjob.pod_gpu_request(warm) == 4
    side = PodTemplateSpec.model_validate({"spec": {
        "containers": [{"name": "pytorch", "image": "t", "resources": gpus(1)}],
        "initContainers": [{"name": "profiler", "image": "t", "restartPolicy": "Always", "resources": gpus(1)}]}})
    assert pytorchjob.pod_gpu_request(side) == 2
