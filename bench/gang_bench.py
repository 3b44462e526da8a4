"""Gang scheduling against Ray: the time from submitting a 64-GPU job to all its pods bound
and to all of them running, on gpufleet and on Ray 2.60, in one run on one machine.

    .venv/bin/python bench/gang_bench.py                 # 3 runs of each, about 2-3 minutes on 2 cores
    .venv/bin/python bench/gang_bench.py --quick         # 1 run of each, about a minute
    .venv/bin/python bench/gang_bench.py --skip-ray --runs 5
    .venv/bin/python bench/gang_bench.py --skip-ray --workloads podgroup --compare-src ../main   # before/after

gpufleet: the real `gpufleet server` (SQLite, scheduler, controllers) and 8 `gpufleet agent`
processes with the simulated runtime, 8 declared GPUs each, as subprocesses. Per run, each
of these, in a fresh namespace:

    pods         64 pods of 1 GPU, no group: the scheduler places them one by one
    podgroup     a PodGroup (scheduling.x-k8s.io/v1alpha1, minMember 64) and its 64 pods,
                 labelled scheduling.x-k8s.io/pod-group: all placed or none
    pytorchjob   one PyTorchJob (kubeflow.org/v1), 1 master + 63 workers of 1 GPU, and
                 1 master + 7 workers of 8 GPUs (nprocPerNode 8)

The PodGroup and PyTorchJob rows run only where the server serves those kinds (asked through
discovery); otherwise the output says so. Timed from just before the first create request, to
the arrival on a watch (opened and confirmed before that) of the event showing the last pod
with spec.nodeName set ("bound"), and with status.phase Running ("running"). Also from the
watch's event of the last member created (by the bench, or by the PyTorchJob controller) to
that of the last member bound, and the spread from the first member bound to the last (a
gang bound in one transaction: its members' events arrive together).

--compare-src DIR runs a second gpufleet cluster from another source tree (a checkout of
main, say) beside the first, the same workloads interleaved run by run, and prints the two
side by side: a change's before and after from one run on one machine.

Ray (bench/ray_peer.py, in Ray's own virtual environment, created on first use): a
`ray.cluster_utils.Cluster` of a head node without GPUs and 8 nodes with num_gpus=8. Per run:
placement_group(64 x {"GPU": 1}, PACK).ready() ("bound"), then 64 actors with num_gpus=1, one
per bundle, until every one answered a ping ("running").

Both clusters are started first and stay up; their runs then alternate, so a burst of other
work on a shared machine lands on both alike. Start-up times are printed apart, never part of
the figures. Figures are medians over --runs; ratios are Ray / gpufleet (above 1: gpufleet
is faster). Printed, never asserted. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from gpufleet.client.api import Client

if __package__:
    from ._pg import die_with_parent
    from .cluster_bench import Cluster, _tail, source_env, wait_nodes_ready
else:
    from _pg import die_with_parent
    from cluster_bench import Cluster, _tail, source_env, wait_nodes_ready

perf = time.perf_counter
HERE = Path(__file__).resolve().parent
RAY_VERSION = "2.60.0"
DEFAULT_RAY_VENV = Path("~/.cache/gpufleet-bench") / f"ray-{RAY_VERSION}"
GPU_MODEL = "NVIDIA H100 80GB HBM3"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
GPU_INDICES_ANNOTATION = "gpufleet.io/gpu-indices"
# Creates in flight at once: within the client's keep-alive pool (20), so runs after the first
# reuse connections instead of paying a TLS handshake per pod.
SUBMIT_CONCURRENCY = 16
_LISTENING = re.compile(rb"API server listening on (https?://\S+)")


# --- Ray's side ------------------------------------------------------------------------------


def ensure_ray_venv(venv: Path, version: str = RAY_VERSION) -> Path:
    """The Python of a virtual environment holding ray==version, made on first use. Ray is a
    benchmark peer: it never enters the project's own environment."""
    python = venv / "bin" / "python"
    if python.exists():
        found = subprocess.run([str(python), "-c", "import ray; print(ray.__version__)"],
                               capture_output=True, text=True, env=_ray_env())
        if found.returncode == 0 and found.stdout.strip() == version:
            return python
    print(f"installing ray=={version} into {venv} (once; about a minute) ...", flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    f"ray=={version}"], check=True)
    return python


