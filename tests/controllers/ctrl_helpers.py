"""Helpers for the controller tests: factories, waiting, and a stand-in for the node agent.

A module with a unique name: a bare `import conftest` would clash with other test folders.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import time
from collections.abc import Callable
from typing import Any

from gpufleet.client.api import Client
from gpufleet.client.errors import Conflict, NotFound
from gpufleet.utils.clock import rfc3339

NS = "default"


async def eventually(
    fn: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05, what: str = ""  # noqa: ASYNC109
) -> Any:
    """Poll ``fn`` (sync or async) until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = fn()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or fn}: last value {last!r}")
        await asyncio.sleep(interval)


async def stays(fn: Callable[[], Any], duration: float, interval: float = 0.05) -> None:
    """Assert ``fn`` stays truthy for ``duration`` seconds."""
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        value = fn()
        if inspect.isawaitable(value):
            value = await value
        assert value, f"condition stopped holding: {value!r}"
        await asyncio.sleep(interval)


def container(image: str = "busybox:1.36", **extra: Any) -> dict[str, Any]:
    return {"name": "main", "image": image, **extra}


def template(labels: dict[str, str], image: str = "busybox:1.36", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"labels": labels}, "spec": {"containers": [container(image)], **spec}}


def replicaset(name: str, replicas: int, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    labels = labels or {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": template(labels), **spec},
    }


def deployment(name: str, replicas: int, image: str = "web:v1", **spec: Any) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": template(labels, image),
            **spec,
        },
    }


def job(name: str, **spec: Any) -> dict[str, Any]:
    tmpl = spec.pop("template", None) or {
        "spec": {"containers": [container()], "restartPolicy": spec.pop("restart_policy", "Never")}
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"template": tmpl, **spec},
    }


def pod(name: str, labels: dict[str, str] | None = None, *, node: str | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
        "spec": {"containers": [container()], **spec},
    }
    if node:
        body["spec"]["nodeName"] = node
    return body


