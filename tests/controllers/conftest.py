from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client.api import Client
from gpufleet.controllers.manager import ControllerManager, start_controllers

StartControllers = Callable[..., Awaitable[ControllerManager]]


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    plane = ControlPlane(store_url="sqlite:///" + str(tmp_path / "db"), port=0, state_dir=tmp_path,
                         run_controllers=False)
    await plane.start()
    yield plane
    await plane.stop()


@pytest.fixture
def client(cp: ControlPlane) -> Client:
    assert cp.client is not None
    return cp.client


@pytest.fixture
async def controllers(cp: ControlPlane, caplog: pytest.LogCaptureFixture) -> AsyncIterator[StartControllers]:
    """``await controllers(enabled=(...), **options)`` starts a controller manager on the
    test's control plane; it is stopped after the test."""
    caplog.set_level(logging.INFO, logger="gpufleet.controllers")
    started: list[ControllerManager] = []

    async def start(**options: Any) -> ControllerManager:
        assert cp.client is not None
        manager = await start_controllers(cp.client, **options)
        started.append(manager)
        return manager

    yield start
    for m in reversed(started):
        await m.stop()
