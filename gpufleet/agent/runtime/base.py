"""The container runtime interface the node agent drives: process, podman, simulated.

The agent decides *what* runs (which containers, when to restart, which GPUs and ports);
a runtime only knows *how* to start, watch, signal and inspect one container. Every runtime
must behave the same from the agent's point of view, so the rest of the system cannot tell
a simulated node from a real one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol


@dataclass(frozen=True)
class GPUAssignment:
    index: int
    uuid: str


@dataclass(frozen=True)
class PortMapping:
    name: str
    container_port: int
    # The port on the host the container is reachable at. For the process runtime, where
    # containers share the host network, the agent allocates it and the container is told
    # through its environment; for podman it is published to container_port.
    host_port: int
    protocol: str = "TCP"


@dataclass
class ContainerSpec:
    pod_uid: str
    pod_name: str
    namespace: str
    name: str  # container name
    image: str
    command: list[str]
    args: list[str]
    env: dict[str, str]
    working_dir: str | None
    ports: list[PortMapping] = field(default_factory=list)
    gpus: list[GPUAssignment] = field(default_factory=list)
    cpu_limit_millis: int | None = None
    memory_limit_bytes: int | None = None
    log_path: str = ""
    # How many times this container has been restarted (names of runtime objects may use it).
    attempt: int = 0
    # Free-form hints for a runtime (the simulated runtime reads its behaviour from here).
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass
class ContainerHandle:
    id: str
    pid: int | None = None


@dataclass
class ContainerState:
    state: Literal["running", "exited", "unknown"]
    exit_code: int | None = None
    # Seconds since the epoch.
    started_at: float | None = None
    finished_at: float | None = None
    # Kubernetes' terminated reasons: Completed, Error, OOMKilled, ContainerCannotRun
    reason: str = ""
    message: str = ""


@dataclass
class ContainerStats:
    cpu_millis: float  # average over the last sampling interval
    memory_bytes: int


class RuntimeError_(Exception):
    """A container could not be started (bad image, command not found...). The agent reports
    it as a waiting/terminated container with this message instead of crashing."""

    def __init__(self, message: str = "", reason: str = "") -> None:
        super().__init__(message)
        # Kubernetes' waiting reason when the runtime knows it (ErrImagePull,
        # RunContainerError...); empty lets the agent choose.
        self.reason = reason


class Runtime(Protocol):
    name: str

    async def start(self, spec: ContainerSpec) -> ContainerHandle:
        """Start the container and return at once. Raises RuntimeError_ when it cannot start."""

    async def state(self, handle: ContainerHandle) -> ContainerState: ...

    async def wait(self, handle: ContainerHandle) -> ContainerState:
        """Block until the container exits; returns its final state."""

    async def stop(self, handle: ContainerHandle, grace_seconds: float) -> ContainerState:
        """SIGTERM (the whole process group), wait up to grace_seconds, then SIGKILL."""

    async def exec(self, handle: ContainerHandle, command: list[str], timeout: float) -> tuple[int, str]:  # noqa: ASYNC109
        """Run a command in the container's context (exec probes); (exit code, output)."""

    async def stats(self, handle: ContainerHandle) -> ContainerStats | None: ...

    async def remove(self, handle: ContainerHandle) -> None:
        """Forget the container (and its runtime objects); logs stay."""

    async def close(self) -> None: ...