def _ray_env() -> dict[str, str]:
    env = dict(os.environ)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # The project venv's packages must not leak into Ray's interpreter.
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    return env


class RayPeer:
    """bench/ray_peer.py --serve in Ray's venv: a cluster kept up, one run per request."""

    def __init__(self, python: Path, log_path: Path, args: argparse.Namespace) -> None:
        self.python = python
        self.log_path = log_path
        self.args = args
        self.proc: asyncio.subprocess.Process | None = None
        self.info: dict[str, Any] = {}
        self._log = open(log_path, "wb")  # closed in stop()
        self._busy = False

    async def start(self) -> dict[str, Any]:
        cmd = [str(self.python), str(HERE / "ray_peer.py"), "--serve", "--nodes", str(self.args.nodes),
               "--gpus-per-node", str(self.args.gpus_per_node), "--strategy", self.args.ray_strategy]
        # A session of its own: Ray's many processes can then be reached as one group.
        self.proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=self._log,
            env=_ray_env(), start_new_session=True, preexec_fn=die_with_parent)
        self.info = await self._event("ready", within=180)
        return self.info

    async def run(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self._busy = True
        self.proc.stdin.write(b"run\n")
        await self.proc.stdin.drain()
        event = await self._event("run", within=self.args.timeout + 130)
        self._busy = False
        return event

    async def _event(self, kind: str, within: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + within
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = await asyncio.wait_for(self.proc.stdout.readline(), max(remaining, 0.01))
            except TimeoutError:
                raise RuntimeError(f"Ray: no {kind!r} answer within {within:.0f} s:\n"
                                   f"{_tail(self.log_path)}") from None
            if not line:
                raise RuntimeError(f"Ray's side ended before its {kind!r} answer:\n{_tail(self.log_path)}")
            try:
                event = json.loads(line)
            except ValueError:
                continue  # Ray's own chatter on stdout
            if not isinstance(event, dict) or "event" not in event:
                continue
            if event["event"] == kind:
                return event
            raise RuntimeError(f"Ray: expected {kind!r}, got {event}")

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            self._log.close()
            return
        if proc.returncode is None and proc.stdin is not None:
            if self._busy:
                # Cut short (an error or Ctrl-C mid-run): a quit would wait for the run to end.
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
            else:
                with contextlib.suppress(Exception):
                    proc.stdin.write(b"quit\n")
                    await proc.stdin.drain()
                    proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 60)
        # Whatever Ray left behind in the session (a hung shutdown, a killed driver).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode is None:
            await proc.wait()
        self._log.close()


# --- gpufleet's side -------------------------------------------------------------------------


class SimCluster(Cluster):
    """cluster_bench's cluster, with the server as `gpufleet up` sets it up (TLS, tokens, RBAC;
    no gateway, which nothing here uses) and agents that join with the join token, declaring
    8 GPUs each on the chosen runtime."""

    server_args = ("--gateway-port", "-1")

    def __init__(self, root: Path, runtime: str) -> None:
        super().__init__(root)
        self.runtime = runtime

    def start_agent(self, name: str, gpus: int = 8) -> None:
        state = self.root / name
        state.mkdir(parents=True)
        server_dir = self.root / "server"
        cmd = [sys.executable, "-m", "gpufleet.cli.main", "agent", "--kubeconfig", str(server_dir / "kubeconfig"),
               "--name", name, "--gpus", str(gpus), "--gpu-model", GPU_MODEL, "--runtime", self.runtime,
               # What a GPU server offers, so cpu and memory requests never decide the placement.
               "--cpus", "64", "--memory", "512Gi", "--state-dir", str(state)]
        if (server_dir / "join-token").exists():
            cmd += ["--token-file", str(server_dir / "join-token")]
        with open(state / "agent.log", "wb") as log:
            self.agents[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                                 start_new_session=True, preexec_fn=die_with_parent)


@contextlib.contextmanager
def sim_cluster(nodes: int, gpus: int, runtime: str, src: str | None = None) -> Iterator[SimCluster]:
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-gang-"))
    c = SimCluster(root, runtime)
    c.env = source_env(src)
    try:
        c.start_server()
        for i in range(nodes):
            c.start_agent(f"node-{i}", gpus)
        yield c
    finally:
        c.close()
        shutil.rmtree(root, ignore_errors=True)


def _container(name: str, gpus: int) -> dict[str, Any]:
    return {
        "name": name, "image": "busybox", "command": ["sleep", "100000"],
        "resources": {"requests": {"cpu": str(gpus), "memory": f"{4 * gpus}Gi", "nvidia.com/gpu": str(gpus)},
                      "limits": {"nvidia.com/gpu": str(gpus)}},
    }


def pod(name: str, ns: str, group: str | None = None) -> dict[str, Any]:
    labels = {"app": "gang-bench"}
    if group:
        labels[POD_GROUP_LABEL] = group
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                 "containers": [_container("main", 1)]},
    }


