"""What the process runtime's sandbox of a container looks like, decided from the spec and
the machine: whom it runs as, which Linux capabilities it keeps, what its /etc/hosts says,
and the bubblewrap command line that builds its mount, PID, UTS and IPC namespaces.

Pure decisions (no I/O beyond reading what the caller hands in), so they are tested
without starting anything; process.py does the starting.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gpufleet.agent.runtime.base import HostAlias, Mount, RuntimeError_, SecuritySpec

# The capabilities a container's root keeps by default: containerd's (and so the kubelet's)
# default set.
DEFAULT_CAPABILITIES = (
    "CAP_AUDIT_WRITE",
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_MKNOD",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_RAW",
    "CAP_SETFCAP",
    "CAP_SETGID",
    "CAP_SETPCAP",
    "CAP_SETUID",
    "CAP_SYS_CHROOT",
)

# Every capability Linux defines, in the kernel's order (capability.h).
ALL_CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
)

# The device nodes a CUDA program needs besides its GPUs' own /dev/nvidia<N>.
NVIDIA_CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")

# /proc and /sys paths container runtimes hide (procMount: Default), as containerd does.
# (The paths they also make read-only, /proc/sys and the like, are so already for every
# user but the node's root, which only a privileged container is.)
MASKED_PATHS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)

DEFAULT_SHM_BYTES = 64 * 1024 * 1024
# What the UTS namespace accepts (HOST_NAME_MAX); Kubernetes caps pod hostnames at 63.
_HOSTNAME_MAX = 63


def capability_name(raw: str, field_path: str) -> str:
    """A Kubernetes capability name ("NET_ADMIN", also accepted as "CAP_NET_ADMIN") as
    Linux spells it."""
    name = raw.strip().upper()
    if not name.startswith("CAP_"):
        name = "CAP_" + name
    if name not in ALL_CAPABILITIES:
        raise RuntimeError_(
            f"{field_path}: unknown capability {raw!r} (Linux names such as NET_ADMIN or SYS_PTRACE)",
            "CreateContainerConfigError",
        )
    return name


def effective_capabilities(sec: SecuritySpec) -> tuple[str, ...]:
    """The capabilities a root container keeps: the default set less what it drops
    ("ALL" drops every one), plus what it adds ("ALL" adds every one)."""
    drop = {d.strip().upper() for d in sec.capabilities_drop}
    add = {a.strip().upper() for a in sec.capabilities_add}
    caps: set[str] = set() if "ALL" in drop else set(DEFAULT_CAPABILITIES)
    for d in drop - {"ALL"}:
        caps.discard(capability_name(d, "securityContext.capabilities.drop"))
    if "ALL" in add:
        caps = set(ALL_CAPABILITIES)
    for a in add - {"ALL"}:
        caps.add(capability_name(a, "securityContext.capabilities.add"))
    return tuple(c for c in ALL_CAPABILITIES if c in caps)


@dataclass(frozen=True)
class Identity:
    """Whom a container runs as.

    mode "host": the uid/gid are the node's; "userns": uid 0 inside a user namespace whose
    root is the unprivileged default user on the node; "agent": the agent's own user (an
    agent that is not root cannot switch users)."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    mode: Literal["host", "userns", "agent"]
    # What a root container keeps (None: every capability, for a privileged one); empty for
    # other users, who lose every capability when they become themselves.
    capabilities: tuple[str, ...] | None
    home: str
    # The node's uid/gid that stand for root in "userns" mode.
    outer_uid: int = 0
    outer_gid: int = 0

    @property
    def is_root(self) -> bool:
        return self.uid == 0


@dataclass(frozen=True)
class Passwd:
    """The node's account of a uid, as far as it has one."""

    name: str
    gid: int
    home: str
    groups: tuple[int, ...] = ()


