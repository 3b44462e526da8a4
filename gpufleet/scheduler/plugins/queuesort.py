"""PrioritySort: higher priority first, then the older pod."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufleet.scheduler.queue import QueuedPodInfo


class PrioritySort:
    name = "PrioritySort"

    def __init__(self, args: Mapping[str, Any] | None = None, handle: Any = None) -> None:
        pass

    def less(self, a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
        pa, pb = a.pod_info.priority, b.pod_info.priority
        if pa != pb:
            return pa > pb
        return a.sort_timestamp < b.sort_timestamp
