"""Real containers through the podman CLI.

Flags that matter on the machines we run on:

- ``--runtime runc``: crun fails on cgroup v1 hosts; runc works on v1 and v2.
- ``--ulimit nofile=1024:1024 --ulimit nproc=1024:1024``: without explicit limits podman
  copies the host's, which runc then cannot set inside some sandboxes.
- ``--init``: a tiny init (catatonit) as PID 1 forwards SIGTERM to the program. A program
  running as PID 1 gets no default signal handlers, so one that never installed a SIGTERM
  handler (busybox httpd, most scripts) would ignore ``podman stop`` until the grace
  period ran out. The price: catatonit masks "executable not found" as exit 1 with a line
  in the log, which state() recognizes as ContainerCannotRun.
- ``--log-driver k8s-file --log-opt path=LOG``: conmon writes CRI lines straight to the
  agent's log file (appending, and the file stays after ``podman rm``).
- ``--device nvidia.com/gpu=UUID``: GPUs through CDI (needs the NVIDIA CDI spec from
  ``nvidia-ctk cdi generate``). Inside, the container sees only those GPUs, numbered from
  0, so CUDA_VISIBLE_DEVICES is renumbered to match.

The environment goes through an ``--env-file`` (mode 0600, deleted once podman read it),
not ``-e K=V``, so secrets do not show up in the process list; a value that a line-based
file cannot carry (a newline) falls back to ``-e``.

A pod is a sandbox container (catatonit in pause mode, image ``localhost/gpufleet/pause``,
made here from the host's catatonit) that holds the pod's network namespace (its own IP on
the node's network, so two pods may both listen on a fixed containerPort), IPC namespace and
/dev/shm, hostname and /etc/hosts; the pod's containers join it (``--network container:``,
``--ipc container:``, ``--uts container:``), as the kubelet's pods do with their pause
container. Only ports with a hostPort are published on the node.

Images are pulled by ensure_image() per imagePullPolicy with the pod's pull secrets (an
auth file in the Docker config format, mode 0600, removed after the pull); containers are
then run with ``--pull never``. Registries' TLS is podman's: /etc/containers/certs.d.

Everything carries labels (node, pod uid, namespace, pod, container, attempt, GPUs), so
recover() finds what an earlier agent started. Containers belong to podman (conmon
supervises them), so they survive this runtime and the agent; close() only stops watching.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gpufleet.agent.runtime._common import safe_name, terminated_reason, within
from gpufleet.agent.runtime.base import (
    CAPABILITIES,
    ContainerHandle,
    ContainerSpec,
    ContainerState,
    ContainerStats,
    ImagePullError,
    PodNetworkUnavailable,
    PulledImage,
    RecoveredContainer,
    RecoveredSandbox,
    RegistryAuth,
    RuntimeError_,
    SandboxHandle,
    SandboxSpec,
    SecuritySpec,
)
from gpufleet.agent.runtime.gpuenv import CUDA_VISIBLE_DEVICES, cdi_device, gpu_env
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

DEFAULT_ULIMITS = (("nofile", "1024:1024"), ("nproc", "1024:1024"))
LABEL_PREFIX = "gpufleet.io/"
_INIT_EXEC_FAILED = "failed to exec pid1"
_ZERO_TIME = "0001-01-01"
PAUSE_IMAGE = "localhost/gpufleet/pause:1"
_CATATONIT = ("/usr/bin/catatonit", "/usr/libexec/podman/catatonit")
_SANDBOX_ROLE = "sandbox"
_NVIDIA_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
_IMAGE_ERROR = re.compile(
    r"initializing source|unable to pull|image not known|manifest unknown|pull access denied|"
    r"short-name|reading manifest|repository .* not found",
    re.IGNORECASE,
)


def container_name(spec: ContainerSpec) -> str:
    """gpufleet-<namespace>-<pod>-<container>-<attempt>: readable in ``podman ps``, unique
    on the node (two namespaces may hold pods of the same name)."""
    raw = f"gpufleet-{spec.namespace}-{spec.pod_name}-{spec.name}-{spec.attempt}"
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", raw)


def sandbox_name(spec: SandboxSpec) -> str:
    raw = f"gpufleet-{spec.namespace}-{spec.pod_name}-{spec.pod_uid[:8]}-pause"
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", raw)


def normalize_image(image: str) -> str:
    """A Kubernetes image reference as the kubelet resolves it: no registry means Docker Hub
    (``nginx`` -> ``docker.io/library/nginx:latest``), no tag means ``latest``."""
    ref = image.strip()
    if not ref:
        return ref
    name, digest = (ref.split("@", 1) + [""])[:2] if "@" in ref else (ref, "")
    first, _, rest = name.partition("/")
    if not rest:
        name = f"docker.io/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    last = name.rsplit("/", 1)[-1]
    if not digest and ":" not in last:
        name += ":latest"
    return f"{name}@{digest}" if digest else name


def auth_file_content(auth: list[RegistryAuth]) -> dict[str, Any]:
    """The Docker config (``{"auths": {server: {"auth": base64(user:password)}}}``) podman
    reads with --authfile."""
    import base64

    auths: dict[str, Any] = {}
    for a in auth:
        entry: dict[str, str] = {}
        if a.auth:
            entry["auth"] = a.auth
        elif a.username or a.password:
            entry["auth"] = base64.b64encode(f"{a.username}:{a.password}".encode()).decode()
        if a.identity_token:
            entry["identitytoken"] = a.identity_token
        if a.registry_token:
            entry["registrytoken"] = a.registry_token
        server = re.sub(r"^https?://", "", a.server).rstrip("/")
        if server.endswith("/v1") or server.endswith("/v2"):
            server = server[:-3]
        if server in ("index.docker.io", "registry-1.docker.io"):
            server = "docker.io"
        if entry and server:
            auths[server] = entry
    return {"auths": auths}


def security_args(sec: SecuritySpec, user_override: str | None = None) -> list[str]:
    """podman run flags for a resolved securityContext."""
    args: list[str] = []
    user = user_override
    if user is None and sec.run_as_user is not None:
        user = str(sec.run_as_user)
        if sec.run_as_group is not None:
            user += f":{sec.run_as_group}"
    elif user is None and sec.run_as_group is not None:
        # A group without a user: podman needs both; keep the image's user by name.
        user = None
    if user is not None:
        args += ["--user", user]
    groups = list(dict.fromkeys([*sec.supplemental_groups, *([sec.fs_group] if sec.fs_group is not None else [])]))
    for g in groups:
        args += ["--group-add", str(g)]
    if sec.privileged:
        args.append("--privileged")
    for cap in sec.capabilities_drop:
        args += ["--cap-drop", _cap(cap)]
    for cap in sec.capabilities_add:
        args += ["--cap-add", _cap(cap)]
    if sec.read_only_root_filesystem:
        args.append("--read-only")
    if sec.no_new_privileges:
        args += ["--security-opt", "no-new-privileges"]
    if sec.seccomp == "Unconfined":
        args += ["--security-opt", "seccomp=unconfined"]
    elif sec.seccomp.startswith("Localhost/"):
        args += ["--security-opt", f"seccomp={sec.seccomp.split('/', 1)[1]}"]
    if sec.unmasked_proc:
        args += ["--security-opt", "unmask=ALL"]
    return args


def _cap(name: str) -> str:
    name = name.upper()
    return name if name == "ALL" or name.startswith("CAP_") else f"CAP_{name}"


def _cdi_available() -> bool:
    for d in _CDI_DIRS:
        try:
            if any(n.startswith("nvidia") for n in os.listdir(d)):
                return True
        except OSError:
            continue
    return False


def gpu_device_args(spec: ContainerSpec, cdi: bool) -> list[str]:
    """The container's GPUs: through CDI when the NVIDIA CDI spec is installed (``nvidia-ctk
    cdi generate``), else their device nodes when they exist; declared GPUs on a machine
    without any get nothing but the environment."""
    args: list[str] = []
    if not spec.gpus:
        return args
    if cdi:
        for g in spec.gpus:
            args += ["--device", cdi_device(g.uuid)]
        return args
    nodes = [f"/dev/nvidia{g.index}" for g in spec.gpus if os.path.exists(f"/dev/nvidia{g.index}")]
    if nodes:
        nodes += [d for d in _NVIDIA_CONTROL_DEVICES if os.path.exists(d)]
    for n in nodes:
        args += ["--device", n]
    return args


def container_env(spec: ContainerSpec) -> dict[str, str]:
    env = dict(spec.env)
    env.update(gpu_env(spec.gpus))
    if spec.gpus:
        env[CUDA_VISIBLE_DEVICES] = ",".join(str(i) for i in range(len(spec.gpus)))
    return env


def _env_file_safe(value: str) -> bool:
    return "\n" not in value and not value.endswith("\r")


def build_run_args(
    spec: ContainerSpec,
    *,
    name: str,
    log_path: str,
    env_file: str | None,
    oci_runtime: str = "runc",
    init: bool = True,
    ulimits: tuple[tuple[str, str], ...] = DEFAULT_ULIMITS,
    cdi: bool = True,
    owner: str = "",
) -> list[str]:
    """The arguments of ``podman run`` for a container (without the program name).

    The variables a line-based env file can carry are expected in env_file (see
    write_env_file); the rest are passed with -e here."""
    args = ["run", "-d", "--name", name, "--pull", "never"]
    if oci_runtime:
        args += ["--runtime", oci_runtime]
    if init:
        args.append("--init")
    for kind, value in ulimits:
        args += ["--ulimit", f"{kind}={value}"]
    for key, value in (
        ("pod-uid", spec.pod_uid),
        ("namespace", spec.namespace),
        ("pod", spec.pod_name),
        ("container", spec.name),
        ("attempt", str(spec.attempt)),
        ("gpus", ",".join(str(g.index) for g in spec.gpus)),
        ("node", spec.node_name),
        ("owner", owner),
        ("sandbox", spec.sandbox.id if spec.sandbox is not None else ""),
        ("log-path", log_path),
    ):
        args += ["--label", f"{LABEL_PREFIX}{key}={value}"]
    if spec.sandbox is not None:
        # The pod's containers share its sandbox's network, IPC and hostname (and so its
        # /etc/hosts and /dev/shm), as a Kubernetes pod's containers do.
        target = spec.sandbox.id
        args += ["--network", f"container:{target}", "--ipc", f"container:{target}",
                 "--uts", f"container:{target}"]
    if spec.stdin:
        args.append("-i")
    if spec.tty:
        args.append("-t")
    env = container_env(spec)
    if env_file is not None:
        args += ["--env-file", env_file]
    for k in sorted(env):
        if env_file is None or not _env_file_safe(env[k]):
            args += ["-e", f"{k}={env[k]}"]
    if spec.working_dir:
        args += ["-w", spec.working_dir]
    if spec.sandbox is None:
        # Without a sandbox the container has a network of its own: publish its ports.
        for p in spec.ports:
            args += ["-p", f"{p.host_port}:{p.container_port}/{p.protocol.lower()}"]
    args += security_args(spec.security)
    for m in spec.mounts:
        opts = "ro" if m.read_only else "rw"
        args += ["--mount", f"type=bind,source={m.host_path},destination={m.container_path},{opts}"]
    if spec.cpu_limit_millis:
        args += ["--cpus", f"{spec.cpu_limit_millis / 1000:g}"]
    if spec.memory_limit_bytes:
        args += ["--memory", f"{spec.memory_limit_bytes}b"]
    args += gpu_device_args(spec, cdi)
    args += ["--log-driver", "k8s-file", "--log-opt", f"path={log_path}"]
    if spec.command:
        # Kubernetes' command replaces the image's ENTRYPOINT (and drops its CMD, which
        # podman does too when --entrypoint is given); args replace CMD.
        args += ["--entrypoint", json.dumps(spec.command)]
    args.append(spec.image)
    args += spec.args
    return args


def write_env_file(path: Path, env: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        for k in sorted(env):
            if _env_file_safe(env[k]):
                f.write(f"{k}={env[k]}\n")


def parse_time(text: str | None) -> float | None:
    """podman's times ("2024-05-01T12:00:00.123456789Z", zero time for never)."""
    if not text or text.startswith(_ZERO_TIME):
        return None
    m = re.match(r"^(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)(?:\.(\d+))?\s*(Z|[+-]\d\d:?\d\d)?", text)
    if not m:
        return None
    frac = (m.group(3) or "0")[:6].ljust(6, "0")
    tz = m.group(4) or "Z"
    if tz == "Z":
        tz = "+00:00"
    elif ":" not in tz:
        tz = tz[:3] + ":" + tz[3:]
    return datetime.fromisoformat(f"{m.group(1)}T{m.group(2)}.{frac}{tz}").timestamp()


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> float | None:
    """Go's time.Duration text ("1m2.5s", "39.2ms") in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", text or "")
    if not parts:
        return None
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)


_SIZE_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


def parse_size(text: str) -> int | None:
    """podman's human sizes ("462.8kB", "1.5GiB") in bytes."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)", text or "")
    if not m:
        return None
    unit = (m.group(2) or "b").lower()
    if unit not in _SIZE_UNITS:
        return None
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


