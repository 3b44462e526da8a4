"""What the podman runtime says to podman and reads back: names and labels, image references
and auth files, the `podman run` arguments (security, GPUs, environment), and parsers
for podman's times, durations and sizes."""

import json
import logging
import os
import re
import tarfile
from datetime import datetime
from pathlib import Path
from typing import Any

from gpufleet.agent.runtime.base import (
    ContainerSpec,
    PodNetworkUnavailable,
    RegistryAuth,
    SandboxSpec,
    SecuritySpec,
)
from gpufleet.agent.runtime.gpuenv import CUDA_VISIBLE_DEVICES, cdi_device, gpu_env

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


def container_name(spec: ContainerSpec, owner: str = "") -> str:
    """gpufleet-<namespace>-<pod>-<container>-<attempt>: readable in ``podman ps``, unique
    on the node (two namespaces may hold pods of the same name). With ``owner`` (the agent's
    label) it is unique on the machine too, for a name another agent's container holds."""
    raw = f"gpufleet-{owner + '-' if owner else ''}{spec.namespace}-{spec.pod_name}-{spec.name}-{spec.attempt}"
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