def node(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": spec}


_ips = itertools.count(10)


async def set_pod_status(
    client: Client,
    name: str,
    *,
    phase: str = "Running",
    ready: bool | None = None,
    ip: str | None = None,
    restarts: int = 0,
    ns: str = NS,
    now: float | None = None,
) -> dict[str, Any]:
    """What a node agent would report for the pod."""
    for _ in range(10):
        current = await client.get("pods", name, ns, raw=True)
        status = dict(current.get("status") or {})
        status["phase"] = phase
        if ready is None:
            ready = phase == "Running"
        ts = rfc3339(now if now is not None else time.time())
        conds = [c for c in status.get("conditions") or [] if c.get("type") not in ("Ready", "ContainersReady")]
        old_ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        ready_text = "True" if ready else "False"
        transition = old_ready["lastTransitionTime"] if old_ready and old_ready.get("status") == ready_text else ts
        conds.append({"type": "Ready", "status": ready_text, "lastTransitionTime": transition})
        conds.append({"type": "ContainersReady", "status": ready_text, "lastTransitionTime": transition})
        status["conditions"] = conds
        if phase == "Running" or ip:
            status["podIP"] = ip or status.get("podIP") or f"10.0.0.{next(_ips) % 250 + 1}"
        terminated = {"exitCode": 0 if phase == "Succeeded" else 1, "reason": "Completed" if phase == "Succeeded"
                      else "Error", "startedAt": ts, "finishedAt": ts}
        state = {"terminated": terminated} if phase in ("Succeeded", "Failed") else {"running": {"startedAt": ts}}
        status["containerStatuses"] = [{
            "name": "main", "image": "busybox:1.36", "imageID": "", "ready": bool(ready),
            "restartCount": restarts, "state": state,
        }]
        current["status"] = status
        try:
            return await client.update_status(current, raw=True)
        except Conflict:
            continue
    raise AssertionError(f"could not update the status of pod {name}")


async def owned_pods(client: Client, owner_uid: str, *, active_only: bool = True) -> list[dict[str, Any]]:
    out = []
    for p in await client.list("pods", NS, raw=True):
        refs = p["metadata"].get("ownerReferences") or []
        if not any(r.get("uid") == owner_uid and r.get("controller") for r in refs):
            continue
        if active_only and (
            p["metadata"].get("deletionTimestamp") or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        ):
            continue
        out.append(p)
    return out


async def events_for(client: Client, name: str, reason: str | None = None) -> list[dict[str, Any]]:
    events = await client.list("events", NS, raw=True)
    return [
        e for e in events
        if e["involvedObject"].get("name") == name and (reason is None or e.get("reason") == reason)
    ]


class FakeAgent:
    """Stands in for node agents: pods that appear are reported Running (and Ready) after
    ``delay`` seconds; pods being deleted are finished off (as an agent does once the
    containers stopped). ``hold`` names pods to leave alone."""

    def __init__(self, client: Client, *, delay: float = 0.2, ready: bool | Callable[[dict], bool] = True,
                 node: str | None = None, interval: float = 0.05) -> None:
        self.client = client
        self.delay = delay
        self.ready = ready
        self.node = node
        self.interval = interval
        self.hold: set[str] = set()
        self._first_seen: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        # Every list of pods the agent saw, for checks over the whole run.
        self.samples: list[list[dict[str, Any]]] = []

    async def __aenter__(self) -> FakeAgent:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        while True:
            try:
                await self.step()
            except (Conflict, NotFound):
                pass
            await asyncio.sleep(self.interval)

    async def step(self) -> None:
        pods = list(await self.client.list("pods", NS, raw=True))
        self.samples.append(pods)
        now = time.monotonic()
        for p in pods:
            meta = p["metadata"]
            name = meta["name"]
            if name in self.hold:
                continue
            if meta.get("deletionTimestamp"):
                with contextlib.suppress(NotFound):
                    await self.client.delete("pods", name, NS, grace_period_seconds=0)
                continue
            status = p.get("status") or {}
            if status.get("phase") in ("Running", "Succeeded", "Failed"):
                continue
            first = self._first_seen.setdefault(meta["uid"], now)
            if now - first >= self.delay:
                ready = self.ready(p) if callable(self.ready) else self.ready
                await set_pod_status(self.client, name, phase="Running", ready=ready)


class Heartbeat:
    """A node agent's heartbeat: renews the node's Lease and posts Ready=True."""

    def __init__(self, client: Client, name: str, interval: float = 0.2) -> None:
        self.client = client
        self.name = name
        self.interval = interval
        self.task: asyncio.Task[None] | None = None

    async def register(self) -> None:
        await self.client.create(node(self.name))
        await self.client.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                  "metadata": {"name": self.name, "namespace": "kube-node-lease"},
                                  "spec": {"holderIdentity": self.name, "leaseDurationSeconds": 4,
                                           "renewTime": rfc3339(time.time(), micro=True)}})
        await self.post_ready("True")

    async def renew(self) -> None:
        for _ in range(5):
            lease = await self.client.get("leases", self.name, "kube-node-lease", raw=True)
            lease["spec"]["renewTime"] = rfc3339(time.time(), micro=True)
            try:
                await self.client.update(lease)
                return
            except Conflict:
                continue

    async def post_ready(self, status: str) -> None:
        for _ in range(5):
            n = await self.client.get("nodes", self.name, raw=True)
            now = rfc3339(time.time())
            n["status"] = {**(n.get("status") or {}), "conditions": [{
                "type": "Ready", "status": status, "reason": "KubeletReady" if status == "True" else "KubeletNotReady",
                "message": "ok", "lastHeartbeatTime": now, "lastTransitionTime": now}]}
            try:
                await self.client.update_status(n)
                return
            except Conflict:
                continue

    def start(self) -> None:
        async def loop() -> None:
            while True:
                await self.renew()
                await asyncio.sleep(self.interval)

        self.task = asyncio.create_task(loop())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None


async def fail_by_gpu(client: Client, name: str, *, ns: str = NS, gpu: int = 1,
                      node_name: str = "n1") -> dict[str, Any]:
    """What the node agent writes through pods/status when the pod's GPU fails (XID 79): the
    pod stopped, Failed, reason GPUUnhealthy, and condition DisruptionTarget saying which GPU."""
    message = f"GPU {gpu} (GPU-{gpu:04d}) on node {node_name} is unhealthy: XID 79 (GPU has fallen off the bus)"
    for _ in range(10):
        current = await client.get("pods", name, ns, raw=True)
        status = dict(current.get("status") or {})
        ts = rfc3339(time.time())
        conds = [c for c in status.get("conditions") or [] if c.get("type") not in ("Ready", "ContainersReady",
                                                                                    "DisruptionTarget")]
        conds += [{"type": "Ready", "status": "False", "lastTransitionTime": ts},
                  {"type": "ContainersReady", "status": "False", "lastTransitionTime": ts},
                  {"type": "DisruptionTarget", "status": "True", "reason": "GPUUnhealthy", "message": message,
                   "lastTransitionTime": ts}]
        status.update(phase="Failed", reason="GPUUnhealthy", message=message, conditions=conds)
        status["containerStatuses"] = [{
            "name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": ts, "finishedAt": ts}},
        } for c in current["spec"]["containers"]]
        current["status"] = status
        try:
            return await client.update_status(current, raw=True)
        except Conflict:
            continue
    raise AssertionError(f"could not update the status of pod {name}")
