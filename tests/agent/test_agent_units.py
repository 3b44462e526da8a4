"""The agent's pure parts: environment building, back-off, pod phase and conditions, GPU and
port tables, log reading, node settings."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpufleet.agent import logfiles, podstatus
from gpufleet.agent.backoff import RestartBackoff, go_duration
from gpufleet.agent.envvars import EnvError, build_env, expand
from gpufleet.agent.node import NodeSettings, parse_labels, parse_taints, resources
from gpufleet.agent.resources import (
    GPUTable,
    PortRequest,
    PortsUnavailable,
    PortTable,
    port_env,
    port_requests,
    split_gpus,
)
from gpufleet.api.podresources import pod_gpu_request as pod_gpus

# -- environment ------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "want"), [
    ("$(A)-$(B)", "1-two"),
    ("$$(A)", "$(A)"),
    ("$(MISSING) stays", "$(MISSING) stays"),
    ("$A and $", "$A and $"),
    ("$(A", "$(A"),
    ("$$$(A)", "$1"),
])
def test_expand_follows_kubernetes_rules(text, want):
    assert expand(text, {"A": "1", "B": "two"}) == want


def _pod(**spec):
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"app": "web"},
                         "annotations": {"team": "a"}},
            "spec": {"nodeName": "n1", "serviceAccountName": "sa", **spec},
            "status": {"hostIP": "10.0.0.1", "podIP": "10.0.0.1"}}


async def test_build_env_resolves_every_source_in_order():
    objects = {
        ("configmaps", "ns", "cm"): {"data": {"color": "blue", "K1": "v1", "bad key": "x"}},
        ("secrets", "ns", "s"): {"data": {"pw": base64.b64encode(b"hunter2").decode()}},
    }

    async def get(kind, ns, name):
        return objects.get((kind, ns, name))

    container = {
        "name": "c",
        "resources": {"limits": {"cpu": "1500m", "memory": "1Gi"}, "requests": {"cpu": "250m"}},
        "envFrom": [{"configMapRef": {"name": "cm"}}, {"secretRef": {"name": "s"}, "prefix": "S_"}],
        "env": [
            {"name": "K1", "value": "override"},
            {"name": "REF", "value": "$(color)/$(K1)"},
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['team']"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "CPU_M", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
            {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
            {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k", "optional": True}}},
        ],
    }
    env = await build_env(_pod(), container, get, base={"PORT": "8080"})
    assert env["PORT"] == "8080"
    assert env["color"] == "blue" and "bad key" not in env
    assert env["S_pw"] == "hunter2" and env["PW"] == "hunter2"
    assert env["K1"] == "override" and env["REF"] == "blue/override"
    assert (env["NAME"], env["UID"], env["TEAM"], env["SA"], env["HOST"]) == ("p", "u-1", "a", "sa", "10.0.0.1")
    assert (env["CPU"], env["CPU_M"], env["MEM_MI"]) == ("2", "250", "1024")
    assert "OPT" not in env


async def test_build_env_reports_a_missing_source():
    async def get(kind, ns, name):
        return None

    with pytest.raises(EnvError, match='configmap "cm" not found'):
        await build_env(_pod(), {"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}]},
                        get)
    with pytest.raises(EnvError, match='secret "s" not found'):
        await build_env(_pod(), {"envFrom": [{"secretRef": {"name": "s"}}]}, get)


# -- back-off -----------------------------------------------------------------------------------


def test_backoff_is_immediate_then_doubles_to_the_cap_and_resets():
    b = RestartBackoff(initial=10, cap=300, reset_after=600)
    delays = [b.next_delay(ran_for=1) for _ in range(8)]
    assert delays == [0, 10, 20, 40, 80, 160, 300, 300]
    assert b.next_delay(ran_for=601) == 0
    assert b.next_delay(ran_for=1) == 10


@pytest.mark.parametrize(("seconds", "text"), [
    (10, "10s"), (20, "20s"), (80, "1m20s"), (160, "2m40s"), (300, "5m0s"), (0.5, "500ms"), (1.6, "1.6s"),
    (3600, "1h0m0s"),
])
def test_go_duration(seconds, text):
    assert go_duration(seconds) == text


# -- phase and conditions -------------------------------------------------------------------------


def _cs(name, state, last=None, ready=False):
    return {"name": name, "state": state, "lastState": last or {}, "ready": ready}


RUN = {"running": {"startedAt": "x"}}
OK = {"terminated": {"exitCode": 0}}
BAD = {"terminated": {"exitCode": 1}}
WAIT = {"waiting": {"reason": "ContainerCreating"}}
LOOP = {"waiting": {"reason": "CrashLoopBackOff"}}


@pytest.mark.parametrize(("policy", "init", "main", "phase"), [
    ("Always", [], [_cs("a", WAIT)], "Pending"),
    ("Always", [], [_cs("a", RUN)], "Running"),
    ("Always", [], [_cs("a", LOOP, {"terminated": {"exitCode": 1}})], "Running"),
    ("Never", [], [_cs("a", OK)], "Succeeded"),
    ("Never", [], [_cs("a", OK), _cs("b", BAD)], "Failed"),
    ("Never", [], [_cs("a", OK), _cs("b", RUN)], "Running"),
    ("OnFailure", [], [_cs("a", OK)], "Succeeded"),
    ("OnFailure", [], [_cs("a", BAD)], "Running"),
    ("Always", [_cs("i", RUN)], [_cs("a", WAIT)], "Pending"),
    ("Never", [_cs("i", BAD)], [_cs("a", WAIT)], "Failed"),
    ("OnFailure", [_cs("i", LOOP, {"terminated": {"exitCode": 1}})], [_cs("a", WAIT)], "Pending"),
    ("Always", [_cs("i", OK)], [_cs("a", RUN)], "Running"),
])
def test_phase(policy, init, main, phase):
    assert podstatus.phase({"restartPolicy": policy}, init, main) == phase


def test_conditions_keep_transition_times_and_foreign_conditions():
    existing = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2024-01-01T00:00:00Z"},
        {"type": "Ready", "status": "False", "lastTransitionTime": "2024-01-01T00:00:01Z"},
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
    ]
    conds = podstatus.conditions("Running", [], [_cs("a", RUN, ready=False)], [], existing, 1_800_000_000)
    by = {c["type"]: c for c in conds}
    assert by["Ready"]["lastTransitionTime"] == "2024-01-01T00:00:01Z"
    assert by["Ready"]["reason"] == "ContainersNotReady"
    assert by["Ready"]["message"] == "containers with unready status: [a]"
    assert by["DisruptionTarget"]["reason"] == "EvictionByEvictionAPI"
    ready = podstatus.conditions("Running", [], [_cs("a", RUN, ready=True)], [], conds, 1_800_000_100)
    by = {c["type"]: c for c in ready}
    assert by["Ready"]["status"] == "True" and by["Ready"]["lastTransitionTime"] != "2024-01-01T00:00:01Z"
    init = podstatus.conditions("Pending", [_cs("i", RUN)], [_cs("a", WAIT)], [], [], 0)
    assert {c["type"]: c.get("message") for c in init}["Initialized"] == "containers with incomplete status: [i]"
    done = podstatus.conditions("Succeeded", [], [_cs("a", OK)], [], [], 0)
    assert {c["type"]: c.get("reason") for c in done}["ContainersReady"] == "PodCompleted"


# -- GPUs and ports ------------------------------------------------------------------------------


def _gpu(i, group, health="Healthy"):
    return SimpleNamespace(index=i, uuid=f"GPU-{i}", group=group, health=health)


def test_gpu_table_prefers_one_interconnect_group():
    gpus = [_gpu(0, "nvlink-0"), _gpu(1, "nvlink-0"), _gpu(2, "nvlink-2"), _gpu(3, "nvlink-2"),
            _gpu(4, "nvlink-2"), _gpu(5, "pcie-5", health="Unhealthy")]
    table = GPUTable()
    assert table.choose("a", 2, gpus) == [0, 1]  # the tightest group that fits
    table.acquire("a", [0, 1])
    assert table.choose("b", 2, gpus) == [2, 3]
    assert table.choose("b", 4, gpus) is None  # the unhealthy one never counts
    assert table.conflicts("c", [1, 2]) == {1: "a"}
    table.release("a")
    assert table.conflicts("c", [1, 2]) == {}


def test_pod_gpus_and_split():
    pod = {"spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
                                   {"name": "b", "resources": {"requests": {"nvidia.com/gpu": 1}}},
                                   {"name": "c"}],
                    "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": 4}}}]}}
    assert pod_gpus(pod) == 4
    pod["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}}]
    assert pod_gpus(pod) == 3
    assert split_gpus(pod, [4, 5, 6]) == {"a": [4, 5], "b": [6], "c": [], "i": [4]}
    assert split_gpus(pod, [4, 5, 6, 7]) == {"a": [4, 5, 6, 7], "b": [4, 5, 6, 7], "c": [], "i": [4]}


def test_a_sidecars_gpus_count_and_are_its_own():
    # Kubernetes counts a restartable init container's GPUs with the containers' (the agent
    # used to take max(containers, largest init container): 1 here, not 2).
    pod = {"spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                    "initContainers": [{"name": "s", "restartPolicy": "Always",
                                        "resources": {"limits": {"nvidia.com/gpu": 1}}},
                                       {"name": "i", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}
    assert pod_gpus(pod) == 3  # while "i" runs, the sidecar already holds one
    assert split_gpus(pod, [0, 1, 2]) == {"a": [0, 1, 2], "s": [0, 1, 2], "i": [0, 1]}
    assert split_gpus(pod, [0, 1]) == {"a": [0], "s": [1], "i": [0, 1]}


def test_ports_are_never_shared_and_env_names_them():
    table = PortTable("127.0.0.1")
    reqs = [PortRequest("web", "http", "http", 8080, None, "TCP"),
            PortRequest("web", "9090", "", 9090, None, "TCP")]
    a = table.allocate("a", reqs)
    b = table.allocate("b", reqs)
    assert set(a) == {"http", "9090"} and not set(a.values()) & set(b.values())
    env = port_env(reqs, a, "web", host_network=True)
    assert env == {"PORT": str(a["http"]), "GPUFLEET_PORT_HTTP": str(a["http"]), "GPUFLEET_PORT_9090": str(a["9090"])}
    assert port_env(reqs, a, "web", host_network=False)["PORT"] == "8080"
    # A sidecar of the pod sees its neighbour's named ports (they share the network), no PORT.
    assert port_env(reqs, a, "sidecar", host_network=True) == {"GPUFLEET_PORT_HTTP": str(a["http"])}
    fixed = [PortRequest("web", "http", "http", 8080, a["http"], "TCP")]
    with pytest.raises(PortsUnavailable, match="in use by another pod"):
        table.allocate("c", fixed)
    table.release("a")
    assert table.allocate("c", fixed) == {"http": a["http"]}


def test_a_pytorchjob_leader_pins_its_rendezvous_port_by_annotation_only_when_the_job_controls_it():
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "j", "uid": "u", "controller": True}
    leader = {"metadata": {"annotations": {"gpufleet.io/rendezvous-port": "23456"}, "ownerReferences": [owner]},
              "spec": {"containers": [{"name": "pytorch", "ports": [
                  {"name": "pytorchjob-port", "containerPort": 23456}, {"name": "other", "containerPort": 8080}]}]}}
    assert [(r.key, r.host_port) for r in port_requests(leader)] == [("pytorchjob-port", 23456), ("other", None)]
    table = PortTable("127.0.0.1")
    table.allocate("a", port_requests(leader))
    with pytest.raises(PortsUnavailable, match="pytorchjob-port->23456"):
        table.allocate("b", port_requests(leader))
    # Anything else carrying the annotation gets no pinned port from it.
    for meta in ({"ownerReferences": [{**owner, "kind": "ReplicaSet", "apiVersion": "apps/v1"}]},
                 {"ownerReferences": [{**owner, "controller": False}]}, {}):
        other = {**leader, "metadata": {**leader["metadata"], **meta}}
        if not meta:
            other["metadata"].pop("ownerReferences")
        assert port_requests(other)[0].host_port is None
    mismatched = {**leader, "spec": {"containers": [{"name": "pytorch", "ports": [
        {"name": "pytorchjob-port", "containerPort": 1234}]}]}}
    assert port_requests(mismatched)[0].host_port is None


# -- logs -----------------------------------------------------------------------------------------


def test_read_log_handles_cri_lines_tail_since_and_timestamps(tmp_path: Path):
    path = tmp_path / "0.log"
    path.write_bytes(
        b"2024-05-01T12:00:00.000000001Z stdout F one\n"
        b"2024-05-01T12:00:01.5Z stderr P tw\n"
        b"2024-05-01T12:00:01.6Z stderr F o\n"
        b"2024-05-01T12:00:02Z stdout F three\n"
    )
    assert logfiles.read_log(path, logfiles.LogOptions()) == b"one\ntwo\nthree\n"
    assert logfiles.read_log(path, logfiles.LogOptions(tail_lines=2)) == b"two\nthree\n"
    assert logfiles.read_log(path, logfiles.LogOptions(tail_lines=0)) == b""
    since = logfiles.read_log(path, logfiles.LogOptions(since_time=1714564801.55))
    assert since == b"o\nthree\n"
    stamped = logfiles.read_log(path, logfiles.LogOptions(timestamps=True, tail_lines=1))
    assert stamped == b"2024-05-01T12:00:02.000000000Z three\n"
    raw = tmp_path / "raw.log"
    raw.write_bytes(b"plain\nlast without newline")
    assert logfiles.read_log(raw, logfiles.LogOptions()) == b"plain\nlast without newline\n"
    assert logfiles.attempts(tmp_path) == [0]


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


async def test_follow_log_streams_until_the_container_stops(tmp_path: Path):
    path = tmp_path / "0.log"
    path.write_bytes(b"2024-05-01T12:00:00Z stdout F first\n")
    alive = [True]
    chunks = []

    async def consume():
        async for chunk in logfiles.follow_log(path, logfiles.LogOptions(), lambda: alive[0]):
            chunks.append(chunk)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)
    await asyncio.to_thread(_append, path, b"2024-05-01T12:00:01Z stdout F second\n")
    await asyncio.sleep(0.3)
    alive[0] = False
    await asyncio.wait_for(task, 2)
    assert b"".join(chunks) == b"first\nsecond\n"


# -- node ---------------------------------------------------------------------------------------


def test_node_settings_parsing_and_resources():
    assert parse_labels("a=b, gpufleet.io/rack=r1") == {"a": "b", "gpufleet.io/rack": "r1"}
    assert parse_taints("gpu=true:NoSchedule,spot:PreferNoSchedule") == [
        {"key": "gpu", "value": "true", "effect": "NoSchedule"}, {"key": "spot", "effect": "PreferNoSchedule"}]
    with pytest.raises(ValueError):
        parse_taints("gpu=true:Sometimes")
    with pytest.raises(ValueError):
        parse_labels("novalue")
    settings = NodeSettings(name="n", address="127.0.0.1", port=1, cpus=2.5, memory_bytes=16 << 30,
                            runtime_version="process://")
    capacity, allocatable = resources(settings, [_gpu(0, "g"), _gpu(1, "g", "Unhealthy")])
    assert capacity["cpu"] == "2500m" and capacity["memory"] == "16777216Ki"
    assert capacity["nvidia.com/gpu"] == "2" and allocatable["nvidia.com/gpu"] == "1"