def resolve_identity(
    sec: SecuritySpec,
    *,
    default_user: tuple[int, int],
    agent_uid: int,
    agent_gid: int,
    userns_available: bool,
    lookup: dict[int, Passwd] | None = None,
    pod: str = "",
    container: str = "",
) -> Identity:
    """The container's user from its securityContext. Refuses what cannot be honoured
    safely with Kubernetes' words (runAsNonRoot) or a RuntimeError_ naming the fix."""
    lookup = lookup or {}
    who = f"(pod: {pod!r}, container: {container})"
    if agent_uid != 0:
        # Everything runs as the agent's user; the agent tells the pod run-as-user is not
        # honoured. runAsNonRoot still holds: the agent's user is not root.
        pw = lookup.get(agent_uid)
        return Identity(
            agent_uid, agent_gid, (), "agent", (), pw.home if pw else os.environ.get("HOME", "/")
        )
    if sec.run_as_non_root and sec.run_as_user == 0:
        raise RuntimeError_(f"container's runAsUser breaks non-root policy {who}", "CreateContainerConfigError")
    if sec.run_as_user is not None:
        uid = sec.run_as_user
    elif sec.privileged:
        uid = 0
    else:
        uid = default_user[0]
    if sec.run_as_non_root and uid == 0:
        raise RuntimeError_(
            f"container has runAsNonRoot and image will run as root {who}", "CreateContainerConfigError"
        )
    pw = lookup.get(uid)
    if sec.run_as_group is not None:
        gid = sec.run_as_group
    elif uid == 0:
        gid = 0
    elif sec.run_as_user is None:
        gid = default_user[1]
    else:
        # The node's primary group of that user; a uid the node does not know gets the
        # unprivileged default group rather than root's.
        gid = pw.gid if pw else default_user[1]
    groups: list[int] = []
    # supplementalGroupsPolicy Merge (Kubernetes' default): the groups the node's
    # /etc/group gives the user, then the pod's.
    for g in (*(pw.groups if pw else ()), *sec.supplemental_groups, *(() if sec.fs_group is None else (sec.fs_group,))):
        if g != gid and g not in groups:
            groups.append(g)
    home = pw.home if pw else "/"
    if uid != 0:
        return Identity(uid, gid, tuple(groups), "host", (), home)
    if sec.privileged:
        return Identity(0, gid, tuple(groups), "host", None, "/root" if not pw else pw.home)
    if not userns_available:
        raise RuntimeError_(
            f"runAsUser 0 needs securityContext.privileged: true on this node: the node does not allow "
            f"user namespaces, so root inside the container would be root on the node {who}; "
            "set runAsUser to a non-zero uid",
            "CreateContainerConfigError",
        )
    return Identity(
        0,
        0,
        (),
        "userns",
        effective_capabilities(sec),
        "/root",
        outer_uid=default_user[0],
        outer_gid=default_user[1],
    )


def hostname_for(name: str) -> str:
    return name[:_HOSTNAME_MAX].rstrip("-.") or "pod"


def hosts_file(hostname: str, address: str, aliases: Sequence[HostAlias], node_hosts: str = "") -> str:
    """The pod's /etc/hosts: the kubelet's managed header, the pod's name at the node's
    address (pods share the node's network), the node's own entries (names HPC clusters
    keep there), and spec.hostAliases."""
    lines = [
        "# Kubernetes-managed hosts file (host network).",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "fe00::0\tip6-localnet",
        "fe00::0\tip6-mcastprefix",
        "fe00::1\tip6-allnodes",
        "fe00::2\tip6-allrouters",
        f"{address}\t{hostname}",
    ]
    node_lines = []
    for raw in node_hosts.splitlines():
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        ip = text.split()[0]
        if ip.startswith(("127.", "fe00:", "ff0", "::1")):
            continue
        node_lines.append(raw.strip())
    if node_lines:
        lines += ["", "# Entries from the node's /etc/hosts.", *node_lines]
    if aliases:
        lines += ["", "# Entries added by HostAliases."]
        lines += [f"{a.ip}\t{' '.join(a.hostnames)}" for a in aliases]
    return "\n".join(lines) + "\n"


def resolv_conf(servers: Sequence[str], node_resolv: str = "") -> str:
    """nameserver lines first; the node's search and options kept."""
    kept = [ln for ln in node_resolv.splitlines() if ln.split()[:1] in (["search"], ["options"], ["domain"])]
    return "\n".join([*(f"nameserver {s}" for s in servers), *kept]) + "\n"


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass
class RootEntry:
    """One entry of the node's / as the sandbox shows it (read-only)."""

    path: str
    kind: Literal["dir", "file", "symlink"]
    target: str = ""


# The sandbox makes its own of these.
_OWN_TOP = ("proc", "dev", "tmp")


def root_entries(listing: Iterable[tuple[str, str, str]]) -> list[RootEntry]:
    """From (name, kind, symlink target) of the node's / entries."""
    out = []
    for name, kind, target in sorted(listing):
        if name in _OWN_TOP:
            continue
        if kind == "symlink":
            out.append(RootEntry("/" + name, "symlink", target))
        elif kind in ("dir", "file"):
            out.append(RootEntry("/" + name, kind))  # type: ignore[arg-type]
    return out