@dataclass(eq=False)
class _Container:
    handle: ContainerHandle
    name: str
    spec: ContainerSpec
    log_path: str
    stopping: bool = False
    waiter: asyncio.Task[ContainerState] | None = None
    last_cpu: tuple[float, float] | None = None  # (cpu seconds, monotonic time)


class PodmanRuntime:
    name = "podman"
    capabilities = frozenset(CAPABILITIES)

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        clock: Clock = REAL_CLOCK,
        *,
        podman: str = "podman",
        oci_runtime: str = "runc",
        init: bool = True,
        ulimits: tuple[tuple[str, str], ...] = DEFAULT_ULIMITS,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.clock = clock
        self.podman = podman
        self.oci_runtime = oci_runtime
        self.init = init
        self.ulimits = ulimits
        self._containers: dict[str, _Container] = {}
        # Which agent's containers these are: two agents of one node name (two clusters on
        # one machine) must never adopt or reap each other's.
        import hashlib

        self.owner = hashlib.sha256(str(self.state_dir.resolve()).encode()).hexdigest()[:12]
        # The podman network pods join (the node's pod network); "" is podman's default.
        self.network = ""
        self._pull_locks: dict[str, asyncio.Lock] = {}
        self._pause_ready = False
        self._cdi: bool | None = None
        self.version = ""

    def set_network(self, name: str) -> None:
        self.network = name

    async def ensure_network(self, name: str, cidr: str, node_name: str) -> None:
        """The node's pod network: a bridge with the node's pod CIDR (spec.podCIDR), so pod IPs
        are unique across the fleet. An existing one with another subnet is replaced when no
        container uses it."""
        import ipaddress

        net = ipaddress.ip_network(cidr, strict=False)
        gateway = str(next(net.hosts()))
        rc, out, _ = await self._run("network", "inspect", name, "--format", "json")
        if rc == 0:
            try:
                subnets = [sn.get("subnet") for sn in (json.loads(out) or [{}])[0].get("subnets") or []]
            except ValueError:
                subnets = []
            if str(net) in subnets:
                self.set_network(name)
                return
            rc, users, _ = await self._run("ps", "-a", "-q", "--filter", f"network={name}")
            if users.strip():
                log.warning("podman network %s has subnets %s, not the node's %s, and is in use: keeping it",
                            name, subnets, net)
                self.set_network(name)
                return
            await self._run("network", "rm", "-f", name)
        create = ("network", "create", "--subnet", str(net), "--gateway", gateway,
                  "--label", f"{LABEL_PREFIX}node={node_name}", name)
        rc, _, err = await self._run(*create)
        if rc != 0 and "already used" in err and await self._free_subnet(str(net)):
            rc, _, err = await self._run(*create)
        if rc != 0 and "already used" in err:
            raise SubnetInUse(f"the node's pod CIDR {net} is used on this host by another network in use "
                              "(another cluster's node on this machine?)")
        if rc != 0 and "already exists" not in err:
            raise RuntimeError_(f"cannot create the pod network {name} ({net}): {_podman_error(err)}",
                                "NetworkNotReady")
        self.set_network(name)

    async def _free_subnet(self, subnet: str) -> bool:
        """Remove pod networks of ours (an earlier cluster's nodes) that hold this subnet and
        that no container uses. Whether any was removed."""
        rc, out, _ = await self._run("network", "ls", "--format", "json")
        try:
            nets = json.loads(out) if rc == 0 else []
        except ValueError:
            nets = []
        removed = False
        for n in nets or []:
            if not any(sn.get("subnet") == subnet for sn in n.get("subnets") or []):
                continue
            if LABEL_PREFIX + "node" not in (n.get("labels") or {}):
                continue
            _, users, _ = await self._run("ps", "-a", "-q", "--filter", f"network={n.get('name')}")
            if users.strip():
                continue
            rc, _, _ = await self._run("network", "rm", n.get("name", ""))
            removed = removed or rc == 0
        return removed

    async def pod_gateway(self) -> str | None:
        """The address pods on the node's pod network reach the node at (the bridge's)."""
        rc, out, _ = await self._run("network", "inspect", self.network or "podman", "--format", "json")
        if rc != 0:
            return None
        try:
            nets = json.loads(out) or [{}]
        except ValueError:
            return None
        for subnet in (nets[0] or {}).get("subnets") or []:
            if subnet.get("gateway") and ":" not in subnet["gateway"]:
                return str(subnet["gateway"])
        return None

    def available(self) -> bool:
        return shutil.which(self.podman) is not None

    async def _run(self, *args: str, merge_stderr: bool = False) -> tuple[int, str, str]:
        p = await asyncio.create_subprocess_exec(
            self.podman,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE,
        )
        try:
            out, err = await p.communicate()
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            with contextlib.suppress(Exception):
                await asyncio.shield(p.wait())
            raise
        assert p.returncode is not None
        return p.returncode, out.decode(errors="replace"), (err or b"").decode(errors="replace")

    async def _inspect(self, ref: str) -> dict[str, Any] | None:
        rc, out, _ = await self._run("inspect", "--type", "container", "--format", "json", ref)
        if rc != 0:
            return None
        try:
            data = json.loads(out)
        except ValueError:
            return None
        return data[0] if data else None

    # --- start ------------------------------------------------------------------------

    def _log_path(self, spec: ContainerSpec) -> str:
        if spec.log_path:
            return spec.log_path
        return str(
            self.state_dir / "logs" / safe_name(spec.pod_uid) / safe_name(spec.name) / f"{spec.attempt}.log"
        )

    async def start(self, spec: ContainerSpec) -> ContainerHandle:
        if not self.available():
            raise RuntimeError_(f"{self.podman} is not installed on this node", "CreateContainerError")
        name = container_name(spec)
        log_path = self._log_path(spec)
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        env_file = self.state_dir / "env" / f"{name}.env"
        write_env_file(env_file, container_env(spec))
        if self._cdi is None:
            self._cdi = _cdi_available()
        if spec.security.run_as_non_root:
            await self._check_non_root(spec)
        args = build_run_args(
            spec,
            name=name,
            log_path=log_path,
            env_file=str(env_file),
            oci_runtime=self.oci_runtime,
            init=self.init,
            ulimits=self.ulimits,
            cdi=self._cdi,
            owner=self.owner,
        )
        try:
            rc, out, err = await self._run(*args)
            if rc != 0 and "already in use" in err:
                # A container of the same pod, container and attempt is left from an agent
                # that lost track of it: this start replaces it.
                await self._run("rm", "-f", "-t", "0", "--ignore", name)
                rc, out, err = await self._run(*args)
        finally:
            with contextlib.suppress(OSError):
                env_file.unlink()
        if rc != 0:
            # A failed run can leave a created-but-never-started container behind.
            await self._run("rm", "-f", "-t", "0", "--ignore", name)
            message = _podman_error(err) or f"podman run exited with {rc}"
            raise RuntimeError_(
                message, "ErrImagePull" if _IMAGE_ERROR.search(err) else "CreateContainerError"
            )
        cid = out.strip().splitlines()[-1] if out.strip() else name
        info = await self._inspect(cid)
        pid = (info or {}).get("State", {}).get("Pid") or None
        c = _Container(ContainerHandle(id=cid, pid=pid), name, spec, log_path)
        self._containers[cid] = c
        if info is not None:
            st = self._to_state(c, info)
            if st.reason == "ContainerCannotRun":
                await self._run("rm", "-f", "-t", "0", "--ignore", cid)
                self._containers.pop(cid, None)
                raise RuntimeError_(st.message, "RunContainerError")
        return c.handle

    async def _check_non_root(self, spec: ContainerSpec) -> None:
        """runAsNonRoot as the kubelet checks it: the uid the container will run as, from
        runAsUser or else the image's USER, must be known and not 0."""
        if spec.security.run_as_user is not None:
            if spec.security.run_as_user == 0:
                raise RuntimeError_("container's runAsUser breaks non-root policy (pod: "
                                    f'"{spec.pod_name}_{spec.namespace}({spec.pod_uid})", container: {spec.name})',
                                    "CreateContainerConfigError")
            return
        rc, out, _ = await self._run("image", "inspect", "--format", "{{.Config.User}}", spec.image)
        user = out.strip().split(":", 1)[0] if rc == 0 else ""
        if user in ("", "0", "root"):
            raise RuntimeError_("container has runAsNonRoot and image will run as root (pod: "
                                f'"{spec.pod_name}_{spec.namespace}({spec.pod_uid})", container: {spec.name})',
                                "CreateContainerConfigError")
        if not user.isdigit():
            raise RuntimeError_(f"container has runAsNonRoot and image has non-numeric user ({user}), "
                                "cannot verify user is non-root (pod: "
                                f'"{spec.pod_name}_{spec.namespace}({spec.pod_uid})", container: {spec.name})',
                                "CreateContainerConfigError")

    # --- images -------------------------------------------------------------------------

    async def image_exists(self, image: str) -> bool:
        rc, _, _ = await self._run("image", "exists", image)
        return rc == 0

    async def _image_id(self, image: str) -> tuple[str, int | None]:
        rc, out, _ = await self._run("image", "inspect", "--format", "json", image)
        if rc != 0:
            return "", None
        try:
            info = (json.loads(out) or [{}])[0]
        except ValueError:
            return "", None
        digests = info.get("RepoDigests") or []
        ident = digests[0] if digests else f"sha256:{info.get('Id', '')}"
        size = info.get("Size")
        return ident, int(size) if isinstance(size, int) else None

    async def ensure_image(self, image: str, pull_policy: str, auth: list[RegistryAuth]) -> PulledImage:
        ref = normalize_image(image)
        if not ref or any(c.isspace() for c in ref) or ref != ref.strip() or ref.startswith("/"):
            raise ImagePullError(f'Failed to apply default image tag "{image}": couldn\'t parse image '
                                 "name: invalid reference format", "InvalidImageName")
        policy = pull_policy or ("Always" if ref.endswith(":latest") and "@" not in ref else "IfNotPresent")
        lock = self._pull_locks.setdefault(ref, asyncio.Lock())
        async with lock:
            present = await self.image_exists(ref)
            if policy == "Never" or (policy == "IfNotPresent" and present):
                if not present:
                    raise ImagePullError(f'Container image "{image}" is not present with pull policy of Never',
                                         "ErrImageNeverPull")
                ident, size = await self._image_id(ref)
                return PulledImage(image=ref, image_id=ident, pulled=False, size_bytes=size)
            t0 = time.monotonic()
            args = ["pull", "--quiet"]
            authfile: str | None = None
            if auth:
                fd, authfile = tempfile.mkstemp(prefix="auth-", suffix=".json", dir=self._private_dir())
                with os.fdopen(fd, "w") as f:
                    json.dump(auth_file_content(auth), f)
                args += ["--authfile", authfile]
            try:
                rc, _, err = await self._run(*args, ref)
            finally:
                if authfile is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(authfile)
            if rc != 0:
                why = (_podman_error(err) or err.strip()).removeprefix("Error: ")
                raise ImagePullError(f'failed to pull image "{image}": {why}')
            ident, size = await self._image_id(ref)
            return PulledImage(image=ref, image_id=ident, pulled=True, size_bytes=size,
                               seconds=time.monotonic() - t0)

    def _private_dir(self) -> str:
        d = self.state_dir / "private"
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        return str(d)

    # --- sandboxes ----------------------------------------------------------------------

    async def _ensure_pause_image(self) -> None:
        if self._pause_ready or await self.image_exists(PAUSE_IMAGE):
            self._pause_ready = True
            return
        with tempfile.TemporaryDirectory(prefix="pause-", dir=self._private_dir()) as tmp:
            tar_path = os.path.join(tmp, "pause.tar")
            if not _write_pause_tar(tar_path):
                raise RuntimeError_("catatonit is not installed on this node (it comes with podman): "
                                    "cannot make the pod sandbox image", "CreatePodSandboxError")
            rc, _, err = await self._run("import", "--change", 'ENTRYPOINT ["/catatonit", "-P"]',
                                         tar_path, PAUSE_IMAGE)
        if rc != 0:
            raise RuntimeError_(f"cannot make the pod sandbox image: {_podman_error(err)}", "CreatePodSandboxError")
        self._pause_ready = True

    async def run_sandbox(self, spec: SandboxSpec) -> SandboxHandle:
        name = sandbox_name(spec)
        info = await self._inspect(name)
        if info is not None:
            labels = (info.get("Config") or {}).get("Labels") or {}
            state = str((info.get("State") or {}).get("Status", "")).lower()
            if labels.get(LABEL_PREFIX + "pod-uid") == spec.pod_uid and state == "running":
                return SandboxHandle(id=info.get("Id") or name, ip=_sandbox_ip(info))
            await self._run("rm", "-f", "-t", "0", "--ignore", name)
        await self._ensure_pause_image()
        args = ["run", "-d", "--name", name, "--pull", "never"]
        if self.oci_runtime:
            args += ["--runtime", self.oci_runtime]
        for kind, value in self.ulimits:
            args += ["--ulimit", f"{kind}={value}"]
        labels = {
            "role": _SANDBOX_ROLE, "owner": self.owner, "agent-dir": str(self.state_dir),
            "pod-uid": spec.pod_uid, "namespace": spec.namespace,
            "pod": spec.pod_name,
            "gpus": ",".join(str(i) for i in spec.gpus), **{k.removeprefix(LABEL_PREFIX): v for k, v in spec.labels.items()},
        }
        for key, value in labels.items():
            args += ["--label", f"{LABEL_PREFIX}{key}={value}"]
        if spec.host_network:
            args += ["--network", "host"]
        else:
            if self.network:
                args += ["--network", self.network]
            args += ["--hostname", spec.hostname]
        args += ["--ipc", "host" if spec.host_ipc else "shareable"]
        if not spec.host_ipc:
            args += ["--shm-size", f"{spec.shm_size_bytes or 64 << 20}b"]
        if spec.host_pid:
            args += ["--pid", "host"]
        for h in spec.hosts:
            for n in h.hostnames:
                args += ["--add-host", f"{n}:{h.ip}"]
        for d in spec.dns_servers:
            args += ["--dns", d]
        for k, v in sorted(spec.sysctls.items()):
            args += ["--sysctl", f"{k}={v}"]
        if not spec.host_network:
            for p in spec.ports:
                if p.host_port:
                    args += ["-p", f"{p.host_port}:{p.container_port}/{p.protocol.lower()}"]
        args.append(PAUSE_IMAGE)
        rc, out, err = await self._run(*args)
        if rc != 0:
            await self._run("rm", "-f", "-t", "0", "--ignore", name)
            raise RuntimeError_(f"failed to create pod sandbox: {_podman_error(err) or err.strip()}",
                                "CreatePodSandboxError")
        info = await self._inspect(name)
        return SandboxHandle(id=(info or {}).get("Id") or out.strip() or name, ip=_sandbox_ip(info or {}))

    async def stop_sandbox(self, handle: SandboxHandle) -> None:
        await self._run("stop", "-t", "0", "--ignore", handle.id)

    async def remove_sandbox(self, handle: SandboxHandle) -> None:
        # Containers that still use it go first (podman refuses otherwise).
        rc, out, _ = await self._run("ps", "-a", "-q", "--filter", f"label={LABEL_PREFIX}sandbox={handle.id}")
        ids = out.split() if rc == 0 else []
        if ids:
            await self._run("rm", "-f", "-t", "0", "--ignore", *ids)
        await self._run("rm", "-f", "-t", "0", "--ignore", handle.id)

    # --- recovery -----------------------------------------------------------------------

    async def recover(self, node_name: str) -> tuple[list[RecoveredSandbox], list[RecoveredContainer]]:
        rc, out, err = await self._run("ps", "-a", "--format", "json", "--filter",
                                       f"label={LABEL_PREFIX}node={node_name}", "--filter",
                                       f"label={LABEL_PREFIX}owner={self.owner}")
        if rc != 0:
            log.warning("podman ps: %s", err.strip())
            return [], []
        try:
            rows = json.loads(out or "[]")
        except ValueError:
            return [], []
        sandboxes: list[RecoveredSandbox] = []
        containers: list[RecoveredContainer] = []
        for row in rows:
            cid = row.get("Id") or ""
            if not cid:
                continue
            info = await self._inspect(cid)
            if info is None:
                continue
            labels = (info.get("Config") or {}).get("Labels") or {}

            def label(key: str, labels: dict[str, str] = labels) -> str:
                return str(labels.get(LABEL_PREFIX + key, ""))

            gpus = tuple(int(x) for x in label("gpus").split(",") if x.strip().isdigit())
            if label("role") == _SANDBOX_ROLE:
                sandboxes.append(RecoveredSandbox(SandboxHandle(cid, _sandbox_ip(info)), label("pod-uid"),
                                                  label("namespace"), label("pod"), gpus))
                continue
            handle = ContainerHandle(id=cid, pid=(info.get("State") or {}).get("Pid") or None)
            log_path = label("log-path") or str(((info.get("HostConfig") or {}).get("LogConfig") or {}).get("Path") or "")
            try:
                attempt = int(label("attempt") or 0)
            except ValueError:
                attempt = 0
            stub = ContainerSpec(label("pod-uid"), label("pod"), label("namespace"), label("container"),
                                 str((info.get("Config") or {}).get("Image") or ""), [], [], {}, None)
            c = _Container(handle, str(info.get("Name", "")), stub, log_path)
            self._containers[cid] = c
            containers.append(RecoveredContainer(
                handle=handle, pod_uid=label("pod-uid"), name=label("container"), attempt=attempt, gpus=gpus,
                state=self._to_state(c, info), namespace=label("namespace"), pod_name=label("pod"),
                sandbox_id=label("sandbox"), log_path=log_path))
        return sandboxes, containers

    # --- observe ------------------------------------------------------------------------

    def _cannot_run_message(self, c: _Container) -> str:
        """catatonit's complaint when the program could not be exec'd, if it left one."""
        try:
            with open(c.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                tail = f.read().decode(errors="replace")
        except OSError:
            return ""
        for line in reversed(tail.splitlines()):
            if _INIT_EXEC_FAILED in line:
                return line.split(" ", 3)[-1] if " stderr " in line else line
        return ""

    def _to_state(self, c: _Container, info: dict[str, Any]) -> ContainerState:
        s = info.get("State") or {}
        status = str(s.get("Status", "")).lower()
        started = parse_time(s.get("StartedAt"))
        finished = parse_time(s.get("FinishedAt"))
        if status in ("running", "paused", "stopping"):
            return ContainerState("running", started_at=started)
        if status not in ("exited", "stopped"):
            return ContainerState("unknown", started_at=started, message=f"podman status {status or '?'}")
        code = int(s.get("ExitCode") or 0)
        error = str(s.get("Error") or "")
        if self.init and code == 1:
            msg = self._cannot_run_message(c)
            if msg:
                return ContainerState("exited", 128, started, finished, "ContainerCannotRun", msg)
        if error and started is None:
            return ContainerState("exited", code or 128, started, finished, "ContainerCannotRun", error)
        oom = bool(s.get("OOMKilled"))
        message = ""
        if not oom and code == 137 and c.spec.memory_limit_bytes and not c.stopping:
            # conmon does not always see the OOM event (cgroup v1); a SIGKILL nobody here
            # sent, to a container with a memory limit, is the OOM killer's.
            oom = True
            message = f"killed with SIGKILL under a memory limit of {c.spec.memory_limit_bytes} bytes"
        reason = terminated_reason(code, oom)
        if reason == "OOMKilled" and not message:
            message = "the container exceeded its memory limit"
        return ContainerState("exited", code, started, finished, reason, message or error)

    async def state(self, handle: ContainerHandle) -> ContainerState:
        c = self._containers.get(handle.id)
        info = await self._inspect(handle.id)
        if info is None:
            return ContainerState("unknown", message="no such container")
        if c is None:
            c = _Container(handle, str(info.get("Name", "")), _spec_stub(), "")
        return self._to_state(c, info)

    async def _wait_exit(self, c: _Container) -> ContainerState:
        await self._run("wait", c.handle.id)
        return await self.state(c.handle)

    async def wait(self, handle: ContainerHandle) -> ContainerState:
        c = self._containers.get(handle.id)
        if c is None:
            return await self.state(handle)
        if c.waiter is None or (c.waiter.done() and c.waiter.cancelled()):
            c.waiter = asyncio.create_task(self._wait_exit(c))
        return await asyncio.shield(c.waiter)

    async def stop(self, handle: ContainerHandle, grace_seconds: float) -> ContainerState:
        c = self._containers.get(handle.id)
        if c is not None:
            c.stopping = True
        st = await self.state(handle)
        if st.state != "running":
            return st
        rc, _, err = await self._run("stop", "-t", str(max(0, math.ceil(grace_seconds))), handle.id)
        if rc != 0:
            log.warning("podman stop %s: %s", handle.id, err.strip())
        return await self.state(handle)

    async def exec(
        self,
        handle: ContainerHandle,
        command: list[str],
        timeout: float,  # noqa: ASYNC109 - the signature is base.Runtime's
    ) -> tuple[int, str]:
        if not command:
            return -1, "no command"
        run = asyncio.ensure_future(self._run("exec", handle.id, *command, merge_stderr=True))
        if not await within(run, self.clock, timeout):
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
            return -1, f"command timed out after {timeout:g}s"
        rc, out, _ = run.result()
        return rc, out

    async def stats(self, handle: ContainerHandle) -> ContainerStats | None:
        rc, out, _ = await self._run("stats", "--no-stream", "--format", "json", handle.id)
        if rc != 0:
            return None
        try:
            rows = json.loads(out)
        except ValueError:
            return None
        if not rows:
            return None
        row = rows[0]
        mem = parse_size(str(row.get("mem_usage", "")).split("/")[0]) or 0
        cpu_s = parse_go_duration(str(row.get("cpu_time", "")))
        c = self._containers.get(handle.id)
        now = self.clock.monotonic()
        millis: float
        if c is not None and cpu_s is not None and c.last_cpu is not None and now > c.last_cpu[1]:
            millis = max(0.0, cpu_s - c.last_cpu[0]) / (now - c.last_cpu[1]) * 1000.0
        else:
            pct = str(row.get("cpu_percent", "0")).rstrip("%") or "0"
            try:
                millis = float(pct) * 10.0
            except ValueError:
                millis = 0.0
        if c is not None and cpu_s is not None:
            c.last_cpu = (cpu_s, now)
        return ContainerStats(cpu_millis=millis, memory_bytes=mem)

    # --- forget -----------------------------------------------------------------------

    async def remove(self, handle: ContainerHandle) -> None:
        c = self._containers.pop(handle.id, None)
        if c is not None:
            c.stopping = True
        # A pending wait() sees `podman wait` return and answers "unknown".
        await self._run("rm", "-f", "-t", "0", "--ignore", handle.id)

    async def close(self) -> None:
        for c in self._containers.values():
            if c.waiter is not None and not c.waiter.done():
                c.waiter.cancel()
        self._containers.clear()


def _podman_error(err: str) -> str:
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    return (errors[-1] if errors else lines[-1]) if lines else ""


class SubnetInUse(PodNetworkUnavailable):
    """The node's pod CIDR is taken on this host by a network that is in use."""


def _write_pause_tar(path: str) -> bool:
    """A one-file image: the host's static catatonit, which pauses (-P) as the sandbox."""
    binary = next((b for b in _CATATONIT if os.path.exists(b)), None)
    if binary is None:
        return False
    real = os.path.realpath(binary)
    with tarfile.open(path, "w") as tar:
        info = tar.gettarinfo(real, arcname="catatonit")
        info.mode = 0o755
        info.uid = info.gid = 0
        with open(real, "rb") as f:
            tar.addfile(info, f)
    return True


def _sandbox_ip(info: dict[str, Any]) -> str:
    settings = info.get("NetworkSettings") or {}
    for net in (settings.get("Networks") or {}).values():
        ip = (net or {}).get("IPAddress")
        if ip:
            return str(ip)
    return str(settings.get("IPAddress") or "")


def _spec_stub() -> ContainerSpec:
    return ContainerSpec("", "", "", "", "", [], [], {}, None)
