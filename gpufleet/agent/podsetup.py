"""What a pod needs before its containers start: its GPUs and host ports, its volumes and
its sandbox, each waited for with a reason while it cannot be had."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

from gpufleet.agent import podspec, podsync
from gpufleet.agent.podcontext import WARNING, ContainerRecord, WorkerContext
from gpufleet.agent.resources import (
    HOST_PORTS_ANNOTATION,
    PortsUnavailable,
    parse_host_ports,
    port_requests,
    split_gpus,
)
from gpufleet.agent.runtime.base import (
    PortMapping,
    RuntimeError_,
    SandboxSpec,
)
from gpufleet.api.gpu import GPU_INDICES_ANNOTATION, format_gpu_indices, parse_gpu_indices
from gpufleet.api.podresources import pod_gpu_request
from gpufleet.client import ApiError, TransportError

log = logging.getLogger("gpufleet.agent.podworker")


class PodSetup:
    """The setup acts of PodWorker (mixed into it)."""

    ctx: WorkerContext
    pod: dict[str, Any]
    records: list[ContainerRecord]

    # -- volumes and the sandbox ----------------------------------------------------------

    async def _setup_volumes(self) -> bool:
        """Every volume ready (and config maps, secrets, tokens refreshed); False while one
        cannot be: the containers wait in ContainerCreating with the reason in an Event."""
        vm = self.ctx.volumes
        if vm is None:
            return True
        from gpufleet.agent.volumes import VolumeError

        try:
            self.pod_volumes = await vm.setup(self.pod)
        except VolumeError as exc:
            return self._volume_failed(exc.reason or "FailedMount", exc.message or str(exc))
        except (TransportError, ApiError) as exc:
            return self._volume_failed("FailedMount", f"cannot read the pod's volume sources: {exc}")
        for notice in getattr(self.pod_volumes, "notices", None) or []:
            if notice not in self.told_notices:
                self.told_notices.add(notice)
                self._event(WARNING, "VolumeNotice", notice)
        if self.volume_error is not None:
            self.volume_error = None
            self._unblock(("ContainerCreating",))
        return True

    def _volume_failed(self, reason: str, message: str) -> bool:
        if self.volume_error != (reason, message):
            self._event(WARNING, reason, message)
        self.volume_error = (reason, message)
        for rec in self.records:
            if not rec.ran and not rec.running:
                rec.state = self._unblocked(rec)
        return False

    def _unblocked(self, rec: ContainerRecord) -> dict[str, Any]:
        reason = podsync.initial_state(rec.init, self._has_init())["waiting"]["reason"]
        return podsync.transition(rec.state, "unblocked", reason)

    def _unblock(self, reasons: tuple[str, ...]) -> None:
        for rec in self.records:
            if (rec.state.get("waiting") or {}).get("reason") in reasons:
                rec.state = self._unblocked(rec)

    def uses_host_network(self) -> bool:
        return bool((self.pod.get("spec") or {}).get("hostNetwork")) or self.ctx.host_network

    async def _ensure_sandbox(self) -> bool:
        if self.sandbox is not None:
            return True
        ctx = self.ctx
        spec = self.pod.get("spec") or {}
        if not spec.get("hostNetwork") and not ctx.network_ready():
            self.blocked = ("NetworkNotReady", "the node's pod network is not ready yet")
            return False
        api = ctx.api_endpoint(self.uses_host_network())
        shm = ctx.volumes.shm_size(self.pod) if ctx.volumes is not None else None
        root = ctx.sandbox_root or (ctx.state_dir / "sandboxes")
        sandbox = SandboxSpec(
            pod_uid=self.uid, pod_name=self.name, namespace=self.namespace,
            hostname=podspec.pod_hostname(self.pod), directory=str(root / self.uid),
            host_network=bool(spec.get("hostNetwork")), host_pid=bool(spec.get("hostPID")),
            host_ipc=bool(spec.get("hostIPC")), shm_size_bytes=shm,
            ports=[PortMapping(r.name or r.key, r.container_port, int(r.host_port), r.protocol)
                   for r in port_requests(self.pod) if r.host_port],
            hosts=podspec.host_aliases(self.pod, api[0] if api else None),
            sysctls=podspec.sysctls(self.pod), gpus=list(self.gpu_indices or []),
            labels={"node": ctx.node_name},
        )
        try:
            self.sandbox = await ctx.runtime.run_sandbox(sandbox)
        except RuntimeError_ as exc:
            message = f"Failed to create pod sandbox: {exc}"
            if self.blocked != ("FailedCreatePodSandBox", message):
                self._event(WARNING, "FailedCreatePodSandBox", message)
            self.blocked = ("FailedCreatePodSandBox", message)
            return False
        if self.blocked is not None and self.blocked[0] == "FailedCreatePodSandBox":
            self.blocked = None
        self._tell_unhonoured()
        return True

    @property
    def pod_ip(self) -> str:
        if self.sandbox is not None and self.sandbox.ip:
            return self.sandbox.ip
        return self.ctx.address

    def _tell_unhonoured(self) -> None:
        """What the node's runtime cannot do for this pod, said once as an Event and kept
        as a condition, never silently dropped."""
        if self.told_unhonoured:
            return
        self.told_unhonoured = True
        runtime = self.ctx.runtime
        caps = getattr(runtime, "capabilities", frozenset())
        honoured = getattr(runtime, "image_honoured", None)
        images = {str(r.spec.get("image") or "") for r in self.records}
        host_image = honoured is not None and all(honoured(i) for i in images)
        problems = podspec.unhonoured(self.pod, caps, host_image)
        self.unhonoured = problems
        if problems:
            self._event(WARNING, "RuntimeLimitation", f"the {runtime.name} runtime: " + "; ".join(problems))

    async def _teardown_sandbox(self) -> None:
        if self.sandbox is not None:
            with contextlib.suppress(Exception):
                await self.ctx.runtime.stop_sandbox(self.sandbox)
            with contextlib.suppress(Exception):
                await self.ctx.runtime.remove_sandbox(self.sandbox)
            self.sandbox = None
        if self.ctx.volumes is not None:
            with contextlib.suppress(Exception):
                await self.ctx.volumes.teardown(self.uid)

    # -- resources ----------------------------------------------------------------------

    async def _acquire(self) -> bool:
        """GPUs and host ports for the pod, once; False (and a waiting reason) while what it
        needs is held by another pod."""
        if self.gpu_indices is not None and self.ports is not None:
            return True
        ctx = self.ctx
        ann = (self.pod.get("metadata") or {}).get("annotations") or {}
        need = pod_gpu_request(self.pod)
        gpus = ctx.gpus()
        known = {g.index: g for g in gpus}
        if self.gpu_indices is None:
            text = (ann.get(GPU_INDICES_ANNOTATION) or "").strip()
            # The agent's own validation pod for a fenced GPU: given that GPU, and only it.
            validating = ctx.validation_gpu(self.pod)
            if validating is not None:
                if validating not in known:
                    return self._blocked("GPUsUnavailable", f"GPU {validating} does not exist on node {ctx.node_name}")
                indices = [validating]
            elif text:
                indices = list(parse_gpu_indices(text))
                missing = [i for i in indices if i not in known]
                if missing:
                    return self._blocked("GPUsUnavailable", f"GPU {missing[0]} does not exist on node {ctx.node_name}")
                fenced = [i for i in indices if getattr(known[i], "health", "Healthy") != "Healthy"]
                if fenced:
                    # Bound to a GPU fenced after the scheduler chose it: the pod can never run
                    # here, so it fails (as the kubelet rejects a pod whose devices it cannot
                    # allocate) and its controller makes another, placed on a healthy GPU.
                    bad = known[fenced[0]]
                    why = getattr(bad, "health_reason", "") or "unhealthy"
                    self.fail_for_gpu(f"GPU {bad.index} ({bad.uuid}) on node {ctx.node_name}, assigned to the pod, "
                                      f"is fenced: {why}")
                    return False
                if len(indices) < need:
                    return self._blocked("GPUsUnavailable", f"the pod requests {need} GPUs but its "
                                         f"{GPU_INDICES_ANNOTATION} annotation names {len(indices)}")
            elif need:
                chosen = ctx.gpu_table.choose(self.uid, need, gpus)
                if chosen is None:
                    free = len([g for g in gpus if ctx.gpu_table.owner.get(g.index, self.uid) == self.uid])
                    return self._blocked("GPUsUnavailable", f"the pod requests {need} GPUs, {free} of "
                                         f"{len(gpus)} are free on node {ctx.node_name}")
                indices = chosen
                self.chose_gpus = True
            else:
                indices = []
            conflicts = ctx.gpu_table.conflicts(self.uid, indices)
            if conflicts:
                index, holder = sorted(conflicts.items())[0]
                return self._blocked("GPUsUnavailable", f"GPU {index} is in use by pod {ctx.describe_uid(holder)}")
            ctx.gpu_table.acquire(self.uid, indices)
            self.gpu_indices = indices
            per_container = split_gpus(self.pod, indices) if validating is None else \
                {rec.name: list(indices) for rec in self.records}
            for rec in self.records:
                rec.gpus = per_container.get(rec.name, [])
                if rec.gpus:
                    self.gpu_env[rec.name] = dict(await ctx.reserve(rec.gpus))
                else:
                    # A container without GPUs must not see (and use) the node's.
                    self.gpu_env[rec.name] = {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}
        if self.ports is None:
            requests = port_requests(self.pod)
            if not self.uses_host_network():
                # In its own network namespace a pod listens on its container ports; only
                # hostPorts take a port of the node.
                requests = [r for r in requests if r.host_port]
            try:
                self.ports = ctx.port_table.allocate(self.uid, requests,
                                                     parse_host_ports(ann.get(HOST_PORTS_ANNOTATION)))
            except PortsUnavailable as exc:
                return self._blocked("PortsUnavailable", str(exc))
        if self.blocked is not None:
            self.blocked = None
            for rec in self.records:
                if (rec.state.get("waiting") or {}).get("reason") in ("GPUsUnavailable", "PortsUnavailable"):
                    rec.state = self._unblocked(rec)
        return True

    def _blocked(self, reason: str, message: str) -> bool:
        if self.blocked != (reason, message):
            self._event(WARNING, reason, message)
        self.blocked = (reason, message)
        for rec in self.records:
            if not rec.ran:
                rec.state = podsync.transition(rec.state, "blocked", reason, message)
        return False

    async def _sync_metadata(self) -> None:
        """Record the host ports (and GPUs the agent picked itself) on the pod, once."""
        if self.metadata_synced and not self.chose_gpus:
            return
        ann = (self.pod.get("metadata") or {}).get("annotations")
        want: dict[str, str] = {}
        if self.ports and (ann or {}).get(HOST_PORTS_ANNOTATION) is None:
            want[HOST_PORTS_ANNOTATION] = json.dumps(self.ports, separators=(",", ":"), sort_keys=True)
        if self.chose_gpus and self.gpu_indices is not None and not (ann or {}).get(GPU_INDICES_ANNOTATION):
            want[GPU_INDICES_ANNOTATION] = format_gpu_indices(self.gpu_indices)
        if not want:
            self.metadata_synced = True
            self.chose_gpus = False
            return
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": self.uid}]
        if ann is None:
            ops.append({"op": "add", "path": "/metadata/annotations", "value": want})
        else:
            ops += [{"op": "add", "path": "/metadata/annotations/" + k.replace("~", "~0").replace("/", "~1"),
                     "value": v} for k, v in want.items()]
        try:
            await self.ctx.client.patch("pods", self.name, ops, self.namespace, patch_type="json", raw=True)
        except (TransportError, ApiError) as exc:
            log.info("%s: recording host ports failed (%s); will retry", self.key, exc)
            return
        self.metadata_synced = True
        self.chose_gpus = False
