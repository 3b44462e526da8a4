"""The controller manager: one shared informer factory, every controller on one loop."""

from __future__ import annotations

from typing import Any

from gpufleet.client.api import Client
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.utils.clock import REAL_CLOCK, Clock


class ControllerManager:
    def __init__(self, client: Client, *, clock: Clock = REAL_CLOCK) -> None:
        from gpufleet.controllers.namespace import NamespaceController

        self.client = client
        self.clock = clock
        self.informers = SharedInformerFactory(client)
        self.controllers: list[Any] = [NamespaceController(client, self.informers)]

    async def start(self) -> None:
        await self.informers.start()
        for c in self.controllers:
            await c.start()

    async def stop(self) -> None:
        for c in reversed(self.controllers):
            await c.stop()
        await self.informers.stop()


async def start_controllers(client: Client, *, clock: Clock = REAL_CLOCK) -> ControllerManager:
    manager = ControllerManager(client, clock=clock)
    await manager.start()
    return manager