def pod_group(name: str, ns: str, size: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"minMember": size, "scheduleTimeoutSeconds": 120},
    }


def pytorch_job(name: str, ns: str, workers: int, gpus_each: int) -> dict[str, Any]:
    """Master + workers: `workers` pods in all, each with gpus_each GPUs (kubeflow's shape)."""

    def replica(count: int) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": "OnFailure",
                "template": {"metadata": {"labels": {"app": "gang-bench"}},
                             "spec": {"terminationGracePeriodSeconds": 0,
                                      "containers": [_container("pytorch", gpus_each)]}}}

    spec: dict[str, Any] = {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(workers - 1)}}
    if gpus_each > 1:
        spec["nprocPerNode"] = str(gpus_each)
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


@dataclass
class Workload:
    key: str
    label: str
    pods: int                     # how many pods to wait for
    build: Any                    # (namespace) -> (list of objects to create first, pods to create at once)


def workloads(size: int, gpus_per_node: int, served: dict[str, bool]) -> tuple[list[Workload], list[str]]:
    out = [Workload("pods", f"{size} pods x 1 GPU, no group", size,
                    lambda ns: ([], [pod(f"w-{i:03d}", ns) for i in range(size)]))]
    notes = []
    if served["podgroup"]:
        out.append(Workload("podgroup", f"PodGroup, minMember {size}, {size} pods x 1 GPU", size,
                            lambda ns: ([pod_group("gang", ns, size)],
                                        [pod(f"w-{i:03d}", ns, "gang") for i in range(size)])))
    else:
        notes.append("gang path unavailable: the server does not serve PodGroup "
                     "(scheduling.x-k8s.io/v1alpha1); measured plain pods only")
    if served["pytorchjob"]:
        out.append(Workload("pytorchjob-1", f"PyTorchJob, {size} x 1 GPU", size,
                            lambda ns: ([pytorch_job("train", ns, size, 1)], [])))
        nodes = size // gpus_per_node
        out.append(Workload("pytorchjob-8", f"PyTorchJob, {nodes} x {gpus_per_node} GPUs", nodes,
                            lambda ns: ([pytorch_job("train", ns, nodes, gpus_per_node)], [])))
    else:
        notes.append("PyTorchJob unavailable: the server does not serve kubeflow.org/v1 PyTorchJob")
    return out, notes


async def serves(client: Client, group: str, version: str, kind: str) -> bool:
    """Whether the server lists `kind` in its discovery document, and this client knows it."""
    resp = await client.raw_request("GET", f"/apis/{group}/{version}", raise_for_status=False)
    if resp.status != 200:
        return False
    resources = json.loads(resp.body).get("resources") or []
    if not any(r.get("kind") == kind for r in resources):
        return False
    return client.registry.by_api_version_kind(f"{group}/{version}", kind) is not None


