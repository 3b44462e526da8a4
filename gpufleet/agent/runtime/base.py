"""The container runtime interface the node agent drives: process, podman, simulated.

The agent decides *what* runs (which containers, when to restart, which GPUs, ports,
volumes and identities); a runtime only knows *how* to make a pod's sandbox (its network,
IPC and /dev/shm, shared by its containers), pull an image, and start, watch, signal and
inspect one container in that sandbox. The shape is the CRI's (RunPodSandbox, PullImage,
CreateContainer/StartContainer, ...), reduced to what the agent uses. Every runtime must
behave the same from the agent's point of view, so the rest of the system cannot tell a
simulated node from a real one.

What a runtime cannot honour it says through ``capabilities`` (see CAPABILITIES): the agent
then tells the pod with an Event and a condition instead of silently dropping it.

Everything a runtime starts carries the pod's uid, the container's name and attempt and
its GPU indices (labels, or state the runtime persists), so that an agent that restarts
gets them back from ``recover()`` and re-adopts, rather than doubles, what still runs.
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


@dataclass(frozen=True)
class Mount:
    """A path on the node that appears at ``container_path`` in the container (a volume the
    agent prepared, or one subPath of it)."""

    host_path: str
    container_path: str
    read_only: bool = False


@dataclass(frozen=True)
class SecuritySpec:
    """The container's effective securityContext (container fields over the pod's), already
    resolved by the agent. ``run_as_user=None`` leaves the choice to the runtime: the
    image's USER for images, an unprivileged default for host processes."""

    run_as_user: int | None = None
    run_as_group: int | None = None
    supplemental_groups: tuple[int, ...] = ()
    # fsGroup: added to the supplemental groups; volumes are group-owned by it.
    fs_group: int | None = None
    run_as_non_root: bool = False
    privileged: bool = False
    read_only_root_filesystem: bool = False
    # allowPrivilegeEscalation: false -> no_new_privs.
    no_new_privileges: bool = False
    capabilities_add: tuple[str, ...] = ()
    capabilities_drop: tuple[str, ...] = ()
    # "RuntimeDefault", "Unconfined" or "Localhost/<path>".
    seccomp: str = "RuntimeDefault"
    # procMount: "Default" masks /proc paths as container runtimes do; "Unmasked" does not.
    unmasked_proc: bool = False


@dataclass(frozen=True)
class HostAlias:
    ip: str
    hostnames: tuple[str, ...]


@dataclass
class SandboxSpec:
    """What the pod's containers share: network namespace (its IP and ports), IPC and
    /dev/shm, hostname, /etc/hosts."""

    pod_uid: str
    pod_name: str
    namespace: str
    hostname: str
    # A directory on the node for the sandbox's own files (its /etc/hosts, its shm, ...).
    directory: str
    host_network: bool = False
    host_pid: bool = False
    host_ipc: bool = False
    # Size of /dev/shm (an emptyDir of medium Memory mounted at /dev/shm sets it); None: the
    # runtime's default (64 MiB, as Docker and podman).
    shm_size_bytes: int | None = None
    # Ports to publish on the node: those with a hostPort (host_port > 0).
    ports: list[PortMapping] = field(default_factory=list)
    # /etc/hosts entries beyond localhost and the pod's own name (spec.hostAliases, and the
    # name the API server is reached by from pods).
    hosts: list[HostAlias] = field(default_factory=list)
    dns_servers: list[str] = field(default_factory=list)
    # sysctls the pod asked for (namespaced ones only).
    sysctls: dict[str, str] = field(default_factory=dict)
    # The GPU indices the pod holds, recorded with the sandbox for recover().
    gpus: list[int] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class SandboxHandle:
    id: str
    # The pod's IP; empty when the pod shares the node's network (then the node's address).
    ip: str = ""


@dataclass
class RegistryAuth:
    """Credentials for one registry, from a kubernetes.io/dockerconfigjson (or dockercfg)
    Secret named in imagePullSecrets."""

    server: str
    username: str = ""
    password: str = ""
    auth: str = ""  # base64 "user:password", as in a Docker config
    identity_token: str = ""
    registry_token: str = ""


