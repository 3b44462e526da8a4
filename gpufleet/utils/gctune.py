"""The cyclic garbage collector of the control plane's processes (`gpufleet server`, `up`).

CPython frees almost every object by reference counting; the cyclic collector only finds
cycles. With its default thresholds (700, 10, 10) it runs a young collection every 700 net
allocations and a full one whenever the objects that survived two young collections reach a
quarter of the old generation. An API server whose informers replace a cached Lease or Node at
every heartbeat moves their new copies to the old generation all the time (the old copies are
freed by reference counting, which the collector's count does not see), so at 1,000 nodes it
ran a full collection, a walk over every object in the process, about once a second: 44 in
50 s, a third of the server's time.

``tune()`` sets larger thresholds (young collections every THRESHOLDS[0] allocations, and
correspondingly rarer older ones), and ``freeze()`` moves what the process holds once it has
started (modules, schemas, the first caches) to the permanent generation, which no collection
walks again. Cycles are still collected, only less often. ``GPUFLEET_GC=default`` leaves
CPython's own settings. docs/scale.md, "The garbage collector", has the figures.
"""

from __future__ import annotations

import gc
import os

ENV = "GPUFLEET_GC"
THRESHOLDS = (20_000, 50, 100)


def enabled() -> bool:
    return (os.environ.get(ENV) or "").strip().lower() != "default"


def tune() -> None:
    """Set the thresholds; call once as the process starts."""
    if enabled():
        gc.set_threshold(*THRESHOLDS)


def freeze() -> None:
    """Collect once, then move every object the collector tracks to the permanent generation;
    call once the process has started its parts."""
    if enabled():
        gc.collect()
        gc.freeze()