@dataclass
class Tracker:
    """Per pod, when the watch first showed it bound and running."""

    expected: int
    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)
    placement: dict[str, tuple[str, str]] = field(default_factory=dict)
    all_bound: asyncio.Event = field(default_factory=asyncio.Event)
    all_running: asyncio.Event = field(default_factory=asyncio.Event)
    opened: asyncio.Event = field(default_factory=asyncio.Event)

    def see(self, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"]["name"]
        self.created.setdefault(name, now)
        node = (obj.get("spec") or {}).get("nodeName")
        if node and name not in self.bound:
            self.bound[name] = now
        if node:
            indices = (obj["metadata"].get("annotations") or {}).get(GPU_INDICES_ANNOTATION, "")
            self.placement[name] = (node, indices)
        if (obj.get("status") or {}).get("phase") == "Running" and name not in self.running:
            self.running[name] = now
        if len(self.bound) >= self.expected:
            self.all_bound.set()
        if len(self.running) >= self.expected:
            self.all_running.set()


async def _watch(client: Client, ns: str, rv: str, tracker: Tracker) -> None:
    # sendInitialEvents makes the server answer at once with a bookmark, which proves the
    # stream is open before the clock starts.
    params = {"watch": "true", "resourceVersion": rv, "sendInitialEvents": "true",
              "allowWatchBookmarks": "true", "timeoutSeconds": "3600"}
    async for line in client.transport.stream("GET", f"/api/v1/namespaces/{ns}/pods", params):
        now = perf()
        if not line.strip():
            continue
        ev = json.loads(line)
        if ev.get("type") == "BOOKMARK":
            tracker.opened.set()
            continue
        if ev.get("type") == "ERROR":
            raise RuntimeError(f"watch: {ev.get('object')}")
        if ev.get("type") in ("ADDED", "MODIFIED"):
            tracker.see(ev["object"], now)


async def gpufleet_run(client: Client, w: Workload, ns: str, within: float) -> dict[str, Any]:
    await client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, raw=True)
    first, pods = w.build(ns)
    listed = await client.list("pods", ns, raw=True)
    tracker = Tracker(w.pods)
    watcher = asyncio.create_task(_watch(client, ns, listed.resource_version, tracker))
    try:
        opened = asyncio.create_task(tracker.opened.wait())
        await asyncio.wait([opened, watcher], timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if watcher.done():
            watcher.result()
        if not tracker.opened.is_set():
            raise RuntimeError(f"the watch on {ns} did not open within 30 s")
        t0 = perf()
        for obj in first:
            await client.create(obj, raw=True)
        gate = asyncio.Semaphore(SUBMIT_CONCURRENCY)

        async def submit(obj: dict[str, Any]) -> None:
            async with gate:
                await client.create(obj, raw=True)

        await asyncio.gather(*(submit(p) for p in pods))
        t_submitted = perf() - t0
        done = asyncio.create_task(tracker.all_running.wait())
        await asyncio.wait([done, watcher], timeout=within, return_when=asyncio.FIRST_COMPLETED)
        if watcher.done():
            watcher.result()
        if not tracker.all_running.is_set():
            raise RuntimeError(f"{w.label}: {len(tracker.bound)} of {w.pods} pods bound, "
                               f"{len(tracker.running)} running after {within:.0f} s")
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
    gpus = {(node, i) for node, idx in tracker.placement.values() for i in idx.split(",") if i}
    return {
        "submitted_s": t_submitted,
        "first_bound_s": min(tracker.bound.values()) - t0,
        "bound_s": max(tracker.bound.values()) - t0,
        "bound_after_submitted_s": max(tracker.bound.values()) - t0 - t_submitted,
        # From the watch's event of the last member created (by the bench or a controller)
        # to its event of the last member bound; and from the first bound to the last.
        "bound_after_last_created_s": max(tracker.bound.values()) - max(tracker.created.values()),
        "bind_spread_s": max(tracker.bound.values()) - min(tracker.bound.values()),
        "running_s": max(tracker.running.values()) - t0,
        "nodes_used": len({node for node, _ in tracker.placement.values()}),
        "distinct_gpus": len(gpus),
    }


async def clean_namespace(client: Client, ns: str, within: float = 120) -> None:
    """Delete the run's namespace and wait until its pods are gone, so every GPU is free for
    the next run (the figures never include this)."""
    await client.delete("namespaces", ns)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not len(await client.list("pods", ns, raw=True)):
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the pods of namespace {ns} were not gone within {within:.0f} s")


# --- the whole run ---------------------------------------------------------------------------


def cpu_busy(seconds: float) -> float:
    """Cores in use on the whole machine over `seconds` (both clusters idle, plus anything else)."""
    before = psutil.cpu_times()
    time.sleep(seconds)
    after = psutil.cpu_times()
    busy = sum(getattr(after, f) - getattr(before, f) for f in ("user", "system", "nice", "irq", "softirq"))
    return busy / seconds


async def run(args: argparse.Namespace, ray_python: Path | None) -> dict[str, Any]:
    size = args.nodes * args.gpus_per_node
    result: dict[str, Any] = {"gpufleet": {}, "compare": {}, "ray": [], "notes": [], "startup": {}}
    with contextlib.ExitStack() as stack:
        c = client = compare = None
        if not args.skip_gpufleet:
            print(f"gpufleet: server + {args.nodes} agents ({args.runtime} runtime) ...", flush=True)
            t = perf()
            c = stack.enter_context(sim_cluster(args.nodes, args.gpus_per_node, args.runtime))
            client = c.client()
            await wait_nodes_ready(client, list(c.agents), within=120)
            result["startup"]["gpufleet"] = perf() - t
            if args.compare_src:
                print(f"gpufleet from {args.compare_src}: server + {args.nodes} agents ...", flush=True)
                t = perf()
                cc = stack.enter_context(sim_cluster(args.nodes, args.gpus_per_node, args.runtime,
                                                     args.compare_src))
                compare = cc.client()
                await wait_nodes_ready(compare, list(cc.agents), within=120)
                result["startup"]["gpufleet (compared)"] = perf() - t
            served = {
                "podgroup": await serves(client, "scheduling.x-k8s.io", "v1alpha1", "PodGroup"),
                "pytorchjob": await serves(client, "kubeflow.org", "v1", "PyTorchJob"),
            }
            wls, notes = workloads(size, args.gpus_per_node, served)
            if args.workloads:
                wanted = set(args.workloads.split(","))
                wls = [w for w in wls if w.key in wanted]
            result["notes"] += notes
            result["labels"] = {w.key: w.label for w in wls}
        peer = None
        try:
            if ray_python is not None:
                print(f"Ray {RAY_VERSION}: head + {args.nodes} nodes x {args.gpus_per_node} GPUs ...", flush=True)
                log_dir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-ray-"))
                stack.callback(shutil.rmtree, log_dir, True)
                peer = RayPeer(ray_python, log_dir / "ray_peer.log", args)
                try:
                    info = await peer.start()
                except RuntimeError as exc:
                    print(f"  Ray did not start: {exc}", flush=True)
                    result["notes"].append(f"Ray did not start, so there are no Ray figures: {exc}")
                    await peer.stop()
                    peer = None
                else:
                    result["startup"]["ray"] = info["cluster_startup_s"]
                    result["ray_info"] = info
            result["idle_cores"] = await asyncio.to_thread(cpu_busy, 3.0)
            result["load_before"] = os.getloadavg()
            for i in range(args.runs):
                if client is not None:
                    for w in list(wls):
                        ns = f"gang-{w.key}-{i}"
                        print(f"run {i + 1}/{args.runs}: gpufleet, {w.label} ...", flush=True)
                        try:
                            r = await gpufleet_run(client, w, ns, args.timeout)
                        except Exception as exc:
                            # One workload that fails must not cost the others their figures.
                            print(f"  failed: {exc}", flush=True)
                            result["notes"].append(f"{w.label}: failed, left out of later runs: {exc}")
                            wls.remove(w)
                        else:
                            print(f"  bound {r['bound_s']:.3f} s, running {r['running_s']:.3f} s, "
                                  f"last created -> all bound {r['bound_after_last_created_s']:.3f} s, "
                                  f"first -> last bound {r['bind_spread_s']:.3f} s", flush=True)
                            result["gpufleet"].setdefault(w.key, []).append(r)
                        await clean_namespace(client, ns)
                        if compare is None or w not in wls:
                            continue
                        print(f"run {i + 1}/{args.runs}: gpufleet from {args.compare_src}, {w.label} ...", flush=True)
                        try:
                            r = await gpufleet_run(compare, w, ns, args.timeout)
                        except Exception as exc:
                            print(f"  failed: {exc}", flush=True)
                            result["notes"].append(f"{w.label} from {args.compare_src}: failed: {exc}")
                        else:
                            print(f"  bound {r['bound_s']:.3f} s, running {r['running_s']:.3f} s, "
                                  f"last created -> all bound {r['bound_after_last_created_s']:.3f} s, "
                                  f"first -> last bound {r['bind_spread_s']:.3f} s", flush=True)
                            result["compare"].setdefault(w.key, []).append(r)
                        await clean_namespace(compare, ns)
                if peer is not None:
                    print(f"run {i + 1}/{args.runs}: Ray, {size} bundles + {size} actors ...", flush=True)
                    try:
                        r = await peer.run()
                    except RuntimeError as exc:
                        print(f"  failed: {exc}", flush=True)
                        result["notes"].append(f"Ray: a run failed, no more Ray runs: {exc}")
                        await peer.stop()
                        peer = None
                    else:
                        print(f"  bound {r['bound_s']:.3f} s, running {r['running_s']:.3f} s", flush=True)
                        result["ray"].append(r)
            result["load_after"] = os.getloadavg()
        finally:
            if peer is not None:
                await peer.stop()
            if client is not None:
                await client.close()
            if compare is not None:
                await compare.close()
    return result


# --- output ----------------------------------------------------------------------------------


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _ratio(ray: float | None, ours: float | None) -> str:
    if ray is None or not ours:
        return "-"
    return f"{ray / ours:.2f}"


def render(result: dict[str, Any], args: argparse.Namespace) -> str:
    size = args.nodes * args.gpus_per_node
    ray_bound, ray_running = median(result["ray"], "bound_s"), median(result["ray"], "running_s")
    lines = [
        f"Submit -> all bound and -> all running, {args.nodes} nodes x {args.gpus_per_node} GPUs, "
        f"a {size}-GPU job; seconds, median of {args.runs} run(s); ratio = Ray / gpufleet",
        "",
        "| system, workload | submitted | first bound | all bound | all bound - submitted | all running "
        "| Ray/gpufleet bound | Ray/gpufleet running | nodes used | distinct GPUs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    labels = result.get("labels", {})
    for key, runs in result["gpufleet"].items():
        b, r = median(runs, "bound_s"), median(runs, "running_s")
        lines.append(
            f"| gpufleet ({args.runtime}), {labels.get(key, key)} | {_s(median(runs, 'submitted_s'))} "
            f"| {_s(median(runs, 'first_bound_s'))} | {_s(b)} | {_s(median(runs, 'bound_after_submitted_s'))} "
            f"| {_s(r)} | {_ratio(ray_bound, b)} "
            f"| {_ratio(ray_running, r)} | {min(x['nodes_used'] for x in runs)} "
            f"| {min(x['distinct_gpus'] for x in runs)} |")
    if result["ray"]:
        lines.append(
            f"| Ray {RAY_VERSION}, placement group {size} x {{GPU: 1}} {args.ray_strategy} + {size} actors "
            f"| - | - | {_s(ray_bound)} | - | {_s(ray_running)} | | "
            f"| {min(x['nodes_used'] for x in result['ray'])} | {min(x['distinct_gpus'] for x in result['ray'])} |")
    if result.get("compare"):
        lines += ["", f"This tree against {args.compare_src}, same runs interleaved; seconds, median; "
                      "ratio = compared / this tree (above 1: this tree is faster)", "",
                  "| workload | figure | this tree | compared | ratio |", "|---|---|---|---|---|"]
        figures = [("bound_after_last_created_s", "last member created -> all bound"),
                   ("bind_spread_s", "first bound -> last bound"),
                   ("bound_after_submitted_s", "all bound - submitted"), ("bound_s", "all bound")]
        for key, runs in result["gpufleet"].items():
            other = result["compare"].get(key) or []
            for fig, what in figures:
                a, b = median(runs, fig), median(other, fig)
                lines.append(f"| {labels.get(key, key)} | {what} | {_s(a)} | {_s(b)} | {_ratio(b, a)} |")
    lines += ["", "Per run (all bound / all running, s):"]
    for key, runs in result["gpufleet"].items():
        lines.append(f"  gpufleet {key:<14} " + "  ".join(f"{x['bound_s']:.3f}/{x['running_s']:.3f}" for x in runs))
    for key, runs in result.get("compare", {}).items():
        lines.append(f"  compared {key:<14} " + "  ".join(f"{x['bound_s']:.3f}/{x['running_s']:.3f}" for x in runs))
    if result["ray"]:
        lines.append(f"  Ray {'':<19} " + "  ".join(f"{x['bound_s']:.3f}/{x['running_s']:.3f}" for x in result["ray"]))
    st = result["startup"]
    lines += ["", "Cluster start-up, not in the figures: "
              + ", ".join(f"{k} {v:.1f} s" for k, v in st.items())]
    for note in result["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="runs of each workload; medians are printed")
    p.add_argument("--quick", action="store_true", help="one run of each (same as --runs 1)")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--runtime", default="simulated", choices=["simulated", "process"],
                   help="the gpufleet agents' runtime (process: each pod a real `sleep`)")
    p.add_argument("--ray-strategy", default="PACK", choices=["PACK", "SPREAD"],
                   help="the placement group's strategy")
    p.add_argument("--ray-venv", default=str(DEFAULT_RAY_VENV),
                   help=f"virtual environment for ray=={RAY_VERSION}, created if missing")
    p.add_argument("--timeout", type=float, default=120, help="seconds one run may take")
    p.add_argument("--skip-ray", action="store_true")
    p.add_argument("--skip-gpufleet", action="store_true")
    p.add_argument("--workloads", help="comma-separated keys of the workloads to run "
                   "(pods, podgroup, pytorchjob-1, pytorchjob-8; default: all)")
    p.add_argument("--compare-src", help="also run a second gpufleet cluster from this source tree (its "
                   "PYTHONPATH), the same workloads interleaved, and print the two side by side "
                   "(e.g. a checkout of main: before and after a change, in one run)")
    p.add_argument("--json", help="also write the raw figures to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.runs = 1
    return args


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    mem = psutil.virtual_memory().total / 2**30
    print("gpufleet gang-scheduling benchmark, against Ray")
    print(f"  date       {dt.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"  machine    {platform.machine()}, {os.cpu_count()} CPUs, {mem:.0f} GiB, {platform.platform()}")
    print(f"  python     {platform.python_version()}")
    print(f"  load avg   {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    t = perf()
    try:
        ray_python = None
        if not args.skip_ray:
            try:
                ray_python = ensure_ray_venv(Path(args.ray_venv).expanduser())
            except (OSError, subprocess.CalledProcessError) as exc:
                print(f"  Ray could not be installed ({exc}); measuring gpufleet alone", flush=True)
        result = asyncio.run(run(args, ray_python))
    except KeyboardInterrupt:
        warnings.filterwarnings("ignore", category=RuntimeWarning)
        print("\ninterrupted; both clusters stopped", file=sys.stderr)
        return 130
    print(f"  wall time  {perf() - t:.0f} s")
    print(f"  busy       {result['idle_cores']:.2f} cores in use on the machine with both clusters up and idle, "
          "before the runs")
    print(f"  load avg   {' '.join(f'{x:.2f}' for x in result['load_before'])} before the runs, "
          f"{' '.join(f'{x:.2f}' for x in result.get('load_after', ()))} after")
    if "ray_info" in result:
        info = result["ray_info"]
        print(f"  ray        {info['ray_version']} (Python {info['python']}), strategy {info['strategy']}")
    print()
    print(render(result, args))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
