"""The agent's GPU health loop: poll the device plugin's health signals, fence the GPUs the
policy drains (out of allocatable and of the allocator, the pod on it stopped), tell it on the
Node (condition, Events, taint, history annotation) and bring a GPU back once a validation on
it passes. The state machine is gpuhealth.py; docs/gpu-health.md is the user's page.

A fenced GPU is validated by a pod the agent makes for it (gpuvalidation.py): bound to this
node, given that GPU alone, outside the scheduler's accounting since the GPU is outside
allocatable. It runs only once the GPU's drain-level signals are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import Any

from gpufleet.agent import gpuvalidation
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
from gpufleet.client import ApiError, Conflict, NotFound, TransportError
from gpufleet.utils.clock import rfc3339

log = logging.getLogger(__name__)

NORMAL, WARNING = "Normal", "Warning"
_EVENTS = {"fence": (WARNING, "GPUUnhealthy"), "warn": (WARNING, "GPUHealthWarning"), "held": (WARNING, "GPUHeld"),
           "validation-failed": (WARNING, "GPUValidationFailed"), "returned": (NORMAL, "GPUHealthy")}


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
        """Run the validation pod for GPU ``index`` (gpuvalidation.py) and read how it ended."""
        name = gpuvalidation.pod_name(self.name, index)
        await self._delete_validation_pod(name, wait=True)
        image, command = gpuvalidation.default_check(self.devices.name, self.runtime.name)
        if self.config.gpu_validation_image:
            image = self.config.gpu_validation_image
        if self.config.gpu_validation_command:
            command = list(self.config.gpu_validation_command)
        raw = {g.index: g for g in await self._fingerprint_raw()}
        seen = raw.get(index)
        health = getattr(seen, "health", "Healthy") if seen is not None else "Missing"
        token = secrets.token_hex(8)
        body = gpuvalidation.validation_pod(
            node=self.name, node_uid=self._node_uid or "", index=index, uuid=self.gpu_health.state(index).uuid,
            health=health, image=image, command=command, timeout=self.config.gpu_validation_timeout, token=token)
        changed = self._validation_changed[name] = asyncio.Event()
        self._validations[name] = (index, token)
        try:
            await self.client.create(body, raw=True)
            # The pod's own activeDeadlineSeconds ends a check that hangs; this bounds the rest
            # (an image that never comes, an agent that cannot start it).
            deadline = self.clock.monotonic() + self.config.gpu_validation_timeout + 30.0
            while True:
                pod = self._pods.get(f"{gpuvalidation.NAMESPACE}/{name}") if self._pods is not None else None
                if pod is not None and (pod.get("metadata") or {}).get("annotations", {}).get(
                        gpuvalidation.TOKEN_ANNOTATION) == token and \
                        (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    break
                left = deadline - self.clock.monotonic()
                if left <= 0:
                    await self._delete_validation_pod(name)
                    return False, f"the validation pod did not finish within {self.config.gpu_validation_timeout:.0f}s"
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(left, 1.0))
        finally:
            self._validation_changed.pop(name, None)
        ok, detail = gpuvalidation.result(pod)
        answer = await self.container_logs(gpuvalidation.NAMESPACE, name, gpuvalidation.CONTAINER,
                                           {"tailLines": "3"})
        tail = " / ".join((answer.body or b"").decode(errors="replace").strip().splitlines())[:300] \
            if answer.code == 200 else ""
        detail = f"{detail}: {tail}" if tail and not ok else (tail or detail)
        if ok:
            # Kept when it failed, for `kubectl logs -n kube-system`; replaced at the next attempt.
            await self._delete_validation_pod(name)
        return ok, f"pod {gpuvalidation.NAMESPACE}/{name}: {detail}"

    def _validation_gpu(self, pod: dict[str, Any]) -> int | None:
        """The GPU a pod validates, if it is the validation pod this run made for it."""
        meta = pod.get("metadata") or {}
        if meta.get("namespace") != gpuvalidation.NAMESPACE or not gpuvalidation.is_validation_pod(pod):
            return None
        expected = self._validations.get(meta.get("name", ""))
        ann = meta.get("annotations") or {}
        if expected is None or ann.get(gpuvalidation.TOKEN_ANNOTATION) != expected[1]:
            return None
        index = expected[0]
        return index if ann.get(gpuvalidation.VALIDATION_ANNOTATION) == str(index) else None

    def _validation_pod_seen(self, pod: dict[str, Any]) -> bool:
        """A validation pod on this node changed: wake its validation; False (and it goes)
        for one this run did not make."""
        name = (pod.get("metadata") or {}).get("name", "")
        if self._validation_gpu(pod) is None:
            if name not in self._validations:
                # Left by an earlier run of the agent (or not the agent's at all): never run.
                task = asyncio.ensure_future(self._delete_validation_pod(name))
                self._health_tasks.add(task)
                task.add_done_callback(self._health_tasks.discard)
            return False
        event = self._validation_changed.get(name)
        if event is not None:
            event.set()
        return True

    async def _delete_validation_pod(self, name: str, wait: bool = False) -> None:
        try:
            await self.client.delete("pods", name, gpuvalidation.NAMESPACE, grace_period_seconds=0)
        except NotFound:
            return
        except (TransportError, ApiError) as exc:
            log.info("agent %s: deleting the validation pod %s failed (%s)", self.name, name, exc)
            return
        deadline = self.clock.monotonic() + 30.0
        while wait and self.clock.monotonic() < deadline:
            try:
                await self.client.get("pods", name, gpuvalidation.NAMESPACE, raw=True)
            except NotFound:
                return
            await self.clock.sleep(0.2)

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

    async def _sync_gpu_taint(self, node_obj: dict[str, Any] | None, gpus: list[Any]) -> None:
        """``gpufleet.io/gpu-unhealthy:NoSchedule`` while the node has GPUs and none is healthy
        (``gpus``: the fingerprint the status being written was made from)."""
        if node_obj is None:
            return
        want = bool(gpus) and all(getattr(g, "health", "Healthy") != "Healthy" for g in gpus)
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

