"""Pausing CPython's cyclic garbage collector while a large list is decoded.

Decoding a list of thousands of objects allocates millions of dicts and lists in one go.
The collector runs every 700 net allocations and walks the young generation each time (and
the older ones every 10th and 100th time), so on a large list it spends most of the time
walking objects it cannot free: 80% of decoding 50,000 pods (3.8 s of 4.6 s with it on,
0.8 s paused; bench/list_bench.py shows what a list costs through HTTP). Decoded JSON holds
no reference cycles, so nothing is left for the collector to find afterwards; reference
counting frees it as usual. Synchronous code only: the pause is process-wide and must not
span an await.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic collection inside the block (if it was on; restored after)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
