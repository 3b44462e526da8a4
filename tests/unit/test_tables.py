"""Server-side Tables: the columns and cells `kubectl get` prints, checked against the rules of
kube-apiserver's printers (pkg/printers/internalversion/printers.go)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpufleet.api.podresources import pod_gpu_request as pod_gpus
from gpufleet.api.registry import REGISTRY, ResourceType
from gpufleet.apiserver import tables
from gpufleet.apiserver.tables import (
    Column,
    age_cell,
    format_endpoints,
    format_label_selector,
    human_duration,
    pod_status,
    register_printer,
    to_table,
    watch_event_table,
)
from gpufleet.utils.clock import rfc3339

NOW = 1_700_000_000.0
MIN, HOUR, DAY = 60, 3600, 86400


def ts(ago: float) -> str:
    return rfc3339(NOW - ago)


def rt_of(kind: str) -> ResourceType:
    rt = next((t for t in REGISTRY.all() if t.kind == kind), None)
    assert rt is not None, kind
    return rt


def meta(
    name: str, *, namespace: str | None = "default", age: float = 5 * MIN, **extra: Any
) -> dict[str, Any]:
    m: dict[str, Any] = {
        "name": name,
        "uid": f"uid-{name}",
        "resourceVersion": "42",
        "creationTimestamp": ts(age),
        "labels": {"app": "web"},
    }
    if namespace:
        m["namespace"] = namespace
    m.update(extra)
    return m


def row(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """The one row of `obj`, as a dict column name -> cell."""
    table = to_table(rt_of(kind), [obj], resource_version="42", now=NOW)
    names = [c["name"] for c in table["columnDefinitions"]]
    cells = table["rows"][0]["cells"]
    assert len(cells) == len(names), (kind, names, cells)
    return dict(zip(names, cells, strict=True))


# --- factories ----------------------------------------------------------------------------------


def container(name: str = "main", image: str = "nginx:1.27", gpus: int | None = None, **extra: Any) -> dict:
    c: dict[str, Any] = {"name": name, "image": image, **extra}
    if gpus is not None:
        c["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return c


def running(name: str = "main", *, ready: bool = True, restarts: int = 0, **extra: Any) -> dict:
    return {
        "name": name,
        "ready": ready,
        "restartCount": restarts,
        "state": {"running": {"startedAt": ts(4 * MIN)}},
        **extra,
    }


def waiting(reason: str, name: str = "main", restarts: int = 0, **extra: Any) -> dict:
    return {
        "name": name,
        "ready": False,
        "restartCount": restarts,
        "state": {"waiting": {"reason": reason}},
        **extra,
    }


def terminated(name: str = "main", *, exit_code: int = 0, reason: str | None = None, signal: int = 0) -> dict:
    t: dict[str, Any] = {"exitCode": exit_code, "finishedAt": ts(MIN)}
    if reason:
        t["reason"] = reason
    if signal:
        t["signal"] = signal
    return {"name": name, "ready": False, "restartCount": 0, "state": {"terminated": t}}


def make_pod(
    name: str = "web-0",
    *,
    phase: str = "Running",
    containers: list[dict] | None = None,
    statuses: list[dict] | None = None,
    init: list[dict] | None = None,
    init_statuses: list[dict] | None = None,
    conditions: list[dict] | None = None,
    **status_extra: Any,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers or [container()]}
    if init:
        spec["initContainers"] = init
    status: dict[str, Any] = {"phase": phase, **status_extra}
    if statuses is not None:
        status["containerStatuses"] = statuses
    if init_statuses is not None:
        status["initContainerStatuses"] = init_statuses
    if conditions is not None:
        status["conditions"] = conditions
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta(name), "spec": spec, "status": status}


READY = [{"type": "Ready", "status": "True"}]


# --- HumanDuration --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (-1.5, "0s"),
        (0, "0s"),
        (5, "5s"),
        (59.9, "59s"),
        (119, "119s"),
        (120, "2m"),
        (200, "3m20s"),
        (9 * MIN + 59, "9m59s"),
        (10 * MIN + 30, "10m"),
        (179 * MIN, "179m"),
        (3 * HOUR, "3h"),
        (3 * HOUR + 20 * MIN, "3h20m"),
        (7 * HOUR + 59 * MIN, "7h59m"),
        (8 * HOUR + 30 * MIN, "8h"),
        (47 * HOUR, "47h"),
        (48 * HOUR, "2d"),
        (2 * DAY + 3 * HOUR, "2d3h"),
        (7 * DAY + 23 * HOUR, "7d23h"),
        (8 * DAY + 5 * HOUR, "8d"),
        (45 * DAY, "45d"),
        (729 * DAY, "729d"),
        (730 * DAY, "2y"),
        (3 * 365 * DAY + 12 * DAY, "3y12d"),
        (8 * 365 * DAY + 100 * DAY, "8y"),
        (12 * 365 * DAY, "12y"),
    ],
)
def test_human_duration_matches_kubernetes(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text


def test_age_is_unknown_without_creation_timestamp() -> None:
    assert age_cell({"metadata": {"name": "x"}}, NOW) == "<unknown>"
    assert age_cell({"metadata": {"name": "x", "creationTimestamp": "not a time"}}, NOW) == "<unknown>"
    assert age_cell({"metadata": meta("x", age=2 * DAY + 3 * HOUR)}, NOW) == "2d3h"


def test_age_reads_fractional_seconds() -> None:
    obj = {"metadata": {"name": "x", "creationTimestamp": rfc3339(NOW - 200, micro=True)}}
    assert age_cell(obj, NOW) == "3m20s"


# --- Pod STATUS -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "status"),
    [
        (make_pod(statuses=[running()], conditions=READY), "Running"),
        (make_pod(phase="Pending", statuses=None), "Pending"),
        (make_pod(phase="Pending", statuses=[waiting("ContainerCreating")]), "ContainerCreating"),
        (make_pod(statuses=[waiting("CrashLoopBackOff", restarts=5)]), "CrashLoopBackOff"),
        (make_pod(phase="Pending", statuses=[waiting("ImagePullBackOff")]), "ImagePullBackOff"),
        (make_pod(phase="Succeeded", statuses=[terminated(reason="Completed")]), "Completed"),
        (make_pod(phase="Failed", statuses=[terminated(exit_code=1, reason="Error")]), "Error"),
        (make_pod(phase="Failed", statuses=[terminated(exit_code=137)]), "ExitCode:137"),
        (make_pod(phase="Failed", statuses=[terminated(exit_code=137, signal=9)]), "Signal:9"),
        (make_pod(phase="Failed", statuses=[terminated(exit_code=137, reason="OOMKilled")]), "OOMKilled"),
        (make_pod(phase="Failed", reason="Evicted", statuses=[]), "Evicted"),
        (
            make_pod(
                phase="Pending",
                statuses=None,
                conditions=[{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}],
            ),
            "SchedulingGated",
        ),
        (make_pod(phase="Unknown", statuses=[]), "Unknown"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_pod_status(pod: dict, status: str) -> None:
    assert pod_status(pod) == status
    assert row("Pod", pod)["Status"] == status


def test_pod_status_terminating_unless_terminal() -> None:
    pod = make_pod(statuses=[running()], conditions=READY)
    pod["metadata"]["deletionTimestamp"] = ts(10)
    assert pod_status(pod) == "Terminating"

    done = make_pod(phase="Succeeded", statuses=[terminated(reason="Completed")])
    done["metadata"]["deletionTimestamp"] = ts(10)
    assert pod_status(done) == "Completed"

    lost = make_pod(reason="NodeLost", statuses=[running()])
    lost["metadata"]["deletionTimestamp"] = ts(10)
    assert pod_status(lost) == "Unknown"


def test_pod_status_first_container_has_the_last_word() -> None:
    pod = make_pod(
        containers=[container("a"), container("b")],
        statuses=[waiting("CrashLoopBackOff", name="a"), waiting("ContainerCreating", name="b")],
    )
    assert pod_status(pod) == "CrashLoopBackOff"
    assert row("Pod", pod)["Ready"] == "0/2"


def test_completed_container_next_to_a_running_one() -> None:
    statuses = [terminated("job", reason="Completed"), running("server")]
    pod = make_pod(containers=[container("job"), container("server")], statuses=statuses, conditions=READY)
    assert pod_status(pod) == "Running"
    not_ready = make_pod(containers=[container("job"), container("server")], statuses=statuses, conditions=[])
    assert pod_status(not_ready) == "NotReady"


def test_init_containers() -> None:
    init = [container("fetch"), container("migrate")]
    in_first = make_pod(
        phase="Pending",
        init=init,
        init_statuses=[running("fetch", ready=False), waiting("PodInitializing", name="migrate")],
        statuses=[waiting("PodInitializing")],
    )
    assert pod_status(in_first) == "Init:0/2"

    in_second = make_pod(
        phase="Pending",
        init=init,
        init_statuses=[terminated("fetch", reason="Completed"), running("migrate", ready=False)],
        statuses=[waiting("PodInitializing")],
    )
    assert pod_status(in_second) == "Init:1/2"

    crashing = make_pod(
        phase="Pending",
        init=init,
        init_statuses=[waiting("CrashLoopBackOff", name="fetch", restarts=4)],
        statuses=[waiting("PodInitializing")],
    )
    assert pod_status(crashing) == "Init:CrashLoopBackOff"
    assert row("Pod", crashing)["Restarts"] == "4"

    failed = make_pod(
        phase="Failed",
        init=init,
        init_statuses=[terminated("fetch", exit_code=2, reason="Error")],
        statuses=[],
    )
    assert pod_status(failed) == "Init:Error"
    no_reason = make_pod(
        phase="Failed", init=init, init_statuses=[terminated("fetch", exit_code=3)], statuses=[]
    )
    assert pod_status(no_reason) == "Init:ExitCode:3"
    signalled = make_pod(
        phase="Failed", init=init, init_statuses=[terminated("fetch", exit_code=137, signal=9)], statuses=[]
    )
    assert pod_status(signalled) == "Init:Signal:9"


def test_sidecar_init_container_counts_as_a_container() -> None:
    sidecar = container("proxy", restartPolicy="Always")
    pod = make_pod(
        init=[sidecar],
        init_statuses=[running("proxy", started=True, restarts=1)],
        statuses=[running()],
        conditions=[*READY, {"type": "Initialized", "status": "True"}],
    )
    r = row("Pod", pod)
    assert (r["Ready"], r["Status"], r["Restarts"]) == ("2/2", "Running", "1")


def test_restarts_say_when_the_last_one_was() -> None:
    last = {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": ts(125)}}
    pod = make_pod(statuses=[running(restarts=3, lastState=last)], conditions=READY)
    assert row("Pod", pod)["Restarts"] == "3 (2m5s ago)"
    never = make_pod(statuses=[running()], conditions=READY)
    assert row("Pod", never)["Restarts"] == "0"


def test_pod_wide_columns() -> None:
    pod = make_pod(
        containers=[container("trainer", gpus=4), container("logger")],
        statuses=[running("trainer"), running("logger", ready=False)],
        conditions=[*READY, {"type": "example.com/lb", "status": "True"}],
        podIPs=[{"ip": "10.1.0.5"}],
        nominatedNodeName="gpu-7",
    )
    pod["spec"]["nodeName"] = "gpu-3"
    pod["spec"]["readinessGates"] = [
        {"conditionType": "example.com/lb"},
        {"conditionType": "example.com/dns"},
    ]
    r = row("Pod", pod)
    assert r == {
        "Name": "web-0",
        "Ready": "1/2",
        "Status": "Running",
        "Restarts": "0",
        "Age": "5m",
        "IP": "10.1.0.5",
        "Node": "gpu-3",
        "Nominated Node": "gpu-7",
        "Readiness Gates": "1/2",
        "GPUs": 4,
    }
    bare = row("Pod", make_pod(phase="Pending", statuses=None))
    assert (bare["IP"], bare["Node"], bare["Nominated Node"], bare["Readiness Gates"], bare["GPUs"]) == (
        "<none>",
        "<none>",
        "<none>",
        "<none>",
        0,
    )
    assert row("Pod", make_pod(podIP="10.1.0.9"))["IP"] == "10.1.0.9"


def test_pod_gpus_add_up_containers_and_take_the_largest_init() -> None:
    requested = container("a")
    requested["resources"] = {"requests": {"nvidia.com/gpu": 2}, "limits": {"nvidia.com/gpu": 2}}
    pod = make_pod(containers=[requested, container("b", gpus=1)])
    assert pod_gpus(pod) == 3
    pod["spec"]["initContainers"] = [container("warmup", gpus=8)]
    assert pod_gpus(pod) == 8
    assert pod_gpus(make_pod()) == 0


def test_pod_gpus_count_only_the_sidecars_an_init_container_runs_beside() -> None:
    # warmup (2) runs before the sidecar (1) starts: Kubernetes' peak is 2; the table added
    # every sidecar to the largest init container and showed 3.
    pod = make_pod(containers=[container("a")])
    pod["spec"]["initContainers"] = [container("warmup", gpus=2), container("log", gpus=1, restartPolicy="Always")]
    assert pod_gpus(pod) == 2
    assert row("Pod", pod)["GPUs"] == 2


def test_finished_pods_carry_a_completed_row_condition() -> None:
    table = to_table(
        rt_of("Pod"),
        [
            make_pod(phase="Succeeded", statuses=[terminated(reason="Completed")]),
            make_pod(statuses=[running()]),
        ],
        resource_version="1",
        now=NOW,
    )
    assert table["rows"][0]["conditions"][0]["reason"] == "Succeeded"
    assert "conditions" not in table["rows"][1]


# --- the Table itself ---------------------------------------------------------------------------


def test_table_shape_for_kubectl() -> None:
    pod = make_pod(statuses=[running()], conditions=READY)
    pod["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update"}]
    table = to_table(rt_of("Pod"), [pod], resource_version="104", continue_token="abc", now=NOW)
    assert table["kind"] == "Table"
    assert table["apiVersion"] == "meta.k8s.io/v1"
    assert table["metadata"] == {"resourceVersion": "104", "continue": "abc"}
    first = table["columnDefinitions"][0]
    assert first == {
        "name": "Name",
        "type": "string",
        "format": "name",
        "description": first["description"],
        "priority": 0,
    }
    for col in table["columnDefinitions"]:
        assert set(col) == {"name", "type", "format", "description", "priority"}
    assert [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
    ]
    obj = table["rows"][0]["object"]
    assert obj["kind"] == "PartialObjectMetadata"
    assert obj["apiVersion"] == "meta.k8s.io/v1"
    assert obj["metadata"]["namespace"] == "default"
    assert obj["metadata"]["labels"] == {"app": "web"}
    assert "managedFields" not in obj["metadata"]
    assert "managedFields" in pod["metadata"]  # the stored object is left alone


def test_include_object() -> None:
    pod = make_pod()
    del pod["kind"], pod["apiVersion"]  # items of a list often come without them
    full = to_table(rt_of("Pod"), [pod], resource_version="1", now=NOW, include_object="Object")
    assert full["rows"][0]["object"]["kind"] == "Pod"
    assert full["rows"][0]["object"]["apiVersion"] == "v1"
    assert full["rows"][0]["object"]["spec"] == pod["spec"]
    none = to_table(rt_of("Pod"), [pod], resource_version="1", now=NOW, include_object="None")
    assert "object" not in none["rows"][0]
    with pytest.raises(ValueError, match="includeObject"):
        to_table(rt_of("Pod"), [pod], resource_version="1", now=NOW, include_object="Everything")


def test_empty_list_still_has_columns() -> None:
    table = to_table(rt_of("Deployment"), [], resource_version="9", now=NOW)
    assert table["rows"] == []
    assert table["columnDefinitions"][0]["name"] == "Name"
    assert "continue" not in table["metadata"]


def test_watch_event_table() -> None:
    pod = make_pod(statuses=[running()], conditions=READY)
    event = watch_event_table(rt_of("Pod"), pod, now=NOW)
    assert event["kind"] == "Table"
    assert event["metadata"]["resourceVersion"] == "42"
    assert len(event["rows"]) == 1
    assert event["rows"][0]["cells"][:3] == ["web-0", "1/1", "Running"]
    assert event["columnDefinitions"]
    assert "columnDefinitions" not in watch_event_table(rt_of("Pod"), pod, now=NOW, include_columns=False)


# --- every built-in kind -------------------------------------------------------------------------


def template(*containers_: dict) -> dict:
    return {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": list(containers_)}}


def test_deployment() -> None:
    dep = {
        "metadata": meta("web"),
        "spec": {
            "replicas": 3,
            "selector": {
                "matchLabels": {"app": "web"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "cpu"]}],
            },
            "template": template(container("server", "vllm:0.6"), container("metrics", "exporter:1")),
        },
        "status": {"replicas": 3, "readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2},
    }
    assert row("Deployment", dep) == {
        "Name": "web",
        "Ready": "2/3",
        "Up-to-date": 3,
        "Available": 2,
        "Age": "5m",
        "Containers": "server,metrics",
        "Images": "vllm:0.6,exporter:1",
        "Selector": "app=web,tier in (cpu,gpu)",
    }
    fresh = {"metadata": meta("new"), "spec": {"template": template(container())}}
    assert row("Deployment", fresh)["Ready"] == "0/1"


def test_replicaset() -> None:
    rs = {
        "metadata": meta("web-6d4f"),
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": template(container()),
        },
        "status": {"replicas": 2, "readyReplicas": 1},
    }
    r = row("ReplicaSet", rs)
    assert (r["Desired"], r["Current"], r["Ready"], r["Selector"]) == (2, 2, 1, "app=web")


@pytest.mark.parametrize(
    ("conditions", "deleting", "status"),
    [
        ([{"type": "Complete", "status": "True"}], False, "Complete"),
        ([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}], False, "Failed"),
        ([{"type": "Suspended", "status": "True"}], False, "Suspended"),
        ([{"type": "Suspended", "status": "False"}], False, "Running"),
        ([{"type": "FailureTarget", "status": "True"}], False, "FailureTarget"),
        ([], True, "Terminating"),
        ([], False, "Running"),
    ],
)
def test_job_status(conditions: list, deleting: bool, status: str) -> None:
    job = {
        "metadata": meta("train"),
        "spec": {"template": template(container())},
        "status": {"conditions": conditions},
    }
    if deleting:
        job["metadata"]["deletionTimestamp"] = ts(1)
    assert row("Job", job)["Status"] == status


def test_job_completions_and_duration() -> None:
    job = {
        "metadata": meta("train", age=HOUR),
        "spec": {"completions": 4, "parallelism": 2, "template": template(container())},
        "status": {"succeeded": 4, "startTime": ts(50 * MIN), "completionTime": ts(50 * MIN - 200)},
    }
    r = row("Job", job)
    assert (r["Completions"], r["Duration"], r["Age"]) == ("4/4", "3m20s", "60m")
    running_job = {"metadata": meta("j"), "spec": {"parallelism": 3}, "status": {"startTime": ts(90)}}
    r = row("Job", running_job)
    assert (r["Completions"], r["Duration"]) == ("0/1 of 3", "90s")
    not_started = {"metadata": meta("j"), "spec": {}, "status": {}}
    r = row("Job", not_started)
    assert (r["Completions"], r["Duration"], r["Selector"]) == ("0/1", "", "<none>")


def make_node(
    name: str = "gpu-1", *, ready: str | None = "True", unschedulable: bool = False, **labels: str
) -> dict:
    status: dict[str, Any] = {
        "allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8"},
        "addresses": [
            {"type": "Hostname", "address": name},
            {"type": "InternalIP", "address": "192.168.0.11"},
        ],
        "nodeInfo": {
            "kubeletVersion": "v1.32.4",
            "osImage": "Ubuntu 22.04.4 LTS",
            "kernelVersion": "6.8.0-45-generic",
            "containerRuntimeVersion": "containerd://1.7.20",
        },
        "conditions": [{"type": "MemoryPressure", "status": "False"}],
    }
    if ready is not None:
        status["conditions"].append({"type": "Ready", "status": ready})
    return {
        "metadata": meta(
            name,
            namespace=None,
            age=45 * DAY,
            labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", **labels},
        ),
        "spec": {"unschedulable": unschedulable} if unschedulable else {},
        "status": status,
    }


def test_node() -> None:
    node = make_node(**{"node-role.kubernetes.io/worker": "", "node-role.kubernetes.io/gpu": ""})
    assert row("Node", node) == {
        "Name": "gpu-1",
        "Status": "Ready",
        "Roles": "gpu,worker",
        "Age": "45d",
        "Version": "v1.32.4",
        "GPUs": 8,
        "GPU Model": "NVIDIA-H100-80GB-HBM3",
        "Internal-IP": "192.168.0.11",
        "External-IP": "<none>",
        "OS-Image": "Ubuntu 22.04.4 LTS",
        "Kernel-Version": "6.8.0-45-generic",
        "Container-Runtime": "containerd://1.7.20",
    }
    gpus = next(
        c
        for c in to_table(rt_of("Node"), [], resource_version="1", now=NOW)["columnDefinitions"]
        if c["name"] == "GPUs"
    )
    assert gpus["priority"] == 0


@pytest.mark.parametrize(
    ("ready", "unschedulable", "status"),
    [
        ("True", False, "Ready"),
        ("False", False, "NotReady"),
        ("Unknown", False, "NotReady"),
        (None, False, "Unknown"),
        ("True", True, "Ready,SchedulingDisabled"),
        (None, True, "Unknown,SchedulingDisabled"),
    ],
)
def test_node_status(ready: str | None, unschedulable: bool, status: str) -> None:
    assert row("Node", make_node(ready=ready, unschedulable=unschedulable))["Status"] == status


def test_node_roles_and_bare_node() -> None:
    node = make_node(**{"kubernetes.io/role": "master"})
    assert row("Node", node)["Roles"] == "master"
    bare = {"metadata": {"name": "cpu-1"}, "status": {}}
    r = row("Node", bare)
    assert (r["Roles"], r["GPUs"], r["GPU Model"], r["Age"], r["OS-Image"]) == (
        "<none>",
        0,
        "<none>",
        "<unknown>",
        "<unknown>",
    )


def test_namespace() -> None:
    ns = {"metadata": meta("team-a", namespace=None), "status": {"phase": "Active"}}
    assert row("Namespace", ns) == {"Name": "team-a", "Status": "Active", "Age": "5m"}


@pytest.mark.parametrize(
    ("spec", "status", "external", "ports"),
    [
        (
            {"type": "ClusterIP", "clusterIP": "10.96.0.10", "ports": [{"port": 80, "protocol": "TCP"}]},
            {},
            "<none>",
            "80/TCP",
        ),
        (
            {
                "type": "NodePort",
                "clusterIPs": ["10.96.0.11"],
                "ports": [{"port": 80}, {"port": 443, "nodePort": 30001}],
            },
            {},
            "<none>",
            "80/TCP,443:30001/TCP",
        ),
        (
            {"type": "LoadBalancer", "clusterIP": "10.96.0.12", "ports": [{"port": 8000, "protocol": "UDP"}]},
            {},
            "<pending>",
            "8000/UDP",
        ),
        (
            {"type": "LoadBalancer", "clusterIP": "10.96.0.12", "ports": []},
            {"loadBalancer": {"ingress": [{"ip": "203.0.113.9"}, {"hostname": "lb.example.com"}]}},
            "203.0.113.9,lb.example.com",
            "<none>",
        ),
        (
            {"type": "ClusterIP", "clusterIP": "10.96.0.13", "externalIPs": ["198.51.100.1"]},
            {},
            "198.51.100.1",
            "<none>",
        ),
        ({"type": "ExternalName", "externalName": "db.example.com"}, {}, "db.example.com", "<none>"),
    ],
)
def test_service(spec: dict, status: dict, external: str, ports: str) -> None:
    svc = {
        "metadata": meta("web"),
        "spec": {"selector": {"app": "web", "tier": "fe"}, **spec},
        "status": status,
    }
    r = row("Service", svc)
    assert (r["Type"], r["External-IP"], r["Port(s)"]) == (spec["type"], external, ports)
    assert r["Selector"] == "app=web,tier=fe"
    expected_ip = (spec.get("clusterIPs") or [spec.get("clusterIP") or "<none>"])[0]
    assert r["Cluster-IP"] == expected_ip


def test_service_without_selector() -> None:
    r = row("Service", {"metadata": meta("ext"), "spec": {"clusterIP": "None"}})
    assert (r["Type"], r["Cluster-IP"], r["Selector"]) == ("ClusterIP", "None", "<none>")


def test_endpoints() -> None:
    subsets = [
        {
            "addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}],
            "ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}],
        }
    ]
    assert format_endpoints(subsets) == "10.0.0.1:80,10.0.0.2:80,10.0.0.1:443 + 1 more..."
    assert (
        format_endpoints([{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 8000}]}]) == "10.0.0.1:8000"
    )
    assert format_endpoints([{"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}]}]) == "10.0.0.1,10.0.0.2"
    assert format_endpoints([{"addresses": [{"ip": "fd00::1"}], "ports": [{"port": 80}]}]) == "[fd00::1]:80"
    assert format_endpoints([]) == "<none>"
    ep = {"metadata": meta("web"), "subsets": subsets}
    assert row("Endpoints", ep)["Endpoints"].endswith(" + 1 more...")
    assert row("Endpoints", {"metadata": meta("idle")})["Endpoints"] == "<none>"


def test_event() -> None:
    ev = {
        "metadata": meta("web-0.17a2b3c4d5e6f7a8", age=10 * MIN),
        "involvedObject": {
            "kind": "Pod",
            "name": "web-0",
            "namespace": "default",
            "fieldPath": "spec.containers{main}",
        },
        "reason": "BackOff",
        "type": "Warning",
        "message": "Back-off restarting failed container main\n",
        "source": {"component": "kubelet", "host": "gpu-1"},
        "firstTimestamp": ts(10 * MIN),
        "lastTimestamp": ts(20),
        "count": 7,
    }
    assert row("Event", ev) == {
        "Last Seen": "20s",
        "Type": "Warning",
        "Reason": "BackOff",
        "Object": "pod/web-0",
        "Subobject": "spec.containers{main}",
        "Source": "kubelet, gpu-1",
        "Message": "Back-off restarting failed container main",
        "First Seen": "10m",
        "Count": 7,
        "Name": "web-0.17a2b3c4d5e6f7a8",
    }
    cols = to_table(rt_of("Event"), [], resource_version="1", now=NOW)["columnDefinitions"]
    assert [c["name"] for c in cols if c["priority"] == 0] == [
        "Last Seen",
        "Type",
        "Reason",
        "Object",
        "Message",
    ]


def test_event_written_by_the_events_api() -> None:
    ev = {
        "metadata": meta("x", age=MIN),
        "involvedObject": {"kind": "Node", "name": "gpu-1"},
        "reason": "NodeNotReady",
        "type": "Normal",
        "message": "lease expired",
        "eventTime": rfc3339(NOW - 300, micro=True),
        "reportingComponent": "node-lifecycle-controller",
    }
    r = row("Event", ev)
    assert (r["Last Seen"], r["First Seen"], r["Count"], r["Source"], r["Object"]) == (
        "5m",
        "5m",
        1,
        "node-lifecycle-controller",
        "node/gpu-1",
    )
    ev["series"] = {"count": 4, "lastObservedTime": rfc3339(NOW - 30, micro=True)}
    r = row("Event", ev)
    assert (r["Last Seen"], r["Count"]) == ("30s", 4)


def test_resource_quota() -> None:
    quota = {
        "metadata": meta("team-a"),
        "spec": {"hard": {"pods": "10"}},
        "status": {
            "hard": {
                "pods": "10",
                "requests.cpu": "4",
                "requests.nvidia.com/gpu": "8",
                "limits.memory": "64Gi",
            },
            "used": {"pods": "1", "requests.cpu": "500m", "limits.memory": "2Gi"},
        },
    }
    assert row("ResourceQuota", quota) == {
        "Name": "team-a",
        "Request": "pods: 1/10, requests.cpu: 500m/4, requests.nvidia.com/gpu: 0/8",
        "Limit": "limits.memory: 2Gi/64Gi",
        "Age": "5m",
    }
    fresh = {"metadata": meta("new"), "spec": {"hard": {"pods": "5"}}}
    assert row("ResourceQuota", fresh)["Request"] == "pods: 0/5"


def test_limit_range_shows_created_at() -> None:
    lr = {"metadata": meta("defaults", age=DAY), "spec": {"limits": [{"type": "Container"}]}}
    cols = to_table(rt_of("LimitRange"), [], resource_version="1", now=NOW)["columnDefinitions"]
    assert [(c["name"], c["type"]) for c in cols] == [("Name", "string"), ("Created At", "date")]
    assert row("LimitRange", lr) == {"Name": "defaults", "Created At": ts(DAY)}


def test_priority_class() -> None:
    pc = {
        "metadata": meta("high", namespace=None),
        "value": 100000,
        "globalDefault": False,
        "preemptionPolicy": "Never",
    }
    assert row("PriorityClass", pc) == {
        "Name": "high",
        "Value": 100000,
        "Global-Default": False,
        "Age": "5m",
        "PreemptionPolicy": "Never",
    }


def test_lease() -> None:
    lease = {"metadata": meta("gpu-1", namespace="kube-node-lease"), "spec": {"holderIdentity": "gpu-1"}}
    assert row("Lease", lease) == {"Name": "gpu-1", "Holder": "gpu-1", "Age": "5m"}
    assert row("Lease", {"metadata": meta("free"), "spec": {}})["Holder"] == ""


def hpa(metrics: list[dict], current: list[dict] | None = None, **spec: Any) -> dict:
    return {
        "metadata": meta("web"),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "minReplicas": 1,
            "maxReplicas": 10,
            "metrics": metrics,
            **spec,
        },
        "status": {"currentReplicas": 3, "currentMetrics": current or []},
    }


CPU_80 = {
    "type": "Resource",
    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
}


def test_hpa() -> None:
    before = hpa([CPU_80])
    assert row("HorizontalPodAutoscaler", before) == {
        "Name": "web",
        "Reference": "Deployment/web",
        "Targets": "cpu: <unknown>/80%",
        "MinPods": "1",
        "MaxPods": 10,
        "Replicas": 3,
        "Age": "5m",
    }
    cur = [
        {
            "type": "Resource",
            "resource": {"name": "cpu", "current": {"averageUtilization": 45, "averageValue": "450m"}},
        }
    ]
    assert row("HorizontalPodAutoscaler", hpa([CPU_80], cur))["Targets"] == "cpu: 45%/80%"


def test_hpa_targets_of_every_metric_type() -> None:
    pods = {
        "type": "Pods",
        "pods": {
            "metric": {"name": "requests_per_second"},
            "target": {"type": "AverageValue", "averageValue": "100"},
        },
    }
    gpu = {
        "type": "External",
        "external": {
            "metric": {"name": "gpu_util"},
            "target": {"type": "AverageValue", "averageValue": "70"},
        },
    }
    mem = {
        "type": "Resource",
        "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "1Gi"}},
    }
    current = [{"type": "Pods", "pods": {"current": {"averageValue": "42"}}}]
    r = row("HorizontalPodAutoscaler", hpa([pods, gpu], current))
    assert r["Targets"] == "42/100, <unknown>/70 (avg)"
    r = row("HorizontalPodAutoscaler", hpa([pods, gpu, mem, CPU_80], current))
    assert r["Targets"] == "42/100, <unknown>/70 (avg) + 2 more..."
    no_metrics = hpa([])
    del no_metrics["spec"]["minReplicas"]
    r = row("HorizontalPodAutoscaler", no_metrics)
    assert (r["Targets"], r["MinPods"]) == ("<none>", "<unset>")


def test_config_map_secret_service_account() -> None:
    cm = {"metadata": meta("cfg"), "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}}
    assert row("ConfigMap", cm) == {"Name": "cfg", "Data": 3, "Age": "5m"}
    secret = {
        "metadata": meta("token"),
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": "e30="},
    }
    assert row("Secret", secret) == {
        "Name": "token",
        "Type": "kubernetes.io/dockerconfigjson",
        "Data": 1,
        "Age": "5m",
    }
    assert row("Secret", {"metadata": meta("empty")})["Type"] == "Opaque"
    sa = {"metadata": meta("default"), "secrets": [{"name": "default-token"}]}
    assert row("ServiceAccount", sa) == {"Name": "default", "Secrets": 1, "Age": "5m"}


def test_pod_disruption_budget() -> None:
    pdb = {"metadata": meta("web"), "spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 1}}
    assert row("PodDisruptionBudget", pdb) == {
        "Name": "web",
        "Min Available": "50%",
        "Max Unavailable": "N/A",
        "Allowed Disruptions": 1,
        "Age": "5m",
    }
    other = {"metadata": meta("db"), "spec": {"maxUnavailable": 1}, "status": {}}
    r = row("PodDisruptionBudget", other)
    assert (r["Min Available"], r["Max Unavailable"], r["Allowed Disruptions"]) == ("N/A", "1", 0)


def test_every_registered_kind_fills_every_column() -> None:
    for rt in REGISTRY.all():
        table = to_table(rt, [{"metadata": {"name": "x"}}], resource_version="1", now=NOW)
        assert len(table["rows"][0]["cells"]) == len(table["columnDefinitions"]), rt.kind
        names = [c["name"] for c in table["columnDefinitions"]]
        assert "Name" in names
        assert len(set(names)) == len(names), rt.kind


# --- selectors --------------------------------------------------------------------------------


def test_format_label_selector() -> None:
    sel = {
        "matchLabels": {"app": "web", "env": "prod"},
        "matchExpressions": [
            {"key": "tier", "operator": "NotIn", "values": ["b", "a"]},
            {"key": "gpu", "operator": "Exists"},
            {"key": "spot", "operator": "DoesNotExist"},
        ],
    }
    assert format_label_selector(sel) == "app=web,env=prod,gpu,!spot,tier notin (a,b)"
    assert format_label_selector({}) == "<none>"
    assert format_label_selector(None) == "<none>"


# --- kinds registered later -------------------------------------------------------------------

# A kind no printer knows (kubeflow.org's PyTorchJob has its own printer now).
PYTORCHJOB = ResourceType("training.example.org", "v1", "PyTorchJob", "pytorchjobs", True, "tests:Nope", ("pytj",))


def test_unknown_kind_gets_name_and_age() -> None:
    table = to_table(PYTORCHJOB, [{"metadata": meta("bert", age=3 * HOUR)}], resource_version="1", now=NOW)
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Age"]
    assert table["rows"][0]["cells"] == ["bert", "3h"]


@pytest.fixture
def restore_printers():
    saved = copy.copy(tables._PRINTERS)
    yield
    tables._PRINTERS.clear()
    tables._PRINTERS.update(saved)


def test_register_printer(restore_printers: None) -> None:
    def pytorchjob_row(obj: dict, now: float) -> list:
        state = (obj.get("status", {}).get("conditions") or [{}])[-1].get("type", "")
        return [obj["metadata"]["name"], state, age_cell(obj, now)]

    register_printer(
        "PyTorchJob",
        [tables.NAME_COLUMN, {"name": "State", "type": "string"}, tables.AGE_COLUMN],
        pytorchjob_row,
    )
    obj = {
        "metadata": meta("bert", age=2 * MIN),
        "status": {"conditions": [{"type": "Created"}, {"type": "Running"}]},
    }
    table = to_table(PYTORCHJOB, [obj], resource_version="1", now=NOW)
    assert table["columnDefinitions"][1] == Column("State").to_dict()
    assert table["rows"][0]["cells"] == ["bert", "Running", "2m"]

    # A group-qualified printer wins over a kind-only one, and does not leak to other groups.
    register_printer("PyTorchJob", [tables.NAME_COLUMN], lambda o, now: ["mine"], group="training.example.org")
    assert to_table(PYTORCHJOB, [obj], resource_version="1", now=NOW)["rows"][0]["cells"] == ["mine"]
    other = ResourceType("example.com", "v1", "PyTorchJob", "pytorchjobs", True, "tests:Nope")
    assert to_table(other, [obj], resource_version="1", now=NOW)["rows"][0]["cells"][1] == "Running"


def test_built_in_printers_are_per_group(restore_printers: None) -> None:
    job_like = ResourceType("example.com", "v1", "Job", "jobs", True, "tests:Nope")
    table = to_table(job_like, [{"metadata": meta("j")}], resource_version="1", now=NOW)
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Age"]
