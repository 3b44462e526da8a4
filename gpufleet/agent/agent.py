"""The node agent: gpufleet's kubelet.

One per server. It registers the server as a Node with what it found (cpu, memory, GPUs),
proves it is alive by renewing a Lease, runs the pods bound to it through a container
runtime (one PodWorker each), and serves their logs and its usage over HTTP.

It talks to the control plane only through the client, and keeps working when the control
plane is away: containers keep running, writes are retried, and the informers list again
when the API is back.

registration.py holds the Node, its status and the Lease; agentlogs.py the logs and usage it
serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from gpufleet.agent import gpuvalidation, node
from gpufleet.agent import stats as stats_mod
from gpufleet.agent.agentlogs import LogsAndStatsMixin
from gpufleet.agent.agentstreams import StreamsMixin
from gpufleet.agent.apiproxy import ApiRelay
from gpufleet.agent.gpuhealth import HealthTracker
from gpufleet.agent.gpuhealthloop import GPUHealthMixin
from gpufleet.agent.httpserver import AgentHttpServer
from gpufleet.agent.localpath import LocalPathCleanup
from gpufleet.agent.podworker import PodWorker, WorkerContext
from gpufleet.agent.registration import RegistrationMixin
from gpufleet.agent.resources import GPUTable, PortTable
from gpufleet.agent.runtime.base import PodNetworkUnavailable, RecoveredContainer, RecoveredSandbox, Runtime
from gpufleet.api.gpuhealth import DEFAULT_POLICY, Policy
from gpufleet.client import (
    ApiError,
    Client,
    EventRecorder,
    Informer,
    NotFound,
    TransportError,
)
from gpufleet.utils.clock import REAL_CLOCK, Clock
from gpufleet.utils.files import private_dir, tighten_dir_files

log = logging.getLogger(__name__)


COMPONENT = "gpufleet-agent"

@dataclass
class AgentConfig:
    node_name: str
    state_dir: Path
    address: str = "127.0.0.1"
    # The agent's HTTP port (logs, stats, metrics); 0 picks a free one.
    port: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    # What the node offers; None measures the machine.
    cpus: float | None = None
    memory_bytes: int | None = None
    heartbeat_interval: float = 2.0
    lease_duration_seconds: int = 10
    # Node status is written when it changes, and at least this often.
    node_status_report_interval: float = 30.0
    backoff_initial: float = 10.0
    backoff_cap: float = 300.0
    backoff_reset: float = 600.0
    # Multiplies every probe delay and period (tests run probes in fractions of a second).
    probe_period_scale: float = 1.0
    # Longest wait between attempts to reach an unreachable API server.
    api_retry_max: float = 5.0
    # Stop the runtime's containers when the agent stops.
    close_runtime: bool = True
    # Serve the agent's port over TLS with a serving certificate from the API server, and
    # answer only its proxy tokens (servingcert.py); off, or against an --insecure server
    # (which issues none), the port is plain HTTP and answers anyone.
    secure_port: bool = True
    # The API server's address (host, port) for programs in pods (through a relay on the
    # node; see apiproxy.py); None: pods get no KUBERNETES_SERVICE_HOST.
    api_server: tuple[str, int] | None = None
    # How long to wait for the node's pod CIDR before using the runtime's default network.
    pod_cidr_wait: float = 15.0
    # Route other nodes' pod CIDRs via their InternalIP (needs root; off: the network does it).
    pod_routes: bool = True
    # Stop the node's pods when the agent stops (gpufleet up: the whole local cluster goes);
    # off, they run on and the next agent adopts them, as a kubelet's containers do.
    stop_pods_on_exit: bool = False
    stop_grace: float = 5.0
    # Trees training checkpoints may be mounted from into pods (<root>/<namespace>/...).
    checkpoint_roots: tuple[str, ...] = ("/var/tmp/gpufleet/checkpoints",)
    # GPU health (docs/gpu-health.md): how often the devices' health is polled (a declared
    # inventory file is re-read when its mtime moves), what each signal means, the validation
    # a fenced GPU must pass to return (None: the default for the device plugin), how long it
    # may take and how long after a failed one the next runs, and how many failures (fences
    # and failed validations) within the window hold a GPU out until an operator uncordons it.
    gpu_health_interval: float = 1.0
    gpu_health_policy: Policy = DEFAULT_POLICY
    gpu_validation_command: tuple[str, ...] | None = None
    gpu_validation_image: str | None = None
    gpu_validation_timeout: float = 120.0
    gpu_validation_backoff: float = 60.0
    gpu_failure_limit: int = 3
    gpu_failure_window: float = 3600.0


class NodeAgent(RegistrationMixin, GPUHealthMixin, LogsAndStatsMixin, StreamsMixin):
    def __init__(self, client: Client, runtime: Runtime, devices: Any, config: AgentConfig,
                 clock: Clock = REAL_CLOCK) -> None:
        self.client = client
        self.runtime = runtime
        self.devices = devices
        self.config = config
        self.clock = clock
        self.name = config.node_name
        self.state_dir = Path(config.state_dir)
        self.recorder = EventRecorder(client, COMPONENT, host=self.name, clock=clock)
        self.gpu_table = GPUTable()
        self.gpu_health = HealthTracker(config.gpu_health_policy, failure_limit=config.gpu_failure_limit,
                                        failure_window=config.gpu_failure_window,
                                        validation_backoff=config.gpu_validation_backoff)
        self._health_tasks: set[asyncio.Task] = set()
        self._node_dirty = asyncio.Event()
        self._devices_generation: int | None = None
        self._health_restored = False
        # Validation pods this run made: name -> (GPU index, the attempt's token), and what
        # wakes the validation waiting on each.
        self._validations: dict[str, tuple[int, str]] = {}
        self._validation_changed: dict[str, asyncio.Event] = {}
        self.port_table = PortTable(config.address)
        self.workers: dict[str, PodWorker] = {}
        self._uid_by_key: dict[str, str] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._gpus: list[Any] = []
        self._http: AgentHttpServer | None = None
        self._probe_http: httpx.AsyncClient | None = None
        self._pods: Informer | None = None
        self._node_informer: Informer | None = None
        self._local_path: LocalPathCleanup | None = None
        self._tasks: list[asyncio.Task] = []
        self._registered = asyncio.Event()
        self._need_register = True
        self._node_uid: str | None = None
        self._last_status: dict[str, Any] | None = None
        self._last_status_at = -1e18
        self._last_meta: dict[str, Any] | None = None
        self._lease_exists = False
        self._started_at = clock.now()
        self._stats_cache: tuple[float, stats_mod.NodeSample] | None = None
        self._stats_lock = asyncio.Lock()
        self.settings: node.NodeSettings | None = None
        self._ctx: WorkerContext | None = None
        # What an earlier run of the agent left running, by pod uid, until a worker takes it
        # or it is found to belong to no pod of this node and is stopped.
        self._recovered: dict[str, list[RecoveredContainer]] = {}
        self._recovered_sandboxes: dict[str, RecoveredSandbox] = {}
        self.orphans_reaped = asyncio.Event()
        # Set once pods may get sandboxes: the pod network is made (or not needed).
        self.network_ready = asyncio.Event()
        self._routes: Any = None
        self._relay: ApiRelay | None = None
        self._pod_gateway: str | None = None
        self.volumes: Any = None

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._http.port if self._http is not None else self.config.port

    @property
    def gpus(self) -> list[Any]:
        """The node's GPUs as last fingerprinted."""
        return list(self._gpus)

    @property
    def runtime_version(self) -> str:
        version = getattr(self.runtime, "version", "") or ""
        return f"{self.runtime.name}://{version}"

    async def start(self) -> None:
        # Tokens, logs and the pods' sandboxes: nobody else's business.
        tighten_dir_files(private_dir(self.state_dir))
        await self._recover()
        self.volumes = self._volume_manager()
        if self.config.api_server is not None:
            self._relay = ApiRelay(*self.config.api_server)
            await self._relay.listen(self.config.address)
        if not self._has_pod_network():
            self.network_ready.set()
        serving = None
        if self.config.secure_port:
            serving = await self._serving_credentials()
        self._http = AgentHttpServer(self, self.config.address, self.config.port, serving=serving)
        await self._http.start()
        self._gpus = await self._fingerprint()
        vm = psutil.virtual_memory()
        self.settings = node.NodeSettings(
            name=self.name,
            address=self.config.address,
            port=self._http.port,
            cpus=self.config.cpus if self.config.cpus is not None else float(psutil.cpu_count() or 1),
            memory_bytes=self.config.memory_bytes if self.config.memory_bytes is not None else vm.total,
            runtime_version=self.runtime_version,
            labels=dict(self.config.labels),
            taints=list(self.config.taints),
        )
        self._probe_http = httpx.AsyncClient(trust_env=False, follow_redirects=False, verify=False)
        self._ctx = WorkerContext(
            client=self.client,
            runtime=self.runtime,
            recorder=self.recorder,
            clock=self.clock,
            node_name=self.name,
            address=self.config.address,
            state_dir=self.state_dir,
            gpu_table=self.gpu_table,
            port_table=self.port_table,
            get_object=self._get_object,
            gpus=lambda: list(self._gpus),
            reserve=self._reserve,
            node_allocatable=self._allocatable,
            describe_uid=self._describe_uid,
            http=self._probe_http,
            host_network=self.runtime.name != "podman",
            backoff_initial=self.config.backoff_initial,
            backoff_cap=self.config.backoff_cap,
            backoff_reset=self.config.backoff_reset,
            probe_period_scale=self.config.probe_period_scale,
            on_change=self._invalidate_stats,
            volumes=self.volumes,
            api_endpoint=self._api_endpoint,
            network_ready=self.network_ready.is_set,
            checkpoint_roots=tuple(self.config.checkpoint_roots),
            sandbox_root=self.state_dir / "sandboxes",
            validation_gpu=self._validation_gpu,
        )
        informer_opts = {"backoff_initial": 0.2, "backoff_max": self.config.api_retry_max, "raw": True,
                         "strip_managed_fields": True}
        self._node_informer = Informer(self.client, "nodes", field_selector=f"metadata.name={self.name}",
                                       **informer_opts)
        self._node_informer.add_event_handler(on_delete=self._on_node_deleted)
        self._pods = Informer(self.client, "pods", field_selector=f"spec.nodeName={self.name}", **informer_opts)
        self._pods.add_event_handler(on_add=self._on_pod, on_update=lambda old, new: self._on_pod(new),
                                     on_delete=self._on_pod_deleted)
        self._tasks.append(asyncio.create_task(self._node_loop(), name=f"agent:{self.name}:node"))
        if hasattr(self.devices, "health_signals"):
            self._tasks.append(asyncio.create_task(self._gpu_health_loop(), name=f"agent:{self.name}:gpu-health"))
        if self._has_pod_network():
            self._tasks.append(asyncio.create_task(self._network_loop(), name=f"agent:{self.name}:network"))
        await self._node_informer.start()
        await self._pods.start()
        self._tasks.append(asyncio.create_task(self._reap_orphans(), name=f"agent:{self.name}:orphans"))
        # Directories of this node's local-path volumes go when their volumes are deleted.
        self._local_path = LocalPathCleanup(self.client, self.name, self.clock, recorder=self.recorder,
                                            backoff_max=self.config.api_retry_max)
        await self._local_path.start()
        log.info("agent %s: serving on %s:%d with the %s runtime and %d GPU(s)", self.name,
                 self.config.address, self._http.port, self.runtime.name, len(self._gpus))

    async def wait_registered(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        try:
            await asyncio.wait_for(self._registered.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        for task in [*self._tasks, *self._health_tasks]:
            task.cancel()
        for task in [*self._tasks, *self._health_tasks]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        for inf in (self._pods, self._node_informer):
            if inf is not None:
                await inf.stop()
        if self._local_path is not None:
            await self._local_path.stop()
        if self.config.stop_pods_on_exit:
            await asyncio.gather(*(w.shut_down(self.config.stop_grace) for w in list(self.workers.values())),
                                 return_exceptions=True)
        else:
            await asyncio.gather(*(w.cancel() for w in list(self.workers.values())), return_exceptions=True)
        self.workers.clear()
        if self.config.close_runtime:
            with contextlib.suppress(Exception):
                await self.runtime.close()
        # Events still in flight are best effort: an unreachable API must not hold up shutdown.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.recorder.flush(), 2.0)
        if self._http is not None:
            await self._http.stop()
        if self._probe_http is not None:
            await self._probe_http.aclose()
        if self._relay is not None:
            await self._relay.close()
        close = getattr(self.devices, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()

    # -- what an earlier run left -----------------------------------------------------

    async def _recover(self) -> None:
        """Everything the runtime still has for this node, before any pod is started: the
        GPUs of running containers are held by their pods from the first moment, so no new
        container can be handed a GPU a live process still holds."""
        try:
            sandboxes, containers = await self.runtime.recover(self.name)
        except Exception:
            log.exception("agent %s: recovering the runtime's containers failed", self.name)
            return
        for sb in sandboxes:
            self._recovered_sandboxes[sb.pod_uid] = sb
        for c in containers:
            self._recovered.setdefault(c.pod_uid, []).append(c)
            if c.state.state == "running" and c.gpus:
                self.gpu_table.acquire(c.pod_uid, c.gpus)
        if containers or sandboxes:
            running = sum(1 for c in containers if c.state.state == "running")
            log.info("agent %s: found %d container(s) (%d running) and %d sandbox(es) from an earlier run",
                     self.name, len(containers), running, len(sandboxes))

    async def _reap_orphans(self) -> None:
        """Once the pods bound here are known: stop what belongs to no pod of this node (a pod
        deleted, or replaced elsewhere, while the agent was away), and only then free its GPUs."""
        assert self._pods is not None
        while not await self._pods.wait_for_sync(30):
            log.info("agent %s: still waiting for the API to list this node's pods", self.name)
        orphans = [c for uid, cs in self._recovered.items() if uid not in self.workers for c in cs]
        sandboxes = [sb for uid, sb in self._recovered_sandboxes.items() if uid not in self.workers]
        self._recovered = {uid: cs for uid, cs in self._recovered.items() if uid in self.workers}
        self._recovered_sandboxes = {}
        for c in orphans:
            log.warning("agent %s: stopping %s/%s container %s (pod %s is not on this node any more)",
                        self.name, c.namespace, c.pod_name, c.name, c.pod_uid)
            try:
                if c.state.state == "running":
                    await self.runtime.stop(c.handle, 0)
                await self.runtime.remove(c.handle)
            except Exception:
                log.exception("agent %s: stopping an orphaned container failed; its GPUs stay held", self.name)
                continue
            if c.pod_uid not in self.workers:
                self.gpu_table.release(c.pod_uid)
        for sb in sandboxes:
            with contextlib.suppress(Exception):
                await self.runtime.remove_sandbox(sb.handle)
        if self.volumes is not None:
            with contextlib.suppress(Exception):
                await self.volumes.cleanup_orphans(set(self.workers))
        self.orphans_reaped.set()
        for w in list(self.workers.values()):
            w.wake()

    def _has_pod_network(self) -> bool:
        return ("pod-network" in getattr(self.runtime, "capabilities", ())
                and hasattr(self.runtime, "ensure_network"))

    async def _network_loop(self) -> None:
        """Make the pod network from the node's pod CIDR once it has one (a control plane
        without node IPAM leaves the runtime's default network after a while), then keep the
        routes to the other nodes' pod networks."""
        from gpufleet.agent import network

        assert self._node_informer is not None
        deadline = self.clock.monotonic() + self.config.pod_cidr_wait
        cidr = None
        while cidr is None and self.clock.monotonic() < deadline:
            node_obj = self._node_informer.get(self.name)
            cidr = ((node_obj or {}).get("spec") or {}).get("podCIDR")
            if cidr is None:
                await self.clock.sleep(0.1)
        if cidr is None:
            log.warning("agent %s: the node has no pod CIDR after %.0fs (no node IPAM in the control plane?); "
                        "pods use the runtime's default network, whose addresses are unique on this host only",
                        self.name, self.config.pod_cidr_wait)
        else:
            while True:
                try:
                    await self.runtime.ensure_network(network.network_name(self.name), cidr, self.name)
                    break
                except Exception as exc:
                    if isinstance(exc, PodNetworkUnavailable):
                        log.warning("agent %s: %s; pods use the runtime's default network, whose addresses are "
                                    "unique on this host only", self.name, exc)
                        self.recorder.record_nowait(
                            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "uid": self.name}},
                            "Warning", "PodNetworkUnavailable", str(exc))
                        cidr = None
                        break
                    log.warning("agent %s: making the pod network %s failed: %s; retrying", self.name, cidr, exc)
                    await self.clock.sleep(2.0)
        gateway = getattr(self.runtime, "pod_gateway", None)
        if gateway is not None:
            self._pod_gateway = await gateway()
        if self._relay is not None and self._pod_gateway:
            await self._relay.listen(self._pod_gateway)
        self.network_ready.set()
        for w in list(self.workers.values()):
            w.wake()
        if cidr is None or not self.config.pod_routes:
            return
        routes = network.RouteTable()
        self._routes = routes
        while True:
            try:
                nodes = await self.client.list("nodes", raw=True)
                await routes.sync(network.desired_routes(nodes, self.name, network.local_addresses()))
            except (TransportError, ApiError) as exc:
                log.info("agent %s: listing nodes for pod routes failed: %s", self.name, exc)
            await self.clock.sleep(10.0)

    def _volume_manager(self) -> Any:
        # A runtime that mounts nothing (or only pretends, as the simulated one) needs no
        # volumes made on the node.
        if "mounts" not in getattr(self.runtime, "capabilities", ()) or self.runtime.name == "simulated":
            return None
        try:
            from gpufleet.agent.volumes import VolumeManager
        except ImportError:
            return None
        # 0755: containers running as other users must reach their volumes' directories.
        return VolumeManager(self.client, self.name, self.state_dir / "volumes", self.clock,
                             get_object=self._get_object, node_allocatable=self._allocatable, dir_mode=0o755)

    def _api_endpoint(self, host_network: bool) -> tuple[str, int] | None:
        if self._relay is None:
            return None
        address = self.config.address if host_network or not self._pod_gateway else self._pod_gateway
        port = self._relay.port(address)
        return (address, port) if port else None

    def _describe_uid(self, uid: str) -> str:
        w = self.workers.get(uid)
        if w is not None:
            return w.key
        left = self._recovered.get(uid)
        if left:
            return f"{left[0].namespace}/{left[0].pod_name} (a process from before the agent restarted, being stopped)"
        return uid

    async def _get_object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.client.get(kind, name, namespace, raw=True)
        except NotFound:
            return None

    # -- registration and heartbeat -------------------------------------------------------

    def _on_node_deleted(self, obj: Any) -> None:
        log.warning("agent %s: the Node object was deleted; registering again", self.name)
        self._need_register = True
        self._lease_exists = False

    def _on_pod(self, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid", "")
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if (pod.get("spec") or {}).get("nodeName") != self.name:
            self._on_pod_deleted(pod)
            return
        if gpuvalidation.is_validation_pod(pod) and meta.get("namespace") == gpuvalidation.NAMESPACE:
            if not self._validation_pod_seen(pod):
                return
        previous = self._uid_by_key.get(key)
        if previous and previous != uid:
            old = self.workers.get(previous)
            if old is not None:
                old.remove()
        self._uid_by_key[key] = uid
        worker = self.workers.get(uid)
        if worker is not None:
            worker.update(pod)
            return
        if uid in self._finished:
            return
        assert self._ctx is not None
        sandbox = self._recovered_sandboxes.pop(uid, None)
        worker = PodWorker(self._ctx, pod, recovered=self._recovered.pop(uid, None),
                           sandbox=sandbox.handle if sandbox is not None else None)
        self.workers[uid] = worker
        worker.start()
        assert worker._task is not None
        worker._task.add_done_callback(lambda _t, uid=uid: self._worker_done(uid))

    def _on_pod_deleted(self, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid", "")
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        worker = self.workers.get(uid)
        if worker is not None:
            worker.remove()
        if self._uid_by_key.get(key) == uid:
            del self._uid_by_key[key]

    def _worker_done(self, uid: str) -> None:
        worker = self.workers.pop(uid, None)
        if worker is not None and (worker.removed or worker.deleted):
            self._finished[uid] = None
            while len(self._finished) > 10_000:
                self._finished.popitem(last=False)
        self._invalidate_stats()

    def worker_for(self, namespace: str, name: str) -> PodWorker | None:
        uid = self._uid_by_key.get(f"{namespace}/{name}")
        return self.workers.get(uid) if uid else None
