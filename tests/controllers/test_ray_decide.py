"""KubeRay's RayCluster and RayJob as plain decisions: the `ray start` commands built from
the pods' resources, the pods, Service, ConfigMap and PodGroup around a cluster, scaling and
workersToDelete, the status with KubeRay's field names, a RayJob's deployment states, and
validation naming the field. No API server, no informers, no Ray."""

from __future__ import annotations

import copy
import json
from typing import Any

from gpufleet.api import ray as api
from gpufleet.api.defaults import apply_defaults
from gpufleet.api.k8s import Pod
from gpufleet.api.validation import validate
from gpufleet.controllers.actions import Instant
from gpufleet.controllers.ray import ClusterObserved, JobObserved, decide_cluster, decide_job
from gpufleet.controllers.ray import pods as rp
from gpufleet.controllers.ray.job import submit_command
from gpufleet.utils.clock import rfc3339

T0 = 1_700_000_000.0
NOW = Instant(T0, rfc3339(T0), 10.0)


def container(gpus: int | None = None, cpu: str | None = "1", memory: str | None = None) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if cpu:
        limits["cpu"] = cpu
    if memory:
        limits["memory"] = memory
    if gpus is not None:
        limits["nvidia.com/gpu"] = gpus
    return {"name": "ray", "image": "rayproject/ray:2.60.0", "resources": {"limits": limits}}


def cluster_dict(replicas: int = 2, *, lo: int = 1, hi: int = 4, suspend: bool = False,
                 to_delete: list[str] | None = None, params: dict[str, Any] | None = None) -> dict[str, Any]:
    group: dict[str, Any] = {"groupName": "gpu", "replicas": replicas, "minReplicas": lo, "maxReplicas": hi,
                             "rayStartParams": params or {},
                             "template": {"spec": {"containers": [container(gpus=1)]}}}
    if to_delete is not None:
        group["scaleStrategy"] = {"workersToDelete": to_delete}
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "rc", "namespace": "default", "uid": "rc-uid", "generation": 1},
            "spec": {"suspend": suspend,
                     "headGroupSpec": {"rayStartParams": {},
                                       "template": {"spec": {"containers": [container(cpu="2", memory="4Gi")]}}},
                     "workerGroupSpecs": [group]}}


def cluster(**kw: Any) -> api.RayCluster:
    rc = api.RayCluster.from_dict(cluster_dict(**kw))
    apply_defaults(rc)
    return rc


