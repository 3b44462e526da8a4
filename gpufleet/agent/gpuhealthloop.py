"""The agent's GPU health loop: poll the device plugin's health signals, fence the GPUs the
policy drains (out of allocatable and of the allocator, the pod on it stopped), tell it on the
Node (condition, Events, taint, history annotation) and bring a GPU back once a validation on
it passes. The state machine is gpuhealth.py; docs/gpu-health.md is the user's page.

Validation runs on the agent itself, as a process of its own given exactly that GPU (the
environment ``reserve`` makes for a container: CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES
naming its UUID), not as a pod: a fenced GPU is, by design, one no pod can be given, and the
check must not wait for a scheduler or compete with the queue. On declared GPUs the default
check is that the inventory says the GPU is healthy again (its drain-level signals are gone,
which every validation requires first); a configured command runs on top of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from typing import Any

from gpufleet.agent.gpuhealth import Change, HealthTracker
from gpufleet.api.gpuhealth import (
    GPU_CORDON_ANNOTATION,
    GPU_HEALTH_ANNOTATION,
    GPU_HEALTHY_CONDITION,
    GPU_UNHEALTHY_TAINT,
    format_cordon,
    parse_cordon,
    with_unhealthy_taint,
)
from gpufleet.client import ApiError, Conflict, TransportError
from gpufleet.utils.clock import rfc3339

log = logging.getLogger(__name__)

NORMAL, WARNING = "Normal", "Warning"
_EVENTS = {"fence": (WARNING, "GPUUnhealthy"), "warn": (WARNING, "GPUHealthWarning"), "held": (WARNING, "GPUHeld"),
           "validation-failed": (WARNING, "GPUValidationFailed"), "returned": (NORMAL, "GPUHealthy")}


def default_validation_command() -> list[str]:
    """On real GPUs: a short CUDA check (gpucheck.py: torch when it is installed, else nvidia-smi)."""
    return [sys.executable, "-m", "gpufleet.agent.gpucheck"]


class GPUHealthMixin:
    """NodeAgent's GPU health (see agent.py)."""

    gpu_health: HealthTracker

    def _node_ref(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "uid": self.name}}

    def _overlay_health(self, gpus: list[Any]) -> list[Any]:
        """The fingerprint with fenced GPUs reported Unhealthy: the allocatable count, the
        agent's allocator and the scheduler (through the gpus annotation) all skip them."""
        from dataclasses import replace

        out = []
        fenced = self.gpu_health.gpus
        for g in gpus:
            st = fenced.get(g.index)
            if st is not None and st.out and getattr(g, "health", "Healthy") == "Healthy":
                g = replace(g, health="Unhealthy", health_reason=st.message or st.reason or st.state)
            out.append(g)
        return out

    def _restore_gpu_health(self, node_obj: dict[str, Any]) -> None:
        """Once, at the first registration of this run: the fences the last run published."""
        if self._health_restored:
            return
        self._health_restored = True
        from gpufleet.api.gpuhealth import parse_health_annotation

        annotations = (node_obj.get("metadata") or {}).get("annotations") or {}
        record = parse_health_annotation(annotations.get(GPU_HEALTH_ANNOTATION))
        restored = self.gpu_health.restore(record, {g.index: g.uuid for g in self._gpus})
        if restored:
            log.info("agent %s: GPU(s) %s were fenced before the agent restarted; they stay fenced until "
                     "validated", self.name, ", ".join(map(str, restored)))
            self._gpus = self._overlay_health(self._gpus)

    async def _gpu_health_loop(self) -> None:
        interval = self.config.gpu_health_interval
        # After the first registration, which takes up the fences an earlier run published.
        await self._registered.wait()
        while True:
            try:
                await self._gpu_health_pass()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("agent %s: the GPU health poll failed", self.name)
            await self.clock.sleep(interval)

    async def _gpu_health_pass(self) -> None:
        signals = await self._call_devices("health_signals")
        generation = getattr(self.devices, "generation", None)
        if generation is not None and generation != self._devices_generation:
            # An inventory that changed may have more or fewer GPUs, or other models.
            self._devices_generation = generation
            self._gpus = await self._fingerprint()
            self._node_dirty.set()
        uuids = {g.index: g.uuid for g in self._gpus}
        node_obj = self._node_informer.get(self.name) if self._node_informer is not None else None
        annotations = ((node_obj or {}).get("metadata") or {}).get("annotations") or {}
        cordon = parse_cordon(annotations.get(GPU_CORDON_ANNOTATION)) if node_obj is not None else None
        now = self.clock.now()
        changes = self.gpu_health.observe(signals, uuids, cordon, now)
        for index in self.gpu_health.due_for_validation(now):
            self.gpu_health.state(index).validating = True
            task = asyncio.create_task(self._validate_gpu(index), name=f"agent:{self.name}:validate-gpu-{index}")
            self._health_tasks.add(task)
            task.add_done_callback(self._health_tasks.discard)
        await self._apply_health(changes)
        await self._publish_held(node_obj, cordon or set())

    async def _apply_health(self, changes: list[Change]) -> None:
        if not changes:
            return
        for c in changes:
            type_, reason = _EVENTS[c.kind]
            log.log(logging.INFO if type_ == NORMAL else logging.WARNING, "agent %s: %s", self.name, c.message)
            self.recorder.record_nowait(self._node_ref(), type_, reason, c.message)
            if c.kind == "fence" and c.evict:
                owner = self.gpu_table.owner.get(c.index)
                worker = self.workers.get(owner) if owner else None
                if worker is not None:
                    worker.fail_for_gpu(c.message)
        self._gpus = self._overlay_health(await self._fingerprint_raw())
        self._invalidate_stats()
        self._node_dirty.set()

    async def _publish_held(self, node_obj: dict[str, Any] | None, cordon: set[int]) -> None:
        """A GPU held out after repeated failures goes into the cordon annotation, where an
        operator's uncordon takes it out again."""
        missing = {i for i, st in self.gpu_health.gpus.items() if st.held and i not in cordon}
        if not missing or node_obj is None:
            return
        meta = node_obj.get("metadata") or {}
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                              "annotations": {GPU_CORDON_ANNOTATION: format_cordon(cordon | missing)}}}
        try:
            await self.client.patch("nodes", self.name, patch, raw=True)
        except (TransportError, ApiError) as exc:
            log.info("agent %s: recording held GPUs failed (%s); retrying", self.name, exc)

    async def _validate_gpu(self, index: int) -> None:
        st = self.gpu_health.state(index)
        self.recorder.record_nowait(self._node_ref(), NORMAL, "GPUValidating",
                                    f"validating GPU {index} ({st.uuid}) before it returns to service")
        try:
            ok, detail = await self._run_validation(index)
        except Exception as exc:  # a validation that cannot even start fails
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        await self._apply_health(self.gpu_health.validated(index, ok, detail, self.clock.now()))

    async def _run_validation(self, index: int) -> tuple[bool, str]:
        command = list(self.config.gpu_validation_command or [])
        if not command:
            if self.devices.name == "declared":
                return True, "the inventory reports it healthy"
            command = default_validation_command()
        env = dict(os.environ)
        env.update(await self._reserve([index]))
        env.update({"GPUFLEET_GPU_INDEX": str(index), "GPUFLEET_GPU_UUID": self.gpu_health.state(index).uuid})
        proc = await asyncio.create_subprocess_exec(*command, env=env, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.config.gpu_validation_timeout)
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            raise
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return False, f"{command[0]} did not finish within {self.config.gpu_validation_timeout:.0f}s"
        tail = (out or b"").decode(errors="replace").strip().splitlines()[-3:]
        words = " / ".join(tail)[:300]
        if proc.returncode == 0:
            return True, words or f"{os.path.basename(command[0])} passed"
        return False, f"exit code {proc.returncode}" + (f": {words}" if words else "")

    # -- the Node ------------------------------------------------------------------------------

    def _gpu_health_condition(self, existing: list[dict[str, Any]], now: float) -> dict[str, Any] | None:
        if not self._gpus:
            return None
        status, reason, message = self.gpu_health.condition()
        old = next((c for c in existing if c.get("type") == GPU_HEALTHY_CONDITION), None)
        stamp = rfc3339(now)
        transition = old.get("lastTransitionTime") if old and old.get("status") == status else None
        return {"type": GPU_HEALTHY_CONDITION, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": stamp, "lastTransitionTime": transition or stamp}

    def _gpu_health_meta(self) -> dict[str, str]:
        return {GPU_HEALTH_ANNOTATION: self.gpu_health.annotation()} if self._gpus else {}

    async def _sync_gpu_taint(self, node_obj: dict[str, Any] | None) -> None:
        """``gpufleet.io/gpu-unhealthy:NoSchedule`` while the node has GPUs and none is healthy."""
        if node_obj is None:
            return
        want = bool(self._gpus) and all(getattr(g, "health", "Healthy") != "Healthy" for g in self._gpus)
        taints = (node_obj.get("spec") or {}).get("taints") or []
        has = any(t.get("key") == GPU_UNHEALTHY_TAINT for t in taints)
        if want == has:
            return
        meta = node_obj.get("metadata") or {}
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion")},
                 "spec": {"taints": with_unhealthy_taint(taints, want)}}
        try:
            await self.client.patch("nodes", self.name, patch, raw=True)
        except Conflict:
            # Someone wrote the Node meanwhile (an operator's taint): the next heartbeat reads it again.
            return
        self.recorder.record_nowait(self._node_ref(), WARNING if want else NORMAL, "GPUTaint",
                                    f"{'added' if want else 'removed'} taint {GPU_UNHEALTHY_TAINT}:NoSchedule")

    # -- metrics -------------------------------------------------------------------------------

    def gpu_health_collector(self) -> Any:
        return _HealthCollector(self.gpu_health, list(self._gpus), self.name)


