"""utils/gctune.py: the control plane's collector thresholds and the freeze after start, and
GPUFLEET_GC=default leaving CPython's own."""

from __future__ import annotations

import gc

import pytest

from gpufleet.utils import gctune


@pytest.fixture(autouse=True)
def restore_gc():
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_tune_and_freeze(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gctune.ENV, raising=False)
    gc.set_threshold(700, 10, 10)
    gctune.tune()
    assert gc.get_threshold() == gctune.THRESHOLDS
    held = [[i] for i in range(1000)]  # tracked objects the process holds
    gctune.freeze()
    assert gc.get_freeze_count() >= len(held)
    # Frozen objects are out of every generation a collection walks.
    assert not any(o is held for o in gc.get_objects())


def test_default_leaves_cpythons_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gctune.ENV, " Default ")
    gc.set_threshold(700, 10, 10)
    gctune.tune()
    gctune.freeze()
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0
