"""Scale from zero: a request held for a Service with no Ready endpoint scales the workload that
a HorizontalPodAutoscaler with ``minReplicas: 0`` targets (and whose pods the Service
selects) to one replica."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gpufleet.api.selectors import LabelSelector, SelectorError, parse_label_selector
from gpufleet.client import objects
from gpufleet.client.errors import ApiError
from gpufleet.client.informer import NAMESPACE_INDEX

log = logging.getLogger(__name__)


def _selects_same_pods(selector: LabelSelector, service_selector: dict[str, str]) -> bool:
    """Whether a workload's pods (described by its selector) are what the Service selects: the
    Service's labels satisfy the workload's selector."""
    if selector.matches_nothing() or not service_selector:
        return False
    return selector.matches(service_selector)


class ScaleFromZero:
    """The Gateway's scale from zero (it holds the informers, the client and the tasks)."""

    # -- scale from zero -------------------------------------------------------------------

    def _activate(self, key: str) -> None:
        task = self._activating.get(key)
        if task is not None and not task.done():
            return
        self._activating[key] = asyncio.ensure_future(self._scale_from_zero(key))

    def _hpas_for(self, svc: Any) -> list[Any]:
        selector = (svc.spec.selector or {}) if svc.spec is not None else {}
        out = []
        if not selector:
            return out
        for hpa in self.hpa_informer.by_index(NAMESPACE_INDEX, objects.namespace_of(svc)):
            if (hpa.spec.min_replicas if hpa.spec.min_replicas is not None else 1) == 0:
                out.append(hpa)
        return out

    async def _scale_from_zero(self, key: str) -> None:
        svc = self.svc_informer.get(key)
        if svc is None:
            return
        ns = objects.namespace_of(svc)
        labels = dict(svc.spec.selector or {})
        for hpa in self._hpas_for(svc):
            ref = hpa.spec.scale_target_ref
            kind = f"{ref.api_version}/{ref.kind}" if ref.api_version else ref.kind
            try:
                scale = await self.client.get_scale(kind, ref.name, ns, raw=True)
                try:
                    target_selector = parse_label_selector((scale.get("status") or {}).get("selector") or "")
                except SelectorError:
                    continue
                if not _selects_same_pods(target_selector, labels):
                    continue
                if ((scale.get("spec") or {}).get("replicas") or 0) > 0:
                    continue
                await self.client.set_scale(kind, ref.name, 1, ns)
                log.info("gateway: %s had no replica; scaled %s %s/%s to 1 for a waiting request",
                         key, ref.kind, ns, ref.name)
            except (ApiError, LookupError) as exc:
                log.warning("gateway: cannot scale %s %s/%s from zero: %s", ref.kind, ns, ref.name, exc)
        # Do not try again at once: the pod is on its way, or there is nothing to scale.
        await asyncio.sleep(1.0)