@dataclass
class ExpandedDir:
    """A read-only node directory that a mount point must be made in: shown as a tmpfs of
    its mode with each of its entries bound onto it read-only (as the root is), so the new
    mount point lives on the tmpfs and the node's directory itself is never written."""

    path: str
    mode: int
    entries: list[RootEntry]


def expansion_chain(real: str) -> list[str]:
    """The directories from the top level down to ``real`` (a node path), parents first."""
    parts = [p for p in real.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def child_entries(path: str, listing: Iterable[tuple[str, str, str]]) -> list[RootEntry]:
    out = []
    for name, kind, target in sorted(listing):
        full = path.rstrip("/") + "/" + name
        if kind == "symlink":
            out.append(RootEntry(full, "symlink", target))
        elif kind in ("dir", "file"):
            out.append(RootEntry(full, kind))  # type: ignore[arg-type]
    return out


@dataclass
class Plan:
    """Everything the bubblewrap command line needs, decided by the runtime."""

    hostname: str
    root: list[RootEntry]
    tmp_dir: str  # on the node: the container's private /tmp
    hosts_path: str
    hostname_path: str
    resolv_path: str | None = None
    # The pod's shared /dev/shm on the node; None: a private tmpfs of shm_bytes.
    shm_dir: str | None = None
    shm_bytes: int = DEFAULT_SHM_BYTES
    devices: list[str] = field(default_factory=list)  # node paths, shown as /dev/<name>
    # Node paths every container sees read-write at the same place.
    shared: list[str] = field(default_factory=list)
    # (node path, is a directory) shown empty.
    hidden: list[tuple[str, bool]] = field(default_factory=list)
    mounts: list[Mount] = field(default_factory=list)
    # (container path, is a directory): hidden paths as they appear through a volume.
    hidden_in_mounts: list[tuple[str, bool]] = field(default_factory=list)
    # An empty read-only file on the node, shown in place of hidden and masked files.
    empty_file: str = "/dev/null"
    privileged: bool = False
    read_only_root: bool = False
    mask_proc: bool = True
    masked: list[tuple[str, bool]] = field(default_factory=list)  # (path, is a directory)
    cwd: str = "/tmp"
    make_cwd: bool = False
    status_fd: int | str = "@STATUS_FD@"
    block_fd: int | str = "@BLOCK_FD@"
    # Node directories shown as tmpfs copies so mount points can be made in them (parents first).
    expanded: list[ExpandedDir] = field(default_factory=list)


def bwrap_args(bwrap: str, plan: Plan) -> list[str]:
    """bwrap's options, up to and including the "--" before the command.

    The root is bwrap's own tmpfs with the node's top-level entries bound read-only onto
    it (rather than one read-only bind of /), so a volume can be mounted at a new
    top-level path. The order matters: later mounts cover earlier ones, so hidden paths
    come after the shared ones (the agent's state inside a shared scratch directory stays
    hidden) and the pod's volumes last."""
    a = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-uts", "--unshare-ipc"]
    a += ["--hostname", plan.hostname]
    expanded = {e.path: e for e in plan.expanded}

    def show(e: RootEntry) -> None:
        if e.path in expanded and e.kind == "dir":
            ed = expanded[e.path]
            a.extend(["--perms", f"{ed.mode & 0o7777:04o}", "--tmpfs", e.path])
            for child in ed.entries:
                show(child)
        elif e.kind == "symlink":
            a.extend(["--symlink", e.target, e.path])
        elif plan.privileged and e.path == "/sys":
            a.extend(["--bind", e.path, e.path])
        else:
            a.extend(["--ro-bind", e.path, e.path])

    for e in plan.root:
        show(e)
    a += ["--proc", "/proc"]
    if plan.privileged:
        a += ["--dev-bind", "/dev", "/dev"]
    else:
        a += ["--dev", "/dev"]
        for dev in plan.devices:
            a += ["--dev-bind", dev, "/dev/" + os.path.basename(dev)]
    if plan.shm_dir is not None:
        a += ["--bind", plan.shm_dir, "/dev/shm"]
    else:
        a += ["--perms", "1777", "--size", str(plan.shm_bytes), "--tmpfs", "/dev/shm"]
    a += ["--ro-bind" if plan.read_only_root else "--bind", plan.tmp_dir, "/tmp"]
    if plan.mask_proc and not plan.privileged:
        for path, is_dir in plan.masked:
            a += ["--tmpfs", path, "--remount-ro", path] if is_dir else ["--ro-bind", plan.empty_file, path]
    for path in plan.shared:
        a += ["--bind", path, path]
    for path, is_dir in plan.hidden:
        a += ["--tmpfs", path, "--remount-ro", path] if is_dir else ["--ro-bind", plan.empty_file, path]
    a += ["--ro-bind", plan.hosts_path, "/etc/hosts", "--ro-bind", plan.hostname_path, "/etc/hostname"]
    if plan.resolv_path:
        a += ["--ro-bind", plan.resolv_path, "/etc/resolv.conf"]
    made: set[str] = set()
    for m in plan.mounts:
        # bwrap (0.8) makes missing parents of a mount point 0700: made 0755 here first
        # (where they exist already this changes nothing).
        parent = os.path.dirname(m.container_path.rstrip("/"))
        chain = []
        while parent not in ("/", ""):
            chain.append(parent)
            parent = os.path.dirname(parent)
        for d in reversed(chain):
            if d not in made:
                made.add(d)
                a += ["--perms", "0755", "--dir", d]
        a += ["--ro-bind" if m.read_only else "--bind", m.host_path, m.container_path]
    for path, is_dir in plan.hidden_in_mounts:
        a += ["--tmpfs", path, "--remount-ro", path] if is_dir else ["--ro-bind", plan.empty_file, path]
    for ed in reversed(plan.expanded):
        a += ["--remount-ro", ed.path]
    if plan.read_only_root:
        a += ["--remount-ro", "/"]
    if plan.make_cwd:
        a += ["--dir", plan.cwd]
    a += ["--chdir", plan.cwd]
    a += ["--json-status-fd", str(plan.status_fd), "--block-fd", str(plan.block_fd), "--"]
    return a


def _caps_arg(caps: Sequence[str]) -> str:
    return ",".join(["-all", *("+" + c.removeprefix("CAP_").lower() for c in caps)])


def user_chain(ident: Identity, *, setpriv: str, unshare: str, for_exec: bool = False) -> list[str]:
    """The programs between the sandbox and the container's command that make it the
    container's user (each execs the next, so the command keeps their pid).

    setpriv (util-linux) rather than bwrap's --uid: bwrap switches users only inside a
    user namespace, which cannot hold the node's own uids and supplementary groups (what
    volumes and shared filesystems are owned by). For exec (nsenter has already entered
    the container's user namespace, if any) the chain also sets no_new_privs, which the
    sandbox's processes get from bwrap."""
    nnp = ["--no-new-privs"] if for_exec else []
    if ident.mode == "agent":
        return [setpriv, *nnp, "--"] if for_exec else []
    if ident.mode == "userns":
        drop_to_root = [setpriv, "--inh-caps=-all", f"--bounding-set={_caps_arg(ident.capabilities or ())}", *nnp, "--"]
        if for_exec:
            return drop_to_root
        return [
            setpriv,
            f"--reuid={ident.outer_uid}",
            f"--regid={ident.outer_gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
            unshare,
            "--user",
            "--map-root-user",
            "--",
            *drop_to_root,
        ]
    groups = ["--groups=" + ",".join(str(g) for g in ident.groups)] if ident.groups else ["--clear-groups"]
    if ident.uid == 0:
        # A privileged container: root on the node with every capability.
        return [setpriv, *groups, *nnp, "--"] if (ident.groups or for_exec) else []
    bounding = [] if ident.capabilities is None else ["--bounding-set=-all"]
    return [
        setpriv,
        f"--reuid={ident.uid}",
        f"--regid={ident.gid}",
        *groups,
        "--inh-caps=-all",
        *bounding,
        *nnp,
        "--",
    ]


def view_to_node(path: str, *, mounts: Sequence[Mount], shared: Sequence[str], hidden: Sequence[str], tmp_dir: str) -> str | None:
    """Where a path inside the sandbox lives on the node (None: nowhere the node can look,
    e.g. under a hidden path). Later mounts cover earlier ones, as in bwrap_args."""
    for m in reversed(list(mounts)):
        if _under(path, m.container_path):
            return m.host_path + path[len(m.container_path.rstrip("/")):]
    for h in hidden:
        if _under(path, h):
            return None
    for s in shared:
        if _under(path, s):
            return path
    if _under(path, "/tmp"):
        return tmp_dir + path[len("/tmp"):]
    return path


def visible_hidden(hidden: Iterable[str], shared: Sequence[str]) -> list[str]:
    """The hidden paths a sandbox would otherwise show: the node's /tmp, /proc and /dev
    are the sandbox's own, so what lies there is invisible already (unless shared)."""
    out = []
    for h in hidden:
        h = os.path.normpath(h)
        if any(_under(h, s) for s in shared) or not any(_under(h, t) for t in ("/tmp", "/proc", "/dev")):
            if h != "/" and h not in out:
                out.append(h)
    return out