def pod(body: dict[str, Any], name: str, *, phase: str = "Running", ready: bool = True, ip: str = "10.0.0.5",
        host_ports: dict[str, int] | None = None) -> Pod:
    body = copy.deepcopy(body)
    body["metadata"].pop("generateName", None)
    body["metadata"].update(name=name, uid=f"uid-{name}")
    if host_ports is not None:
        body["metadata"].setdefault("annotations", {})["gpufleet.io/host-ports"] = json.dumps(host_ports)
    body["spec"]["nodeName"] = "node-a"
    body["status"] = {"phase": phase, "podIP": ip,
                      "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return Pod.from_dict(body)


def head_of(rc: api.RayCluster, **kw: Any) -> Pod:
    return pod(rp.head_pod_body(rc, rc.spec, True), "rc-head-abcde",
               host_ports={"gcs-server": 31000, "dashboard": 31001, "client": 31002}, **kw)


def worker_of(rc: api.RayCluster, name: str, **kw: Any) -> Pod:
    return pod(rp.worker_pod_body(rc, rc.spec, rc.spec.worker_group_specs[0], True), name, **kw)


def created(actions: Any, kind: str) -> list[dict[str, Any]]:
    return [c.body for c in actions.creates if c.body.get("kind") == kind]


# -- ray start -------------------------------------------------------------------------------


def test_gpus_and_cpus_of_ray_start_come_from_the_container_resources() -> None:
    line = rp.ray_start_command("worker", {}, container(gpus=2, cpu="1500m", memory="2Gi"))
    assert "--num-gpus=2" in line and "--num-cpus=2" in line and f"--memory={2 << 30}" in line
    assert '--address="${FQ_RAY_IP}:${GPUFLEET_RAY_GCS_PORT}"' in line
    assert line.startswith("ulimit -n 65536; ray start ")
    # rayStartParams win over what the resources say; no GPU limit gives no --num-gpus.
    assert "--num-gpus=0" in rp.ray_start_command("worker", {"num-gpus": "0"}, container(gpus=2))
    assert "--num-gpus" not in rp.ray_start_command("worker", {}, container())


def test_the_head_listens_on_the_ports_its_agent_hands_out() -> None:
    line = rp.ray_start_command("head", {"object-store-memory": "80000000"}, container())
    assert line.startswith("ulimit -n 65536; ray start --head ")
    assert '--port="${GPUFLEET_PORT_GCS_SERVER:-6379}"' in line
    assert '--dashboard-port="${GPUFLEET_PORT_DASHBOARD:-8265}"' in line
    assert "--dashboard-host=0.0.0.0" in line and "--object-store-memory=80000000" in line
    assert '--dashboard-agent-listen-port="${GPUFLEET_PORT_DASHBOARD_AGENT:-52365}"' in line


def test_pods_carry_kuberays_labels_and_block_or_run_the_templates_command() -> None:
    rc = cluster()
    head = rp.head_pod_body(rc, rc.spec, True)
    labels = head["metadata"]["labels"]
    assert labels["ray.io/cluster"] == "rc" and labels["ray.io/node-type"] == "head"
    assert labels["ray.io/group"] == "headgroup" and labels["scheduling.x-k8s.io/pod-group"] == "rc"
    assert head["metadata"]["generateName"] == "rc-head-"
    c = head["spec"]["containers"][0]
    assert c["command"] == ["/bin/bash", "-c", "--"] and c["args"][0].endswith("--block")
    assert [p["name"] for p in c["ports"]] == ["gcs-server", "dashboard", "client", "dashboard-agent"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/api/gcs_healthz", "port": "dashboard"}
    worker = rp.worker_pod_body(rc, rc.spec, rc.spec.worker_group_specs[0], True)
    env = {e["name"]: e for e in worker["spec"]["containers"][0]["env"]}
    assert env["FQ_RAY_IP"]["valueFrom"]["configMapKeyRef"] == {"name": "rc-head", "key": "RAY_IP"}
    assert worker["metadata"]["generateName"] == "rc-gpu-worker-"
    probe = worker["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    assert probe == {"path": "/api/local_raylet_healthz", "port": "dashboard-agent"}
    # A template with a command of its own runs it after `ray start`.
    d = cluster_dict()
    d["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["command"] = ["python", "serve.py"]
    rc2 = api.RayCluster.from_dict(d)
    args = rp.worker_pod_body(rc2, rc2.spec, rc2.spec.worker_group_specs[0], False)["spec"]["containers"][0]["args"]
    assert args[0].endswith("&& python serve.py") and "--block" not in args[0]


# -- the cluster's sync ------------------------------------------------------------------------


def test_a_new_cluster_gets_its_service_podgroup_and_head_before_any_worker() -> None:
    rc = cluster()
    a = decide_cluster(ClusterObserved(rc, []), NOW)
    assert [s["metadata"]["name"] for s in created(a, "Service")] == ["rc-head-svc"]
    assert created(a, "PodGroup")[0]["spec"] == {"minMember": 2}  # the head and minReplicas 1
    pods = created(a, "Pod")
    assert [p["metadata"]["labels"]["ray.io/node-type"] for p in pods] == ["head"]
    assert a.status["state"] if "state" in a.status else True
    assert "state" not in a.status and a.status["desiredWorkerReplicas"] == 2


def test_workers_are_made_once_the_head_exists_and_find_it_through_the_configmap() -> None:
    rc = cluster()
    a = decide_cluster(ClusterObserved(rc, [head_of(rc)]), NOW)
    assert len(created(a, "Pod")) == 2
    cm = created(a, "ConfigMap")[0]
    assert cm["metadata"]["name"] == "rc-head"
    assert cm["data"]["RAY_IP"] == "10.0.0.5" and cm["data"]["RAY_PORT"] == "31000"
    assert cm["data"]["RAY_DASHBOARD_PORT"] == "31001"


def test_status_has_kuberays_fields_once_everything_runs() -> None:
    rc = cluster()
    pods = [head_of(rc), worker_of(rc, "w1"), worker_of(rc, "w2", ready=False)]
    a = decide_cluster(ClusterObserved(rc, pods), NOW)
    st = a.status
    assert st["availableWorkerReplicas"] == 2 and st["readyWorkerReplicas"] == 1
    assert "state" not in st  # a worker is not ready yet
    pods[2] = worker_of(rc, "w2")
    st = decide_cluster(ClusterObserved(rc, pods), NOW).status
    assert st["state"] == "ready" and st["readyWorkerReplicas"] == 2
    assert (st["desiredWorkerReplicas"], st["minWorkerReplicas"], st["maxWorkerReplicas"]) == (2, 1, 4)
    assert (st["desiredCPU"], st["desiredMemory"], st["desiredGPU"]) == ("4", "4Gi", "2")
    assert st["endpoints"] == {"client": "31002", "dashboard": "31001", "gcs-server": "31000"}
    assert st["head"] == {"serviceName": "rc-head-svc", "podName": "rc-head-abcde", "podIP": "10.0.0.5",
                          "serviceIP": "10.0.0.5"}
    conds = {c["type"]: c["status"] for c in st["conditions"]}
    assert conds == {"HeadPodReady": "True", "RayClusterProvisioned": "True"}
    assert api.cluster_printer_cells({"status": st}) == [2, 2, "4", "4Gi", "2", "ready"]


def test_replicas_are_clamped_and_scaled_both_ways() -> None:
    rc = cluster(replicas=9, hi=3)
    a = decide_cluster(ClusterObserved(rc, [head_of(rc)]), NOW)
    assert len(created(a, "Pod")) == 3
    rc = cluster(replicas=1)
    pods = [head_of(rc), worker_of(rc, "w1"), worker_of(rc, "w2", phase="Pending", ready=False)]
    a = decide_cluster(ClusterObserved(rc, pods), NOW)
    assert [d.name for d in a.deletes] == ["w2"]  # the pending one goes first


def test_workers_to_delete_go_and_the_list_is_cleared() -> None:
    rc = cluster(replicas=1, to_delete=["w1"])
    pods = [head_of(rc), worker_of(rc, "w1"), worker_of(rc, "w2")]
    a = decide_cluster(ClusterObserved(rc, pods), NOW)
    assert [d.name for d in a.deletes] == ["w1"] and not created(a, "Pod")
    (patch,) = a.patches
    assert patch.patch["spec"]["workerGroupSpecs"][0]["scaleStrategy"]["workersToDelete"] == []
    assert patch.patch["spec"]["workerGroupSpecs"][0]["replicas"] == 1


def test_an_ended_worker_is_replaced_and_suspend_deletes_every_pod() -> None:
    rc = cluster(replicas=1)
    pods = [head_of(rc), worker_of(rc, "w1", phase="Failed", ready=False)]
    a = decide_cluster(ClusterObserved(rc, pods), NOW)
    assert [d.name for d in a.deletes] == ["w1"] and len(created(a, "Pod")) == 1
    rc = cluster(replicas=1, suspend=True)
    pods = [head_of(rc), worker_of(rc, "w1")]
    a = decide_cluster(ClusterObserved(rc, pods), NOW)
    assert sorted(d.name for d in a.deletes) == ["rc-head-abcde", "w1"] and not created(a, "Pod")
    st = decide_cluster(ClusterObserved(rc, []), NOW).status
    assert st["state"] == "suspended" and st["desiredWorkerReplicas"] == 0


def test_the_schedulers_reason_is_reported_once() -> None:
    rc = cluster(replicas=1)
    w = worker_of(rc, "w1", phase="Pending", ready=False)
    w.spec.node_name = None
    w.status.conditions[0].type = "PodScheduled"
    w.status.conditions[0].message = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    a = decide_cluster(ClusterObserved(rc, [head_of(rc), w]), NOW)
    assert [e.reason for e in a.events] == ["Unschedulable"]
    assert "Insufficient nvidia.com/gpu" in a.status["reason"]
    again = decide_cluster(ClusterObserved(rc, [head_of(rc), w], last_wait=a.memo["last_wait"]), NOW)
    assert not again.events


# -- autoscaling ------------------------------------------------------------------------------


def autoscaled(replicas: int = 0, **opts: Any) -> api.RayCluster:
    body = cluster_dict(replicas, lo=0, hi=4)
    body["spec"].update(enableInTreeAutoscaling=True, autoscalerOptions={"idleTimeoutSeconds": 5, **opts})
    rc = api.RayCluster.from_dict(body)
    apply_defaults(rc)
    return rc


def node(name: str, gpus: int = 2, *, cordoned: bool = False, taints: list[dict[str, Any]] | None = None) -> Any:
    from gpufleet.api.k8s import Node

    return Node.from_dict({"metadata": {"name": name}, "spec": {"unschedulable": cordoned, "taints": taints or []},
                           "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110",
                                                      "nvidia.com/gpu": str(gpus)}}})


def test_the_head_runs_rays_autoscaler_as_its_sidecar_with_an_account_that_may_scale() -> None:
    rc = autoscaled()
    a = decide_cluster(ClusterObserved(rc, []), NOW)
    kinds = [c.body["kind"] for c in a.creates]
    assert kinds[:3] == ["ServiceAccount", "Role", "RoleBinding"] and kinds.index("Pod") > 2
    role = created(a, "Role")[0]
    assert {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "patch"]} in role["rules"]
    assert created(a, "RoleBinding")[0]["subjects"] == [{"kind": "ServiceAccount", "name": "rc", "namespace": "default"}]
    head = created(a, "Pod")[0]
    assert head["spec"]["serviceAccountName"] == "rc"
    ray, sidecar = head["spec"]["containers"]
    assert sidecar["name"] == "autoscaler" and sidecar["image"] == ray["image"]
    assert sidecar["args"] == ["export AUTOSCALER_METRIC_PORT=${GPUFLEET_PORT_AS_METRICS:-44217}; "
                               "ray kuberay-autoscaler --cluster-name $(RAY_CLUSTER_NAME) --cluster-namespace "
                               "$(RAY_CLUSTER_NAMESPACE) --gcs-address 127.0.0.1:${GPUFLEET_PORT_GCS_SERVER:-6379}"]
    assert sidecar["ports"] == [{"name": "as-metrics", "containerPort": 44217, "protocol": "TCP"}]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in sidecar["env"]}
    assert env["RAY_HEAD_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}} and env["KUBERAY_CRD_VER"] == "v1"
    assert {"name": "RAY_enable_autoscaler_v2", "value": "1"} in ray["env"]  # v2 unless v1 is asked for
    assert {"name": "ray-logs", "mountPath": "/tmp/ray"} in sidecar["volumeMounts"]
    v1 = created(decide_cluster(ClusterObserved(autoscaled(version="v1"), []), NOW), "Pod")[0]
    assert not any(e["name"] == "RAY_enable_autoscaler_v2" for c in v1["spec"]["containers"] for e in c["env"])
    # Without enableInTreeAutoscaling: no sidecar, no account.
    plain = decide_cluster(ClusterObserved(cluster(), []), NOW)
    assert not created(plain, "Role") and len(created(plain, "Pod")[0]["spec"]["containers"]) == 1


def test_autoscaled_workers_are_created_only_as_far_as_the_scheduler_can_place_them() -> None:
    from gpufleet.scheduler import placement

    rc = autoscaled(replicas=4)
    nodes = [node("node-a"), node("node-b", cordoned=True)]
    head = head_of(rc)

    def room(body: dict[str, Any], want: int, unbound: list[Any]) -> tuple[int, str | None]:
        return placement.room(body, want, nodes, [head], unbound)

    a = decide_cluster(ClusterObserved(rc, [head], room=room), NOW)
    assert len([c for c in created(a, "Pod") if c["metadata"]["labels"]["ray.io/node-type"] == "worker"]) == 2
    held = ("2 of 4 workers of group gpu cannot be placed: 0/2 nodes are available: "
            "1 Insufficient nvidia.com/gpu, 1 node(s) were unschedulable.")
    cond = {c["type"]: c for c in a.status["conditions"]}["ReplicaFailure"]
    assert (cond["status"], cond["reason"], cond["message"]) == ("True", "Unschedulable", held)
    assert a.status["reason"] == held and a.status["desiredWorkerReplicas"] == 4
    assert [e.message for e in a.events] == [f"Workers not created: {held}"] and a.requeue_after
    # The two made are still waiting to be bound: they take the room, no more are made.
    mine = [worker_of(rc, f"w{i}", phase="Pending", ready=False) for i in range(2)]
    for w in mine:
        w.spec.node_name = None
    again = decide_cluster(ClusterObserved(rc, [head, *mine], room=room, last_held=a.memo["last_held"]), NOW)
    assert not created(again, "Pod") and not again.events
    # Once everything fits, the condition clears.
    nodes[1] = node("node-b")
    placed = decide_cluster(ClusterObserved(rc, [head, *mine], room=room, last_held=held), NOW)
    assert len(created(placed, "Pod")) == 2
    rc.status = api.RayClusterStatus.from_dict(a.status)
    cleared = decide_cluster(ClusterObserved(rc, [head, *mine], room=room), NOW)
    assert {c["type"]: c["status"] for c in cleared.status["conditions"]}["ReplicaFailure"] == "False"


def test_when_the_autoscaler_lets_idle_workers_go_the_ones_never_placed_go_too() -> None:
    # 4 asked, 2 placed; both idle: the autoscaler asks for max(4, 2) - 2 = 2 and names them.
    body = cluster_dict(2, lo=0, hi=4, to_delete=["w0", "w1"])
    body["spec"]["enableInTreeAutoscaling"] = True
    rc = api.RayCluster.from_dict(body)
    apply_defaults(rc)
    idle = [worker_of(rc, f"w{i}") for i in range(2)]
    a = decide_cluster(ClusterObserved(rc, [head_of(rc), *idle], room=lambda body, want, unbound: (want, None)), NOW)
    assert sorted(d.name for d in a.deletes) == ["w0", "w1"] and not created(a, "Pod")
    group = a.patches[0].patch["spec"]["workerGroupSpecs"][0]
    assert group["replicas"] == 0 and group["scaleStrategy"]["workersToDelete"] == []
    assert a.status["desiredWorkerReplicas"] == 0
    # Without autoscaling, replicas is the user's: the group is topped up.
    plain = cluster(replicas=2, lo=0, to_delete=["w0", "w1"])
    b = decide_cluster(ClusterObserved(plain, [head_of(plain), *(worker_of(plain, f"w{i}") for i in range(2))]), NOW)
    assert len(created(b, "Pod")) == 2


def test_placement_leaves_out_cordoned_nodes_and_gpu_nodes_tainted_unhealthy() -> None:
    from gpufleet.scheduler import placement

    rc = autoscaled(replicas=4)
    body = rp.worker_pod_body(rc, rc.spec, rc.spec.worker_group_specs[0], True)
    sick = [{"key": "gpufleet.io/gpu-unhealthy", "effect": "NoSchedule"}]
    n, why = placement.room(body, 4, [node("a"), node("b", taints=sick), node("c", cordoned=True)], [])
    assert n == 2 and "1 node(s) had untolerated taint {gpufleet.io/gpu-unhealthy: }" in why and \
        "1 node(s) were unschedulable" in why
    assert placement.room(body, 4, [node("a", 4)], []) == (4, None)


# -- RayJob ---------------------------------------------------------------------------------


def rayjob(status: dict[str, Any] | None = None, **spec: Any) -> api.RayJob:
    body: dict[str, Any] = {"apiVersion": "ray.io/v1", "kind": "RayJob",
                            "metadata": {"name": "train", "namespace": "default", "uid": "0123456789abcdef"},
                            "spec": {"entrypoint": "python train.py",
                                     "rayClusterSpec": cluster_dict()["spec"], **spec}}
    if status is not None:
        body["status"] = status
    job = api.RayJob.from_dict(body)
    apply_defaults(job)
    return job


def test_a_rayjob_makes_its_cluster_then_submits_once_it_is_ready() -> None:
    a = decide_job(JobObserved(rayjob(), None, None, None, None), NOW)
    assert a.status["jobDeploymentStatus"] == "Initializing"
    assert a.status["jobId"] == "train-01234" and a.status["rayClusterName"] == "train-bcdef"
    (rc,) = created(a, "RayCluster")
    assert rc["metadata"]["name"] == "train-bcdef" and rc["metadata"]["ownerReferences"][0]["kind"] == "RayJob"
    job = rayjob(a.status)
    ready = {"metadata": {"name": "train-bcdef", "uid": "c"}, "status": {"state": "ready"}}
    a = decide_job(JobObserved(job, ready, None, "10.0.0.5:31001", None), NOW)
    assert a.status["jobDeploymentStatus"] == "Running" and a.status["dashboardURL"] == "10.0.0.5:31001"
    (sub,) = created(a, "Job")
    c = sub["spec"]["template"]["spec"]["containers"][0]
    assert c["command"][-1] == ("ray job submit --address http://${RAY_DASHBOARD_ADDRESS} "
                                "--submission-id ${RAY_JOB_SUBMISSION_ID} -- python train.py")
    assert {"name": "RAY_DASHBOARD_ADDRESS", "value": "10.0.0.5:31001"} in c["env"]


def test_a_rayjob_ends_as_ray_says_and_its_cluster_goes_after_the_ttl() -> None:
    running = {"jobId": "train-01234", "rayClusterName": "train-bcdef", "jobDeploymentStatus": "Running",
               "startTime": rfc3339(T0 - 5)}
    ready = {"metadata": {"name": "train-bcdef", "uid": "c"}, "status": {"state": "ready"}}
    job = rayjob(running, shutdownAfterJobFinishes=True, ttlSecondsAfterFinished=10)
    a = decide_job(JobObserved(job, ready, {"metadata": {"name": "train"}}, "d:1", {"status": "RUNNING"}), NOW)
    assert a.status["jobStatus"] == "RUNNING" and a.requeue_after is not None
    a = decide_job(JobObserved(job, ready, None, "d:1", {"status": "SUCCEEDED"}), NOW)
    assert a.status["jobDeploymentStatus"] == "Complete" and a.status["endTime"] == NOW.text
    done = rayjob(a.status, shutdownAfterJobFinishes=True, ttlSecondsAfterFinished=10)
    assert not decide_job(JobObserved(done, ready, None, "d:1", None), NOW).deletes
    later = Instant(T0 + 11, rfc3339(T0 + 11), 21.0)
    assert [d.name for d in decide_job(JobObserved(done, ready, None, "d:1", None), later).deletes] == ["train-bcdef"]
    a = decide_job(JobObserved(job, ready, None, "d:1", {"status": "FAILED", "message": "exit 1"}), NOW)
    assert (a.status["jobDeploymentStatus"], a.status["reason"]) == ("Failed", "AppFailed")


def test_a_rayjob_ends_only_once_its_submitter_has_finished_too() -> None:
    running = {"jobId": "train-01234", "rayClusterName": "train-bcdef", "jobDeploymentStatus": "Running",
               "startTime": rfc3339(T0 - 5)}
    ready = {"metadata": {"name": "train-bcdef", "uid": "c"}, "status": {"state": "ready"}}
    job = rayjob(running)
    tailing = {"metadata": {"name": "train"}, "status": {"active": 1}}
    a = decide_job(JobObserved(job, ready, tailing, "d:1", {"status": "SUCCEEDED"}), NOW)
    assert a.status["jobStatus"] == "SUCCEEDED" and a.status["jobDeploymentStatus"] == "Running"
    assert a.requeue_after is not None
    done = {"metadata": {"name": "train"}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    a = decide_job(JobObserved(job, ready, done, "d:1", {"status": "SUCCEEDED"}), NOW)
    assert a.status["jobDeploymentStatus"] == "Complete"
    a = decide_job(JobObserved(job, ready, tailing, "d:1", {"status": "FAILED"}), NOW)
    assert a.status["jobDeploymentStatus"] == "Running"
    failed = {"metadata": {"name": "train"}, "status": {"conditions": [{"type": "Failed", "status": "True"}]}}
    a = decide_job(JobObserved(job, ready, failed, "d:1", {"status": "FAILED"}), NOW)
    assert (a.status["jobDeploymentStatus"], a.status["reason"]) == ("Failed", "AppFailed")


def test_a_rayjob_past_its_deadline_fails() -> None:
    job = rayjob({"jobDeploymentStatus": "Initializing", "startTime": rfc3339(T0 - 60)}, activeDeadlineSeconds=30)
    a = decide_job(JobObserved(job, None, None, None, None), NOW)
    assert (a.status["jobDeploymentStatus"], a.status["reason"]) == ("Failed", "DeadlineExceeded")


def test_runtime_env_yaml_goes_to_ray_job_submit_as_json() -> None:
    job = rayjob(runtimeEnvYAML="env_vars:\n  A: b\n")
    assert "--runtime-env-json '{\"env_vars\": {\"A\": \"b\"}}'" in submit_command(job)[-1]


def test_validation_names_the_field() -> None:
    d = cluster_dict(lo=3, hi=2)
    d["spec"]["workerGroupSpecs"].append(copy.deepcopy(d["spec"]["workerGroupSpecs"][0]))
    errs = [str(e) for e in validate(api.RayCluster.from_dict(d))]
    assert any("spec.workerGroupSpecs[0].maxReplicas" in e and "minReplicas (3)" in e for e in errs), errs
    assert any("spec.workerGroupSpecs[1].groupName" in e for e in errs), errs
    errs = [str(e) for e in validate(api.RayJob.from_dict({"metadata": {"name": "j"}, "spec": {}}))]
    assert any("spec.rayClusterSpec" in e for e in errs) and any("spec.entrypoint" in e for e in errs), errs
    errs = [str(e) for e in validate(rayjob(submissionMode="HTTPMode"))]
    assert any("spec.submissionMode" in e and "K8sJobMode" in e for e in errs), errs
    errs = [str(e) for e in validate(autoscaled(version="v3"))]
    assert any("spec.autoscalerOptions.version" in e and '"v1", "v2"' in e for e in errs), errs


def test_a_suspended_rayjob_waits_gives_back_its_cluster_and_starts_over_when_resumed() -> None:
    # Suspended before it started: nothing is made.
    a = decide_job(JobObserved(rayjob(suspend=True, shutdownAfterJobFinishes=True), None, None, None, None), NOW)
    assert a.status["jobDeploymentStatus"] == "Suspended" and not a.creates
    # Suspended while running: Suspending while the cluster and submitter are deleted.
    running = {"jobId": "train-01234", "rayClusterName": "train-bcdef", "jobDeploymentStatus": "Running",
               "startTime": rfc3339(T0 - 5), "dashboardURL": "d:1"}
    ready = {"metadata": {"name": "train-bcdef", "uid": "c"}, "status": {"state": "ready"}}
    submitter = {"metadata": {"name": "train", "uid": "s"}}
    job = rayjob(running, suspend=True, shutdownAfterJobFinishes=True)
    a = decide_job(JobObserved(job, ready, submitter, "d:1", None), NOW)
    assert a.status["jobDeploymentStatus"] == "Suspending"
    assert sorted((d.kind.__name__, d.name) for d in a.deletes) == [("Job", "train"), ("RayCluster", "train-bcdef")]
    job = rayjob(a.status, suspend=True, shutdownAfterJobFinishes=True)
    a = decide_job(JobObserved(job, None, None, None, None), NOW)
    assert a.status["jobDeploymentStatus"] == "Suspended" and not a.deletes
    # Resumed: it starts over, a new cluster, the clock of activeDeadlineSeconds from now.
    job = rayjob(a.status, suspend=False, shutdownAfterJobFinishes=True)
    a = decide_job(JobObserved(job, None, None, None, None), NOW)
    assert a.status["jobDeploymentStatus"] == "Initializing" and a.status["startTime"] == NOW.text
    assert [rc["metadata"]["name"] for rc in created(a, "RayCluster")] == ["train-bcdef"]
