"""Pods of the podman runtime: the node's pod network, the pause image and the sandbox
container that holds a pod's namespaces."""

import json
import logging
import os
import tempfile

from gpufleet.agent.runtime.base import (
    RuntimeError_,
    SandboxHandle,
    SandboxSpec,
)
from gpufleet.agent.runtime.podman_args import (
    _SANDBOX_ROLE,
    LABEL_PREFIX,
    PAUSE_IMAGE,
    SubnetInUse,
    _podman_error,
    _sandbox_ip,
    _write_pause_tar,
    sandbox_name,
)

log = logging.getLogger(__name__)

class SandboxMixin:
    """PodmanRuntime's network and pod sandboxes (see podman.py)."""

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
