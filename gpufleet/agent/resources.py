"""What the agent hands out on its node: GPU indices and host ports.

Both tables are local and authoritative for this server: whatever the scheduler believed,
a GPU index or a host port is never given to two live pods at once.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.api.kubeflow_names import DEFAULT_PORT_NAME, rendezvous_port
from gpufleet.api.podresources import RESTART_ALWAYS, container_gpu_request

HOST_PORTS_ANNOTATION = "gpufleet.io/host-ports"


def split_gpus(pod: Mapping[str, Any], indices: Sequence[int]) -> dict[str, list[int]]:
    """Which of the pod's GPUs each container sees. When the containers' requests add up to
    the pod's GPUs, each gets its own share in order (sidecars after the containers);
    otherwise (a hand-written annotation) every GPU-requesting one sees all of them. Other
    init containers run before them and take the first ones."""
    spec = pod.get("spec") or {}
    inits = spec.get("initContainers") or []
    # Containers and sidecars (restartable init containers) run together, each on its own GPUs.
    running = [*(spec.get("containers") or []), *(c for c in inits if c.get("restartPolicy") == RESTART_ALWAYS)]
    out: dict[str, list[int]] = {}
    wanted = [container_gpu_request(c) for c in running]
    if sum(wanted) == len(indices):
        pos = 0
        for c, n in zip(running, wanted, strict=True):
            out[c.get("name", "")] = list(indices[pos : pos + n])
            pos += n
    else:
        for c, n in zip(running, wanted, strict=True):
            out[c.get("name", "")] = list(indices) if n else []
    for c in inits:
        if c.get("restartPolicy") != RESTART_ALWAYS:
            n = container_gpu_request(c)
            out[c.get("name", "")] = list(indices[:n]) if n else []
    return out


class GPUTable:
    """GPU index -> uid of the pod holding it."""

    def __init__(self) -> None:
        self.owner: dict[int, str] = {}

    def conflicts(self, uid: str, indices: Iterable[int]) -> dict[int, str]:
        return {i: self.owner[i] for i in indices if i in self.owner and self.owner[i] != uid}

    def acquire(self, uid: str, indices: Iterable[int]) -> None:
        for i in indices:
            self.owner[i] = uid

    def release(self, uid: str) -> None:
        for i in [i for i, o in self.owner.items() if o == uid]:
            del self.owner[i]

    def held_by(self, uid: str) -> list[int]:
        return sorted(i for i, o in self.owner.items() if o == uid)

    def choose(self, uid: str, count: int, gpus: Sequence[Any]) -> list[int] | None:
        """Free healthy GPUs for a pod that came without an assignment, from one interconnect
        group when one group has enough (the fastest links between a job's GPUs)."""
        free = [g for g in gpus if _healthy(g) and self.owner.get(g.index, uid) == uid]
        if len(free) < count:
            return None
        groups: dict[str, list[Any]] = {}
        for g in free:
            groups.setdefault(str(getattr(g, "group", "") or ""), []).append(g)
        # The tightest group that fits, so bigger groups stay whole for bigger jobs.
        fitting = sorted((gs for gs in groups.values() if len(gs) >= count), key=len)
        chosen = fitting[0][:count] if fitting else free[:count]
        return sorted(g.index for g in chosen)


def _healthy(gpu: Any) -> bool:
    health = getattr(gpu, "health", "Healthy")
    return health in (True, "Healthy", "healthy", None)


@dataclass(frozen=True)
class PortRequest:
    container: str
    key: str  # the port's name, or its number when unnamed
    name: str
    container_port: int
    host_port: int | None
    protocol: str


def port_requests(pod: Mapping[str, Any]) -> list[PortRequest]:
    spec = pod.get("spec") or {}
    # A PyTorchJob leader's rendezvous port is pinned like a hostPort (see kubeflow.py).
    pinned = rendezvous_port(pod)
    out: list[PortRequest] = []
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for p in c.get("ports") or []:
            cp = int(p.get("containerPort") or 0)
            name = p.get("name") or ""
            host_port = p.get("hostPort")
            if not host_port and pinned is not None and name == DEFAULT_PORT_NAME and cp == pinned:
                host_port = pinned
            out.append(PortRequest(c.get("name", ""), name or str(cp), name, cp, host_port,
                                   p.get("protocol") or "TCP"))
    return out


class PortTable:
    """Host port -> uid of the pod using it, on the agent's address."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.owner: dict[int, str] = {}

    def release(self, uid: str) -> None:
        for p in [p for p, o in self.owner.items() if o == uid]:
            del self.owner[p]

    def allocate(self, uid: str, requests: Sequence[PortRequest],
                 previous: Mapping[str, int] | None = None) -> dict[str, int]:
        """A host port per requested port: the fixed hostPort, else the one this pod had
        before (an agent restart keeps its replicas where they were announced), else a free
        one. Raises PortsUnavailable naming what is taken."""
        previous = previous or {}
        mine: dict[str, int] = {}
        taken: list[str] = []
        for req in requests:
            if req.key in mine:
                continue
            fixed = req.host_port
            want = fixed or previous.get(req.key)
            if want:
                holder = self.owner.get(int(want))
                if holder is not None and holder != uid:
                    if fixed:
                        taken.append(f"{req.key}->{want}")
                        continue
                    want = None
                elif not req.host_port and not _bindable(self.address, int(want)):
                    want = None
            if not want:
                want = self._free_port()
            mine[req.key] = int(want)
            self.owner[int(want)] = uid
        if taken:
            self.release(uid)
            raise PortsUnavailable(f"host ports in use by another pod: {', '.join(taken)}")
        return mine

    def _free_port(self) -> int:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                with contextlib.suppress(OSError):
                    s.bind((self.address, 0))
                port = s.getsockname()[1]
            if port and port not in self.owner:
                return port
        raise PortsUnavailable("no free port on the agent's address")


class PortsUnavailable(Exception):
    pass


def _bindable(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def parse_host_ports(text: str | None) -> dict[str, int]:
    if not text:
        return {}
    try:
        raw = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(raw, dict):
        return {}
    return {str(k): int(v) for k, v in raw.items() if isinstance(v, int) and not isinstance(v, bool)}


def port_env(requests: Sequence[PortRequest], ports: Mapping[str, int], container: str,
             host_network: bool) -> dict[str, str]:
    """PORT (the container's first port) and GPUFLEET_PORT_<NAME> for each of its ports: the
    host port when containers share the host's network (they must listen there), the
    container port when the runtime publishes it. The named ports of the pod's other
    containers come too (GPUFLEET_PORT_<NAME> only, a container's own winning): containers
    of a pod share its network, so a sidecar reaches its neighbour's port as in Kubernetes
    it would reach localhost:<containerPort> (e.g. Ray's autoscaler the head's GCS)."""
    env: dict[str, str] = {}
    for req in requests:
        if req.container != container:
            continue
        value = str(ports[req.key] if host_network else req.container_port)
        env.setdefault("PORT", value)
        env[_port_label(req)] = value
    for req in requests:
        if req.container != container and req.name and (req.key in ports or not host_network):
            env.setdefault(_port_label(req), str(ports[req.key] if host_network else req.container_port))
    return env


def _port_label(req: PortRequest) -> str:
    label = (req.name or str(req.container_port)).upper().replace("-", "_").replace(".", "_")
    return f"GPUFLEET_PORT_{label}"