@dataclass
class PulledImage:
    image: str
    # The image's id (what status.containerStatuses[].imageID reports).
    image_id: str = ""
    # False when it was already present and the policy did not ask for a pull.
    pulled: bool = False
    size_bytes: int | None = None
    seconds: float = 0.0


class ImagePullError(Exception):
    """The image could not be pulled. ``reason`` is Kubernetes' waiting reason: ErrImagePull,
    ErrImageNeverPull or InvalidImageName; the message carries the registry's own words."""

    def __init__(self, message: str, reason: str = "ErrImagePull") -> None:
        super().__init__(message)
        self.reason = reason


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
    mounts: list[Mount] = field(default_factory=list)
    security: SecuritySpec = field(default_factory=SecuritySpec)
    # The pod's sandbox (from run_sandbox); None for a runtime without sandboxes.
    sandbox: SandboxHandle | None = None
    # The node this runs on (labels containers, so agents sharing a runtime tell theirs apart).
    node_name: str = ""
    stdin: bool = False
    stdin_once: bool = False
    tty: bool = False


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
class RecoveredSandbox:
    handle: SandboxHandle
    pod_uid: str
    namespace: str = ""
    pod_name: str = ""
    gpus: tuple[int, ...] = ()


@dataclass
class RecoveredContainer:
    """A container an earlier run of the agent started that the runtime still knows of."""

    handle: ContainerHandle
    pod_uid: str
    name: str
    attempt: int
    # The GPU indices it was given; a running one holds them until it is gone.
    gpus: tuple[int, ...]
    state: ContainerState
    namespace: str = ""
    pod_name: str = ""
    sandbox_id: str = ""
    log_path: str = ""


# What a runtime may honour; the agent tells a pod which of its asks were not honoured.
CAPABILITIES = (
    "images",  # runs the pod's image (else: the host's own programs)
    "pod-network",  # each pod in its own network namespace, with its own IP
    "run-as-user",  # runAsUser / runAsGroup / supplementalGroups
    "mounts",  # volumes appear at their mountPath
    "read-only-rootfs",
    "capabilities",  # Linux capabilities add/drop, privileged
    "pid-namespace",  # the pod sees only its own processes
    "shm-size",
)


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


class PodNetworkUnavailable(RuntimeError_):
    """The node's pod network cannot be made as asked (its CIDR is taken on this host)."""


class Runtime(Protocol):
    name: str
    # A subset of CAPABILITIES.
    capabilities: frozenset[str]

    async def ensure_image(self, image: str, pull_policy: str, auth: list[RegistryAuth]) -> PulledImage:
        """Make the image present per imagePullPolicy (Always, IfNotPresent, Never).
        Raises ImagePullError with the registry's message."""

    async def run_sandbox(self, spec: SandboxSpec) -> SandboxHandle:
        """Create and start the pod's sandbox; idempotent for the same pod uid."""

    async def stop_sandbox(self, handle: SandboxHandle) -> None:
        """Stop what is left of the sandbox (its containers are stopped first by the agent)."""

    async def remove_sandbox(self, handle: SandboxHandle) -> None: ...

    async def recover(self, node_name: str) -> tuple[list[RecoveredSandbox], list[RecoveredContainer]]:
        """What an earlier run of the agent for this node left: sandboxes and containers,
        running or exited, with the pod uid, container name, attempt and GPUs of each.
        Recovered containers are then known to the runtime as if this run had started them
        (state, wait, stop, exec, stats, remove all work on their handles)."""

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


class HostSandboxMixin:
    """For runtimes whose pods share the node: no sandbox object, nothing to pull. The
    sandbox handle is the pod uid and the pod's IP is the node's."""

    async def ensure_image(self, image: str, pull_policy: str, auth: list[RegistryAuth]) -> PulledImage:
        return PulledImage(image=image, image_id=image, pulled=False)

    async def run_sandbox(self, spec: SandboxSpec) -> SandboxHandle:
        return SandboxHandle(id=spec.pod_uid)

    async def stop_sandbox(self, handle: SandboxHandle) -> None:
        return None

    async def remove_sandbox(self, handle: SandboxHandle) -> None:
        return None

    async def recover(self, node_name: str) -> tuple[list[RecoveredSandbox], list[RecoveredContainer]]:
        return [], []