class _HealthCollector:
    """DCGM exporter's names where it has one (labels gpu, UUID, modelName, Hostname), and
    gpufleet's for the fence state."""

    def __init__(self, tracker: HealthTracker, gpus: list[Any], hostname: str) -> None:
        self.tracker, self.gpus, self.hostname = tracker, gpus, hostname

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from gpufleet.api.gpuhealth import (
            ECC_AGGREGATE,
            ECC_VOLATILE,
            NVLINK_ERRORS,
            REMAPPED_ROWS_FAILED,
            THROTTLE,
        )

        labels = ["gpu", "UUID", "modelName", "Hostname"]
        xid = GaugeMetricFamily("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", labels=labels)
        dbe_vol = GaugeMetricFamily("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.",
                                    labels=labels)
        dbe_agg = GaugeMetricFamily("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
                                    "Total number of double-bit persistent ECC errors.", labels=labels)
        remap = GaugeMetricFamily("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed.",
                                  labels=labels)
        nvlink = GaugeMetricFamily("DCGM_FI_DEV_NVLINK_ERROR_COUNT_TOTAL",
                                   "NVLink replay, recovery and CRC errors, all links.", labels=labels)
        throttle = GaugeMetricFamily("gpufleet_gpu_thermal_throttled", "1 while the GPU's clocks are throttled.",
                                     labels=labels)
        fenced = GaugeMetricFamily("gpufleet_gpu_fenced", "1 while the GPU is out of service (fenced, held or "
                                   "cordoned).", labels=[*labels, "state", "reason"])
        counts = CounterMetricFamily("gpufleet_gpu_xid_errors", "XID errors seen, by code.", labels=[*labels, "xid"])
        for g in self.gpus:
            st = self.tracker.gpus.get(g.index)
            values = [str(g.index), g.uuid, g.model, self.hostname]
            vals = st.values if st else {}
            xid.add_metric(values, st.last_xid if st else 0)
            dbe_vol.add_metric(values, vals.get(ECC_VOLATILE, 0))
            dbe_agg.add_metric(values, vals.get(ECC_AGGREGATE, 0))
            remap.add_metric(values, vals.get(REMAPPED_ROWS_FAILED, 0))
            nvlink.add_metric(values, vals.get(NVLINK_ERRORS, 0))
            throttle.add_metric(values, 1 if vals.get(THROTTLE) else 0)
            fenced.add_metric([*values, st.state if st else "Healthy", st.reason if st else ""],
                              1 if st and st.out else 0)
            for code, n in sorted((st.xid_counts if st else {}).items()):
                counts.add_metric([*values, str(code)], n)
        yield from (xid, dbe_vol, dbe_agg, remap, nvlink, throttle, fenced, counts)

