"""The node agent against a real control plane, over HTTP, running real processes.

Each test starts a control plane on SQLite and one agent with the process runtime and
declared GPUs, binds pods to the agent's node (there is no scheduler here) and watches what
the agent reports. Back-offs and probe periods are scaled down so every case takes seconds.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent.agent import AgentConfig, NodeAgent
from gpufleet.agent.bootstrap import node_token
from gpufleet.agent.devices import DeclaredDevices
from gpufleet.agent.runtime.process import ProcessRuntime
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client import BadRequest, Client, HttpTransport, NotFound
from gpufleet.controllers.manager import ControllerManager, start_controllers

PY = sys.executable
NODE = "gpu-node-1"


# -- harness ----------------------------------------------------------------------------------


async def eventually(check: Callable[[], Awaitable[Any]], limit_s: float = 15.0, what: str = "condition") -> Any:
    """Poll ``check`` until it returns something truthy without raising AssertionError."""
    deadline = time.monotonic() + limit_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            result = await check()
            if result:
                return result
        except (AssertionError, NotFound, KeyError, IndexError, TypeError) as exc:
            last = exc
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {last!r}")


class Harness:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.cp: ControlPlane | None = None
        self.ipam: ControllerManager | None = None
        self.port = 0
        self.agents: list[NodeAgent] = []

    async def start_control_plane(self) -> ControlPlane:
        self.cp = ControlPlane(store_url=f"sqlite:///{self.tmp / 'state.db'}", port=self.port,
                               state_dir=self.tmp / "cp", run_controllers=False)
        await self.cp.start()
        self.port = self.cp.http.port
        # What a node needs from the controller manager and nothing that would act behind the
        # tests' backs: node IPAM (a pod network per node), the default service accounts and
        # the CA config map (the token volume every pod gets).
        assert self.cp.client is not None
        self.ipam = await start_controllers(self.cp.client, enabled=("nodeipam", "serviceaccount",
                                                                     "root-ca-cert-publisher"),
                                            root_ca=self.cp.ca_pem)
        return self.cp

    @property
    def api(self) -> Client:
        assert self.cp is not None and self.cp.client is not None
        return self.cp.client

    async def start_agent(self, name: str = NODE, gpus: int = 4, **config: Any) -> NodeAgent:
        assert self.cp is not None
        state = self.tmp / f"agent-{name}"

        def connect(token: str | None) -> Client:
            return Client(HttpTransport(self.cp.url, token=token, ca_data=self.cp.ca_pem), read_retries=1)
        # Joins as a remote agent does: the join token buys this node's own (restricted) token.
        client = connect(await node_token(connect, self.cp.join_token, name, state))
        settings = dict(
            node_name=name, state_dir=state, heartbeat_interval=0.3, backoff_initial=0.4, backoff_cap=1.6,
            probe_period_scale=0.2, api_retry_max=0.5, labels={"gpufleet.io/rack": "r1",
                                                                 "topology.kubernetes.io/zone": "z1"},
            taints=[{"key": "gpu", "value": "true", "effect": "NoSchedule"}], cpus=8, memory_bytes=32 << 30,
        )
        runtime = config.pop("runtime", None)
        devices = config.pop("devices", None) or DeclaredDevices(gpus, "NVIDIA H100 80GB HBM3", 81920, node_name=name)
        if runtime is None:
            # The pods talk to the test through files in its tmp dir: the sandbox shows it
            # to them (read-write, for the unprivileged default user), and hides the agent's
            # state and the control plane's inside it.
            self.tmp.chmod(0o1777)
            hidden = [self.tmp / "cp", *self.tmp.glob("state.db*")]
            runtime = ProcessRuntime(state, cgroup_root=None, shared_paths=[self.tmp], hidden_paths=hidden)
        settings.update(config)
        agent = NodeAgent(client, runtime, devices, AgentConfig(**settings))
        await agent.start()
        assert await agent.wait_registered(10), "the agent did not register"
        self.agents.append(agent)
        return agent

    async def pod(self, name: str, script: str | None = None, *, command: list[str] | None = None,
                  node: str = NODE, **spec: Any) -> dict[str, Any]:
        containers = spec.pop("containers", None)
        annotations = spec.pop("annotations", None)
        labels = spec.pop("labels", {"app": name})
        if containers is None:
            container: dict[str, Any] = {"name": "main", "image": "python:3.12",
                                         "command": command or [PY, "-u", "-c", textwrap.dedent(script or "")]}
            container.update(spec.pop("container", {}))
            containers = [container]
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default", "labels": labels,
                             **({"annotations": annotations} if annotations else {})},
                "spec": {"nodeName": node, "containers": containers, "terminationGracePeriodSeconds": 5,
                         **spec}}
        return await self.api.create(body, raw=True)

    async def get(self, name: str) -> dict[str, Any]:
        return await self.api.get("pods", name, "default", raw=True)

    async def wait_pod(self, name: str, pred: Callable[[dict[str, Any]], bool], limit_s: float = 15.0,
                       what: str = "") -> dict[str, Any]:
        async def check():
            p = await self.get(name)
            return p if pred(p) else None
        try:
            return await eventually(check, limit_s, what or f"pod {name}")
        except AssertionError:
            p = await self.get(name)
            raise AssertionError(f"{what or name}: {json.dumps(p.get('status'), indent=1)}") from None

    async def events(self, name: str) -> list[dict[str, Any]]:
        for a in self.agents:
            await a.recorder.flush()
        evs = await self.api.list("events", "default", raw=True)
        return [e for e in evs.items if e["involvedObject"].get("name") == name]

    async def close(self) -> None:
        for a in self.agents:
            await a.stop()
            await a.client.close()
        # The process runtime's containers outlive their agent (also the CLI agent's, and
        # those of an agent a test restarted): find them again and take them down.
        for containers in self.tmp.glob("*/containers"):
            runtime = ProcessRuntime(containers.parent, cgroup_root=None)
            await runtime.recover("")
            await runtime.stop_all(1)
            await runtime.close()
        if self.ipam is not None:
            await self.ipam.stop()
        if self.cp is not None:
            await self.cp.stop()


@pytest.fixture
async def h(tmp_path):
    harness = Harness(tmp_path)
    await harness.start_control_plane()
    try:
        yield harness
    finally:
        await harness.close()


def cond(pod: dict[str, Any], ctype: str) -> str | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return c["status"]
    return None


def cstatus(pod: dict[str, Any], name: str = "main") -> dict[str, Any]:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs["name"] == name:
            return cs
    return {}


def running(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and "running" in cstatus(pod).get("state", {})


def ready(pod: dict[str, Any]) -> bool:
    return running(pod) and cond(pod, "Ready") == "True"


# -- registration -------------------------------------------------------------------------------


async def test_node_registers_with_gpus_labels_taints_and_lease(h):
    agent = await h.start_agent()
    node = await h.api.get("nodes", NODE, raw=True)
    meta, status = node["metadata"], node["status"]
    assert meta["labels"]["kubernetes.io/hostname"] == NODE
    assert meta["labels"]["kubernetes.io/os"] == "linux"
    assert meta["labels"]["nvidia.com/gpu.product"] == "H100-80GB-HBM3"
    assert meta["labels"]["nvidia.com/gpu.count"] == "4"
    assert meta["labels"]["nvidia.com/gpu.memory"] == "81920"
    assert meta["labels"]["gpufleet.io/rack"] == "r1"
    assert meta["labels"]["topology.kubernetes.io/zone"] == "z1"
    # Declared GPUs (not NVML's), and registered by the node itself.
    assert meta["labels"]["gpufleet.io/inventory"] == "declared"
    assert meta["annotations"]["gpufleet.io/registered-by"] == f"system:node:{NODE}"
    gpus = json.loads(meta["annotations"]["gpufleet.io/gpus"])
    assert [g["index"] for g in gpus] == [0, 1, 2, 3] and all(g["health"] == "Healthy" for g in gpus)
    assert node["spec"]["taints"] == [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]
    assert status["capacity"]["nvidia.com/gpu"] == "4" and status["allocatable"]["nvidia.com/gpu"] == "4"
    assert status["capacity"]["cpu"] == "8" and status["capacity"]["memory"] == f"{32 << 20}Ki"
    assert status["capacity"]["pods"] == "110"
    assert status["nodeInfo"]["kubeletVersion"] == "v1.32.4-gpufleet"
    assert status["nodeInfo"]["containerRuntimeVersion"].startswith("process://")
    assert status["daemonEndpoints"]["kubeletEndpoint"]["Port"] == agent.port
    assert {"type": "InternalIP", "address": "127.0.0.1"} in status["addresses"]
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Ready"]["status"] == "True" and conds["Ready"]["reason"] == "KubeletReady"
    assert {conds[t]["status"] for t in ("MemoryPressure", "DiskPressure", "PIDPressure")} == {"False"}

    lease = await h.api.get("leases", NODE, "kube-node-lease", raw=True)
    assert lease["spec"]["holderIdentity"] == NODE and lease["spec"]["leaseDurationSeconds"] == 10
    first = lease["spec"]["renewTime"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", first)

    async def renewed():
        again = await h.api.get("leases", NODE, "kube-node-lease", raw=True)
        return again["spec"]["renewTime"] != first
    await eventually(renewed, 5, "the lease to be renewed")

    # A deleted Node comes back.
    await h.api.delete("nodes", NODE)

    async def back():
        return await h.api.get("nodes", NODE, raw=True)
    again = await eventually(back, 10, "the node to register again")
    assert again["metadata"]["uid"] != meta["uid"]
    assert again["status"]["capacity"]["nvidia.com/gpu"] == "4"


# -- running pods -------------------------------------------------------------------------------


async def test_the_agent_state_dir_is_its_owners_only(h, tmp_path):
    """The node token, logs and sandboxes live there: 0700, also when it existed open."""
    import os
    import stat

    state = tmp_path / f"agent-{NODE}"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    await h.start_agent()
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE((state / "node-token").stat().st_mode) == 0o600


async def test_pod_runs_with_gpus_ports_and_env(h, tmp_path):
    await h.start_agent()
    await h.api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "default"},
                        "data": {"mode": "fast", "LEVEL": "3"}}, raw=True)
    await h.api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sec", "namespace": "default"},
                        "data": {"token": "czNjcjN0"}}, raw=True)
    out = tmp_path / "env.json"
    await h.pod("web-0", f"""
        import json, os, time
        json.dump(dict(os.environ), open({str(out)!r}, "w"))
        time.sleep(60)
        """, annotations={"gpufleet.io/gpu-indices": "1,2"}, container={
        "ports": [{"name": "http", "containerPort": 8080}, {"name": "metrics-port", "containerPort": 9090}],
        "resources": {"limits": {"nvidia.com/gpu": 2}},
        "env": [
            {"name": "GREETING", "value": "hello"},
            {"name": "EARLY", "value": "$(MY_POD)"},
            {"name": "MY_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "MY_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "MSG", "value": "$(GREETING) from $(MY_POD) on $(MY_NODE); $$(GREETING) $(NOPE)"},
            {"name": "MY_APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "token"}}},
            {"name": "GPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.nvidia.com/gpu"}}},
        ],
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
    })
    pod = await h.wait_pod("web-0", ready, what="web-0 Running and Ready")
    assert await eventually(lambda: asyncio.to_thread(out.exists), 10, "the env file")
    env = json.loads(await eventually(lambda: asyncio.to_thread(out.read_text), 5, "env"))
    assert env["CUDA_VISIBLE_DEVICES"] == "1,2"
    assert env["NVIDIA_VISIBLE_DEVICES"].count("GPU-") == 2
    assert env["MSG"] == "hello from web-0 on gpu-node-1; $(GREETING) $(NOPE)"
    # Only names defined earlier expand, as in Kubernetes.
    assert env["EARLY"] == "$(MY_POD)"
    assert (env["MY_APP"], env["MY_IP"], env["MODE"], env["TOKEN"]) == ("web-0", "127.0.0.1", "fast", "s3cr3t")
    assert env["GPU_LIMIT"] == "2" and env["CFG_LEVEL"] == "3" and env["HOSTNAME"] == "web-0"

    pod = await h.get("web-0")
    ports = json.loads(pod["metadata"]["annotations"]["gpufleet.io/host-ports"])
    assert set(ports) == {"http", "metrics-port"}
    assert env["PORT"] == str(ports["http"])
    assert env["GPUFLEET_PORT_HTTP"] == str(ports["http"])
    assert env["GPUFLEET_PORT_METRICS_PORT"] == str(ports["metrics-port"])

    status = pod["status"]
    assert status["hostIP"] == status["podIP"] == "127.0.0.1" and status["startTime"]
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "PodScheduled": "True", "Initialized": "True", "ContainersReady": "True", "Ready": "True",
        "gpufleet.io/RuntimeLimitation": "True"}
    assert all(c.get("lastTransitionTime") for c in status["conditions"])
    cs = cstatus(pod)
    assert cs["ready"] and cs["started"] and cs["restartCount"] == 0 and cs["image"] == "python:3.12"
    assert re.fullmatch(r"process://\d+", cs["containerID"])
    assert cs["state"]["running"]["startedAt"]
    events = await h.events("web-0")
    reasons = [e["reason"] for e in events]
    assert {"Created", "Started"} <= set(reasons)
    # The process runtime runs the host's programs: the image it cannot run is said, not ignored.
    limitation = [e["message"] for e in events if e["reason"] == "RuntimeLimitation"]
    assert limitation and "image python:3.12 not used" in limitation[0], events
    p = await h.wait_pod("web-0", lambda p: cond(p, "gpufleet.io/RuntimeLimitation") == "True",
                         what="the RuntimeLimitation condition")
    assert "image python:3.12 not used" in next(c["message"] for c in p["status"]["conditions"]
                                                  if c["type"] == "gpufleet.io/RuntimeLimitation")


async def test_gpu_pods_never_share_an_index(h, tmp_path):
    agent = await h.start_agent(gpus=4)
    sleeper = "import time; time.sleep(60)"
    gpu2 = {"resources": {"limits": {"nvidia.com/gpu": 2}}}
    await h.pod("a", sleeper, container=gpu2)
    await h.pod("b", sleeper, container=gpu2)
    a = await h.wait_pod("a", running)
    b = await h.wait_pod("b", running)
    ia = set(map(int, a["metadata"]["annotations"]["gpufleet.io/gpu-indices"].split(",")))
    ib = set(map(int, b["metadata"]["annotations"]["gpufleet.io/gpu-indices"].split(",")))
    assert len(ia) == len(ib) == 2 and not ia & ib

    # No GPU left: the third waits instead of sharing; so does one that names a taken index.
    await h.pod("c", sleeper, container=gpu2)
    taken = sorted(ia)[0]
    await h.pod("d", sleeper, container={"resources": {"limits": {"nvidia.com/gpu": 1}}},
                annotations={"gpufleet.io/gpu-indices": str(taken)})
    for name in ("c", "d"):
        p = await h.wait_pod(name, lambda p: cstatus(p).get("state", {}).get("waiting", {}).get("reason")
                             == "GPUsUnavailable", what=f"{name} waiting for GPUs")
        assert p["status"]["phase"] == "Pending"
    d = await h.get("d")
    assert "in use by pod default/a" in cstatus(d)["state"]["waiting"]["message"]
    assert "GPUsUnavailable" in {e["reason"] for e in await h.events("d")}
    owners = agent.gpu_table.owner
    assert sorted(owners) == sorted(ia | ib)

    # Freeing a's GPUs lets one of the waiting pods have them, never both.
    await h.api.delete("pods", "a", "default", grace_period_seconds=0)

    async def one_runs():
        pods = [await h.get("c"), await h.get("d")]
        return [p["metadata"]["name"] for p in pods if running(p)]
    winners = await eventually(one_runs, 10, "c or d to start")
    loser = await h.get("d" if winners == ["c"] else "c")
    assert winners in (["c"], ["d"]), winners
    assert cstatus(loser)["state"]["waiting"]["reason"] == "GPUsUnavailable"
    assert {i for i, uid in agent.gpu_table.owner.items() if uid == b["metadata"]["uid"]} == ib


# -- restarts, probes, termination ---------------------------------------------------------------


async def test_crashing_container_restarts_with_growing_backoff(h):
    await h.start_agent()
    pod = await h.pod("crash", "import sys; print('dying'); sys.exit(3)")
    uid = pod["metadata"]["uid"]
    seen: list[dict[str, Any]] = []

    async def looping():
        p = await h.get("crash")
        cs = cstatus(p)
        seen.append(cs)
        waiting = cs.get("state", {}).get("waiting") or {}
        return p if cs.get("restartCount", 0) >= 3 and waiting.get("reason") == "CrashLoopBackOff" else None
    p = await eventually(looping, 20, "CrashLoopBackOff after 3 restarts")
    cs = cstatus(p)
    assert p["status"]["phase"] == "Running"
    assert re.fullmatch(rf"back-off \S+ restarting failed container=main pod=crash_default\({uid}\)",
                        cs["state"]["waiting"]["message"]), cs["state"]["waiting"]["message"]
    last = cs["lastState"]["terminated"]
    assert last["exitCode"] == 3 and last["reason"] == "Error" and last["finishedAt"]
    assert cond(p, "Ready") == "False"
    # The delay doubles: later messages name longer back-offs than earlier ones.
    delays = [w["message"].split()[1] for s in seen if (w := s.get("state", {}).get("waiting") or {})
              and w.get("reason") == "CrashLoopBackOff"]
    assert delays[0] in ("400ms", "800ms") and delays[-1] in ("800ms", "1.6s"), delays
    reasons = [e["reason"] for e in await h.events("crash")]
    assert "BackOff" in reasons and "Started" in reasons


async def test_failing_liveness_probe_restarts_the_container(h):
    await h.start_agent()
    await h.pod("live", "import time; time.sleep(60)", container={
        "livenessProbe": {"exec": {"command": ["false"]}, "periodSeconds": 1, "failureThreshold": 2},
    })
    p = await h.wait_pod("live", lambda p: cstatus(p).get("restartCount", 0) >= 1, what="a liveness restart")
    assert cstatus(p)["lastState"]["terminated"]["exitCode"] in (137, 143)
    events = await h.events("live")
    unhealthy = [e for e in events if e["reason"] == "Unhealthy"]
    assert unhealthy and unhealthy[0]["message"].startswith("Liveness probe failed")
    assert any(e["reason"] == "Killing" and "failed liveness probe" in e["message"] for e in events)

    # httpGet on a port nobody listens on fails the same way.
    await h.pod("live-http", "import time; time.sleep(60)", container={
        "ports": [{"name": "http", "containerPort": 8080}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1,
                          "failureThreshold": 1},
    })
    await h.wait_pod("live-http", lambda p: cstatus(p).get("restartCount", 0) >= 1, what="an httpGet restart")
    msgs = [e["message"] for e in await h.events("live-http") if e["reason"] == "Unhealthy"]
    assert any("connection refused" in m for m in msgs), msgs


async def test_readiness_probe_drives_ready(h, tmp_path):
    await h.start_agent()
    site = tmp_path / "site"
    site.mkdir()
    await h.pod("ready", command=[PY, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(site),
                                  "$(PORT)"], container={
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/ok", "port": "http"}, "periodSeconds": 1},
    })
    p = await h.wait_pod("ready", running, what="ready running")
    await asyncio.sleep(0.5)
    p = await h.get("ready")
    assert cond(p, "Ready") == "False" and not cstatus(p)["ready"]
    await asyncio.to_thread((site / "ok").write_text, "yes")
    p = await h.wait_pod("ready", ready, what="ready after /ok exists")
    assert cond(p, "ContainersReady") == "True" and cstatus(p)["ready"]
    await asyncio.to_thread((site / "ok").unlink)
    p = await h.wait_pod("ready", lambda p: cond(p, "Ready") == "False", what="unready again")
    assert cstatus(p)["restartCount"] == 0 and running(p)


async def test_graceful_deletion_sends_sigterm_then_removes_the_pod(h, tmp_path):
    await h.start_agent()
    marker = tmp_path / "sigterm"
    await h.pod("grace", f"""
        import signal, sys, time
        def bye(*_):
            open({str(marker)!r}, "w").write("got SIGTERM")
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("ready", flush=True)
        time.sleep(60)
        """, annotations={"gpufleet.io/gpu-indices": "0"},
        container={"resources": {"limits": {"nvidia.com/gpu": 1}}})
    p = await h.wait_pod("grace", running)
    pid = int(cstatus(p)["containerID"].split("://")[1])
    await asyncio.sleep(0.3)  # let the child install its handler
    deleted = await h.api.delete("pods", "grace", "default", raw=True)
    assert deleted["metadata"].get("deletionTimestamp")

    async def gone():
        try:
            await h.get("grace")
        except NotFound:
            return True
        return False
    await eventually(gone, 10, "the pod object to disappear")
    assert (await asyncio.to_thread(marker.read_text)) == "got SIGTERM"
    assert not await asyncio.to_thread(Path(f"/proc/{pid}").exists)
    assert h.agents[0].gpu_table.owner == {}
    assert "Killing" in {e["reason"] for e in await h.events("grace")}


async def test_restart_policy_never_ends_in_succeeded_or_failed(h):
    agent = await h.start_agent()
    await h.pod("ok", "print('done')", restartPolicy="Never",
                container={"resources": {"limits": {"nvidia.com/gpu": 4}}})
    await h.pod("bad", "import sys; sys.exit(2)", restartPolicy="Never")
    ok = await h.wait_pod("ok", lambda p: p["status"].get("phase") == "Succeeded", what="ok Succeeded")
    bad = await h.wait_pod("bad", lambda p: p["status"].get("phase") == "Failed", what="bad Failed")
    term = cstatus(ok)["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed"
    assert cond(ok, "Ready") == "False" and cond(ok, "ContainersReady") == "False"
    assert cstatus(bad)["state"]["terminated"]["exitCode"] == 2 and cstatus(bad)["restartCount"] == 0
    # A finished pod holds no GPUs: another can have all four.
    assert agent.gpu_table.owner == {}
    await h.pod("next", "import time; time.sleep(30)", container={"resources": {"limits": {"nvidia.com/gpu": 4}}})
    await h.wait_pod("next", running)
    await asyncio.sleep(0.5)
    assert (await h.get("ok"))["status"]["phase"] == "Succeeded"


async def test_init_containers_run_first_in_order(h, tmp_path):
    await h.start_agent()
    trail = tmp_path / "trail"
    step = "open({path!r}, 'a').write({name!r} + '\\n')"
    init = [{"name": n, "image": "python:3.12", "command": [PY, "-c", step.format(path=str(trail), name=n)]}
            for n in ("first", "second")]
    main = {"name": "main", "image": "python:3.12", "command": [PY, "-c", step.format(path=str(trail), name="main")
                                                                + "; import time; time.sleep(30)"]}
    await h.pod("init", containers=[main], initContainers=init)
    p = await h.wait_pod("init", running, what="init running")

    async def all_ran():
        return (await asyncio.to_thread(trail.read_text)).split() == ["first", "second", "main"]
    await eventually(all_ran, 5, "main to run after both init containers")
    assert cond(p, "Initialized") == "True"
    assert [s["state"]["terminated"]["reason"] for s in p["status"]["initContainerStatuses"]] == ["Completed"] * 2


async def test_startup_probe_gates_started_and_on_failure_policy(h, tmp_path):
    await h.start_agent()
    up = tmp_path / "up"
    await h.pod("slow", "import time; time.sleep(60)", container={
        "startupProbe": {"exec": {"command": ["test", "-f", str(up)]}, "periodSeconds": 1, "failureThreshold": 30},
        "livenessProbe": {"exec": {"command": ["false"]}, "periodSeconds": 1, "failureThreshold": 1},
    })
    p = await h.wait_pod("slow", running)
    await asyncio.sleep(1.0)
    p = await h.get("slow")
    # Liveness waits for startup: nothing restarted while the startup probe has not passed.
    assert cstatus(p)["started"] is False and cstatus(p)["restartCount"] == 0 and cond(p, "Ready") == "False"
    await asyncio.to_thread(up.write_text, "")
    await h.wait_pod("slow", lambda p: cstatus(p).get("restartCount", 0) >= 1, what="liveness after startup")

    # OnFailure: a failed attempt is retried, a clean exit ends the pod.
    tries = tmp_path / "tries"
    await h.pod("retry", f"""
        import os, sys
        n = len(open({str(tries)!r}).read()) if os.path.exists({str(tries)!r}) else 0
        open({str(tries)!r}, "a").write("x")
        sys.exit(0 if n else 1)
        """, restartPolicy="OnFailure")
    p = await h.wait_pod("retry", lambda p: p["status"].get("phase") == "Succeeded", what="retry Succeeded")
    assert cstatus(p)["restartCount"] == 1 and cstatus(p)["lastState"]["terminated"]["exitCode"] == 1

    # activeDeadlineSeconds ends a pod that runs too long.
    await h.pod("late", "import time; time.sleep(60)", activeDeadlineSeconds=1)
    p = await h.wait_pod("late", lambda p: p["status"].get("phase") == "Failed", what="deadline exceeded")
    assert p["status"]["reason"] == "DeadlineExceeded"


async def test_a_restarted_agent_picks_up_where_the_last_one_left(h):
    agent = await h.start_agent()
    await h.pod("long", "import time; time.sleep(60)")
    await h.pod("done", "print('bye')", restartPolicy="Never")
    old = await h.wait_pod("long", running)
    await h.wait_pod("done", lambda p: p["status"].get("phase") == "Succeeded")
    await agent.stop()
    await agent.client.close()
    h.agents.remove(agent)

    # The container outlived its agent: the new one adopts it, it does not start it again.
    agent = await h.start_agent()
    await asyncio.wait_for(agent.orphans_reaped.wait(), 10)
    await asyncio.sleep(1.0)
    p = await h.get("long")
    assert running(p) and cstatus(p)["containerID"] == cstatus(old)["containerID"], cstatus(p)
    assert cstatus(p)["restartCount"] == 0
    assert len([w for w in agent.workers.values() if w.name == "long" and w.running_handles()]) == 1
    done = await h.get("done")
    assert done["status"]["phase"] == "Succeeded" and cstatus(done)["restartCount"] == 0

    # A pod deleted and created again under the same name is a new pod with fresh counts.
    await h.api.delete("pods", "long", "default", grace_period_seconds=0)
    await h.pod("long", "import time; time.sleep(60)")
    p = await h.wait_pod("long", running, what="the new long")
    assert cstatus(p)["restartCount"] == 0


async def test_a_simulated_node_runs_pods_the_same_way(h):
    from gpufleet.agent.runtime.simulated import SimulatedRuntime

    agent = await h.start_agent(name="sim-1", runtime=SimulatedRuntime())
    node = await h.api.get("nodes", "sim-1", raw=True)
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("simulated://")
    sim = {"gpufleet.io/sim-duration": "0.5", "gpufleet.io/sim-cpu-millis": "1500",
           "gpufleet.io/sim-memory-bytes": str(1 << 30)}
    await h.pod("train", command=["train.py"], node="sim-1", restartPolicy="Never", annotations=sim,
                container={"resources": {"limits": {"nvidia.com/gpu": 2}}})
    await h.pod("broken", command=["x"], node="sim-1", annotations={
        "gpufleet.io/sim-fail-start": "manifest unknown", "gpufleet.io/sim-fail-reason": "ErrImagePull"})
    p = await h.wait_pod("train", running)
    summary = await agent.stats_summary()
    train = next(x for x in summary["pods"] if x["podRef"]["name"] == "train")
    assert train["containers"][0]["cpu"]["usageNanoCores"] == 1_500_000_000
    p = await h.wait_pod("train", lambda p: p["status"].get("phase") == "Succeeded")
    assert cstatus(p)["state"]["terminated"]["reason"] == "Completed"
    b = await h.wait_pod("broken", lambda p: cstatus(p).get("state", {}).get("waiting", {}).get("reason")
                         == "ErrImagePull")
    assert cstatus(b)["state"]["waiting"]["message"] == "manifest unknown" and b["status"]["phase"] == "Pending"


# -- logs and usage -----------------------------------------------------------------------------


async def test_logs_through_the_api(h, tmp_path):
    await h.start_agent()
    go = tmp_path / "go"
    await h.pod("talk", f"""
        import os, sys, time
        for i in range(3):
            print(f"line {{i}}", flush=True)
        while not os.path.exists({str(go)!r}):
            time.sleep(0.05)
        print("late line", flush=True)
        sys.exit(1)
        """)
    await h.wait_pod("talk", running)

    async def three_lines():
        text = await h.api.log("talk")
        return text if text.count("\n") >= 3 else None
    text = await eventually(three_lines, 10, "three log lines")
    assert text == "line 0\nline 1\nline 2\n"
    assert await h.api.log("talk", tail_lines=1) == "line 2\n"
    stamped = await h.api.log("talk", container="main", timestamps=True, tail_lines=1)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z line 2\n", stamped), stamped

    # Following streams through the API server's HTTP adapter until the container exits.
    async with Client(HttpTransport(h.cp.url, token=h.cp.admin_token, ca_data=h.cp.ca_pem)) as remote:
        lines = await remote.log("talk", follow=True)
        got = [await lines.__anext__() for _ in range(3)]
        await asyncio.to_thread(go.write_text, "")
        rest = [line async for line in lines]
    assert got + rest == ["line 0", "line 1", "line 2", "late line"]

    # After the restart the previous attempt's log is still there.
    await h.wait_pod("talk", lambda p: cstatus(p).get("restartCount", 0) >= 1)
    previous = await h.api.log("talk", previous=True)
    assert previous.endswith("late line\n")

    await h.pod("duo", containers=[
        {"name": n, "image": "python:3.12", "command": [PY, "-c", f"print('I am {n}', flush=True); import time; time.sleep(30)"]}
        for n in ("a", "b")])
    await h.wait_pod("duo", lambda p: p["status"].get("phase") == "Running", what="duo running")
    with pytest.raises(BadRequest, match="a container name must be specified for pod duo, choose one of: \\[a b\\]"):
        await h.api.log("duo")
    assert await eventually(lambda: h.api.log("duo", container="b"), 5, "b's log") == "I am b\n"


async def test_metrics_summary_and_metrics_api(h):
    agent = await h.start_agent()
    await h.pod("busy", "import time\nwhile True: sum(range(10000)); time.sleep(0.001)",
                annotations={"gpufleet.io/gpu-indices": "3"}, container={"resources": {"limits": {"nvidia.com/gpu": 1}}})
    await h.wait_pod("busy", running)
    agent.devices.set_busy([3], 55.0)
    base = f"https://127.0.0.1:{agent.port}"
    async with httpx.AsyncClient(verify=False) as http:
        assert (await http.get(f"{base}/healthz")).text == "ok"
        # Only the API server's token for this node opens the rest, whatever the path.
        other = h.cp.node_proxy.node_headers("another-node")
        for path in ("/stats/summary", "/stats/workload", "/metrics", "/metrics/resource",
                     "/containerLogs/default/busy/main", "/pods", "/"):
            for headers in (None, other, {"authorization": "Basic eDp5"}):
                resp = await http.get(f"{base}{path}", headers=headers)
                assert resp.status_code == 401, (path, headers, resp.status_code)
                assert resp.json()["reason"] == "Unauthorized"
        assert (await http.post(f"{base}/stats/summary")).status_code == 401
        mine = h.cp.node_proxy.node_headers(NODE)
        assert (await http.get(f"{base}/stats/summary", headers=mine)).status_code == 200
    # Everyone else reads them through the API server: nodes/{name}/proxy/...
    summary = json.loads((await h.api.raw_request("GET", f"/api/v1/nodes/{NODE}/proxy/stats/summary")).body)
    scraped = await h.api.raw_request("GET", f"/api/v1/nodes/{NODE}/proxy/metrics")
    assert scraped.headers["content-type"].startswith("text/plain; version=0.0.4")
    metrics = scraped.body.decode()
    assert summary["node"]["nodeName"] == NODE and summary["node"]["memory"]["workingSetBytes"] > 0
    pods = {p["podRef"]["name"]: p for p in summary["pods"]}
    assert pods["busy"]["containers"][0]["name"] == "main"
    gpus = {g["index"]: g for g in summary["node"]["gpus"]}
    assert gpus[3]["utilizationPercent"] == 55.0 and gpus[3]["pod"] == "default/busy"
    assert re.search(r'DCGM_FI_DEV_GPU_UTIL\{.*gpu="3".*pod="busy".*\} 55\.0', metrics)
    assert 'kube_pod_container_status_restarts_total{container="main",namespace="default",pod="busy"} 0.0' in metrics
    assert "gpufleet_node_cpu_usage_cores" in metrics

    nodes = json.loads((await h.api.raw_request("GET", "/apis/metrics.k8s.io/v1beta1/nodes")).body)
    assert nodes["kind"] == "NodeMetricsList" and nodes["items"][0]["metadata"]["name"] == NODE
    assert nodes["items"][0]["usage"]["memory"].endswith("Ki")
    gpu_use = json.loads(nodes["items"][0]["metadata"]["annotations"]["gpufleet.io/gpu-metrics"])
    assert [g["utilization"] for g in gpu_use] == [0.0, 0.0, 0.0, 55.0]
    pods = json.loads((await h.api.raw_request(
        "GET", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods")).body)
    assert pods["kind"] == "PodMetricsList"
    assert [(i["metadata"]["name"], i["containers"][0]["name"]) for i in pods["items"]] == [("busy", "main")]
    apis = json.loads((await h.api.raw_request("GET", "/apis")).body)
    assert "metrics.k8s.io" in {g["name"] for g in apis["groups"]}


# -- the control plane goes away and comes back ---------------------------------------------------


async def test_agent_survives_a_control_plane_restart(h):
    agent = await h.start_agent()
    await h.pod("steady", "import time; time.sleep(120)", container={
        "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1}})
    p = await h.wait_pod("steady", ready)
    container_id = cstatus(p)["containerID"]
    lease = await h.api.get("leases", NODE, "kube-node-lease", raw=True)

    await h.cp.stop()
    await asyncio.sleep(2.0)  # the agent keeps running its pod, retrying the API meanwhile
    worker = agent.worker_for("default", "steady")
    assert worker is not None and worker.records[0].running
    await h.start_control_plane()

    async def renewed():
        again = await h.api.get("leases", NODE, "kube-node-lease", raw=True)
        return again["spec"]["renewTime"] > lease["spec"]["renewTime"]
    await eventually(renewed, 15, "the lease renewed by the new control plane")
    p = await h.get("steady")
    assert cstatus(p)["containerID"] == container_id and cstatus(p)["restartCount"] == 0 and ready(p)

    # Status flows again: a change made now is seen and reported.
    await h.api.delete("pods", "steady", "default", grace_period_seconds=1)

    async def gone():
        try:
            await h.get("steady")
        except NotFound:
            return True
        return False
    await eventually(gone, 15, "the pod deleted through the new control plane")


# -- the command line -----------------------------------------------------------------------------


async def test_cli_agent_logs_and_top(h, tmp_path):
    import os
    import signal

    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    state = tmp_path / "cli-agent"
    proc = await asyncio.create_subprocess_exec(
        PY, "-m", "gpufleet.cli.main", "agent", "--server", h.cp.url, "--token-file", str(h.tmp / "cp" / "join-token"),
        "--certificate-authority", str(h.tmp / "cp" / "pki" / "ca.crt"), "--name", "cli-node", "--gpus", "2",
        "--gpu-model", "A100-SXM4-40GB", "--gpu-memory", "40960", "--state-dir", str(state),
        "--labels", "gpufleet.io/rack=r9", "--taints", "dedicated=ml:NoSchedule", "--cpus", "4",
        "--memory", "8Gi", "--runtime", "process", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        start_new_session=True)
    try:
        async def registered():
            node = await h.api.get("nodes", "cli-node", raw=True)
            return node if any(c["type"] == "Ready" and c["status"] == "True"
                               for c in node["status"].get("conditions") or []) else None
        node = await eventually(registered, 30, "the CLI agent to register")
        assert node["metadata"]["labels"]["gpufleet.io/rack"] == "r9"
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "A100-SXM4-40GB"
        assert node["status"]["capacity"]["memory"] == "8388608Ki"
        assert node["spec"]["taints"] == [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]

        await h.pod("hello", "print('hello from the cli node'); import time; time.sleep(30)", node="cli-node",
                    container={"resources": {"limits": {"nvidia.com/gpu": 1}}})
        await h.wait_pod("hello", running, 20)
        env = {"KUBECONFIG": str(h.tmp / "cp" / "kubeconfig")}
        runner = CliRunner()

        async def logged():
            result = await asyncio.to_thread(runner.invoke, app, ["logs", "hello"], env=env)
            return result if "hello from the cli node" in result.output else None
        result = await eventually(logged, 10, "gpufleet logs")
        assert result.exit_code == 0

        top = await asyncio.to_thread(runner.invoke, app, ["top", "nodes"], env=env)
        assert top.exit_code == 0, top.output
        header, *rows = top.output.splitlines()
        assert header.split() == ["NAME", "CPU(cores)", "CPU(%)", "MEMORY(bytes)", "MEMORY(%)", "GPUS",
                                  "GPU-UTIL(%)", "GPU-MEMORY"]
        assert any(r.split()[0] == "cli-node" and r.split()[5] == "2" for r in rows), top.output
        pods = await asyncio.to_thread(runner.invoke, app, ["top", "pods", "-A"], env=env)
        assert pods.exit_code == 0, pods.output
        assert any(r.split()[:2] == ["default", "hello"] and r.split()[4] == "1" for r in pods.output.splitlines()), \
            pods.output
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 15)
    assert proc.returncode == 0, err.decode()
