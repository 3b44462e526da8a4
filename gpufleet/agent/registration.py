"""The agent's Node and Lease: the devices it found, registering the Node, keeping its status
and labels current, and renewing the Lease that says it is alive."""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

from gpufleet.agent import node
from gpufleet.client import (
    AlreadyExists,
    ApiError,
    NotFound,
    TransportError,
)

log = logging.getLogger(__name__)

# Node label: "nvml" (GPUs found by NVML) or "declared" (--gpus, --gpu-inventory, simulated).
INVENTORY_LABEL = "gpufleet.io/inventory"


class RegistrationMixin:
    """NodeAgent's devices, Node registration and heartbeat (see agent.py)."""

    # -- devices ------------------------------------------------------------------------

    async def _call_devices(self, method: str, *args: Any) -> Any:
        fn = getattr(self.devices, method)
        # NVML calls block for milliseconds; keep them off the event loop.
        if getattr(self.devices, "name", "") == "nvml":
            result = await asyncio.to_thread(fn, *args)
        else:
            result = fn(*args)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _fingerprint_raw(self) -> list[Any]:
        try:
            return list(await self._call_devices("fingerprint"))
        except Exception:
            log.exception("agent %s: fingerprinting GPUs failed", self.name)
            return list(self._gpus)

    async def _fingerprint(self) -> list[Any]:
        """The GPUs as found, fenced ones reported Unhealthy (gpuhealthloop.py)."""
        return self._overlay_health(await self._fingerprint_raw())

    async def _reserve(self, indices: list[int]) -> dict[str, str]:
        return dict(await self._call_devices("reserve", list(indices)))

    async def _serving_credentials(self) -> Any:
        """The serving certificate (kept, or asked for), waiting while the API is unreachable."""
        from gpufleet.agent.servingcert import ensure_serving

        backoff = 0.2
        while True:
            try:
                return await ensure_serving(self.client, self.name, self.state_dir)
            except TransportError as exc:
                log.warning("agent %s: cannot reach the API for a serving certificate (%s); retrying in %.1fs",
                            self.name, exc, backoff)
                await self.clock.sleep(backoff)
                backoff = min(backoff * 2, self.config.api_retry_max)

    def _gpu_labels(self) -> dict[str, str]:
        from gpufleet.agent.devices import node_gpu_labels

        # Where the GPU count comes from: NVML's inventory, or what the agent was told
        # (--gpus, --gpu-inventory). The API server bounds either with --max-node-gpus.
        source = "nvml" if getattr(self.devices, "name", "") == "nvml" else "declared"
        return {**node_gpu_labels(self._gpus), INVENTORY_LABEL: source}

    def _gpu_annotation(self) -> str:
        from gpufleet.agent.devices import node_gpu_annotation

        return node_gpu_annotation(self._gpus)

    def _allocatable(self) -> dict[str, Any]:
        if self.settings is None:
            return {}
        return node.resources(self.settings, self._gpus)[1]

        self._last_status = None
        self._last_meta = None

    async def _node_loop(self) -> None:
        backoff = 0.2
        while True:
            try:
                if self._need_register:
                    await self._register()
                await self._renew_lease()
                await self._sync_node()
                self._registered.set()
                backoff = 0.2
                await self._nap(self.config.heartbeat_interval)
            except asyncio.CancelledError:
                raise
            except NotFound:
                self._need_register = True
                continue
            except (TransportError, ApiError) as exc:
                log.warning("agent %s: cannot reach the API (%s); retrying in %.1fs", self.name, exc, backoff)
                await self.clock.sleep(backoff)
                backoff = min(backoff * 2, self.config.api_retry_max, self.config.heartbeat_interval)
            except Exception:
                log.exception("agent %s: heartbeat failed", self.name)
                await self.clock.sleep(self.config.heartbeat_interval)

    async def _nap(self, seconds: float) -> None:
        """Sleep until the next heartbeat, or until something (a GPU fenced) asks for the Node
        to be written now."""
        if self._node_dirty.is_set():
            self._node_dirty.clear()
            return
        waiter = asyncio.ensure_future(self._node_dirty.wait())
        sleeper = asyncio.ensure_future(self.clock.sleep(seconds))
        try:
            await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            sleeper.cancel()
        self._node_dirty.clear()

    async def _register(self) -> None:
        assert self.settings is not None
        self._gpus = await self._fingerprint()
        now = self.clock.now()
        try:
            current = await self.client.get("nodes", self.name, raw=True)
        except NotFound:
            current = None
        if current is None:
            body = node.new_node(self.settings, self._gpus, self._gpu_labels(), self._gpu_annotation(), now)
            try:
                created = await self.client.create(body, raw=True)
            except AlreadyExists:
                return  # registered by an earlier attempt that timed out; the next pass updates it
            self._node_uid = created["metadata"].get("uid")
            self._last_status = created.get("status")
            self._last_status_at = self.clock.monotonic()
            self._last_meta = self._wanted_meta()
            log.info("agent %s: registered the node", self.name)
        else:
            self._node_uid = current["metadata"].get("uid")
            self._last_meta = None
            self._last_status = None
            self._restore_gpu_health(current)
            await self._sync_node(current)
            log.info("agent %s: the node was already registered; updated it", self.name)
        self._need_register = False

    def _wanted_meta(self) -> dict[str, Any]:
        assert self.settings is not None
        return {"labels": node.node_labels(self.settings, self._gpu_labels()),
                "annotations": {node.GPUS_ANNOTATION: self._gpu_annotation(), **self._gpu_health_meta()}}

    async def _sync_node(self, current: dict[str, Any] | None = None) -> None:
        """Labels and GPU annotation when they changed, status when it changed or is due."""
        assert self.settings is not None
        self._gpus = gpus = await self._fingerprint()
        # Metadata and status are both worked out before the first write: a GPU's health can
        # change while a write is in flight, and the Node must never show the newer status
        # (allocatable, condition) beside the older health annotation.
        meta = self._wanted_meta()
        cached = current or (self._node_informer.get(self.name) if self._node_informer else None)
        existing = (cached or {}).get("status") or self._last_status or {}
        status = node.node_status(self.settings, gpus, existing, self.clock.now())
        gpu_condition = self._gpu_health_condition(existing.get("conditions") or [], self.clock.now())
        if gpu_condition is not None:
            status["conditions"].append(gpu_condition)
        # Conditions other components own (NetworkUnavailable, ...) stay as they are.
        mine = {c["type"] for c in status["conditions"]}
        status["conditions"] += [c for c in existing.get("conditions") or [] if c.get("type") not in mine]
        patched = None
        if meta != self._last_meta:
            patched = await self.client.patch("nodes", self.name, {"metadata": meta}, raw=True)
            self._last_meta = meta
        # The taint is written against the newest copy (a stale resourceVersion is refused).
        newest = patched if isinstance(patched, dict) else cached
        due = self.clock.monotonic() - self._last_status_at >= self.config.node_status_report_interval
        cached_ready = next((c.get("status") for c in existing.get("conditions") or []
                             if c.get("type") == "Ready"), None)
        changed = (self._last_status is None or node.comparable(status) != node.comparable(self._last_status)
                   or cached_ready not in (None, "True"))
        await self._sync_gpu_taint(newest, gpus)
        if not (changed or due):
            return
        await self.client.patch("nodes", self.name, {"status": status}, subresource="status", raw=True)
        self._last_status = status
        self._last_status_at = self.clock.monotonic()

    async def _renew_lease(self) -> None:
        now = self.clock.now()
        lease = node.new_lease(self.name, self._node_uid, self.config.lease_duration_seconds, now)
        if self._lease_exists:
            try:
                await self.client.patch("leases", self.name, {"spec": lease["spec"]}, node.LEASE_NAMESPACE,
                                        raw=True)
                return
            except NotFound:
                self._lease_exists = False
        try:
            await self.client.create(lease, node.LEASE_NAMESPACE, raw=True)
        except AlreadyExists:
            # Left by an earlier run, maybe owned by a Node object that was since replaced.
            patch = {"spec": lease["spec"]}
            if "ownerReferences" in lease["metadata"]:
                patch["metadata"] = {"ownerReferences": lease["metadata"]["ownerReferences"]}
            await self.client.patch("leases", self.name, patch, node.LEASE_NAMESPACE, raw=True)
        self._lease_exists = True

    # -- pods -----------------------------------------------------------------------------
