"""What a pod worker holds: the context its agent gives it, and one record per container
(what the runtime runs for it, what it last reported, and its restart back-off)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpufleet.agent.backoff import RestartBackoff
from gpufleet.agent.resources import (
    GPUTable,
    PortTable,
)
from gpufleet.agent.runtime.base import (
    ContainerHandle,
    Runtime,
)
from gpufleet.client import Client, EventRecorder
from gpufleet.utils.clock import Clock

NORMAL, WARNING = "Normal", "Warning"

ObjectGetter = Callable[[str, str, str], Awaitable[dict[str, Any] | None]]


@dataclass
class WorkerContext:
    """What a pod worker needs from its agent; the agent fills it once."""

    client: Client
    runtime: Runtime
    recorder: EventRecorder
    clock: Clock
    node_name: str
    address: str
    state_dir: Path
    gpu_table: GPUTable
    port_table: PortTable
    get_object: ObjectGetter
    # -> the node's GPUs as the device plugin fingerprints them (objects with index, uuid, health, group)
    gpus: Callable[[], list[Any]]
    reserve: Callable[[list[int]], Awaitable[dict[str, str]]]
    node_allocatable: Callable[[], dict[str, Any]]
    describe_uid: Callable[[str], str]
    http: httpx.AsyncClient
    # Containers share the host's network (process, simulated): they listen on their host port.
    host_network: bool = True
    backoff_initial: float = 10.0
    backoff_cap: float = 300.0
    backoff_reset: float = 600.0
    probe_period_scale: float = 1.0
    on_change: Callable[[], None] = lambda: None
    # The node's volume manager (agent/volumes.py); None: volumes are not mounted.
    volumes: Any = None
    # How programs in pods reach the API server: the address /etc/hosts gives
    # kubernetes.default.svc, and the port (KUBERNETES_SERVICE_HOST/PORT). None: not offered.
    api_endpoint: Callable[[bool], tuple[str, int] | None] = lambda host_network: None
    # Where pod sandboxes keep their files.
    sandbox_root: Path | None = None
    # Where training checkpoint directories may be mounted from (see podspec.checkpoint_dir).
    checkpoint_roots: tuple[str, ...] = ("/var/tmp/gpufleet/checkpoints",)
    # -> the GPU index a pod is the agent's own validation pod for (gpuvalidation.py), else None.
    validation_gpu: Callable[[dict[str, Any]], int | None] = lambda pod: None
    # False while the node's pod network is being made: sandboxes wait for it.
    network_ready: Callable[[], bool] = lambda: True


@dataclass
class ContainerRecord:
    spec: dict[str, Any]
    init: bool
    backoff: RestartBackoff
    restart_count: int = 0
    # Started at least once (by this agent or, before a restart of the agent, by another).
    ran: bool = False
    # The image as pulled (what the status reports as imageID), and the last pull's failure.
    image_id: str = ""
    pull_error: str = ""
    handle: ContainerHandle | None = None
    container_id: str = ""
    running: bool = False
    stopping: bool = False
    state: dict[str, Any] = field(default_factory=dict)
    last_state: dict[str, Any] = field(default_factory=dict)
    last_exit: dict[str, Any] | None = None
    started_mono: float = 0.0
    exited_mono: float = 0.0
    # Monotonic time before which the container must not be (re)started.
    not_before: float | None = None
    current_delay: float = 0.0
    ready: bool = False
    started: bool = False
    gpus: list[int] = field(default_factory=list)
    tasks: list[asyncio.Task] = field(default_factory=list)
    old_handles: list[ContainerHandle] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.get("name", "")

