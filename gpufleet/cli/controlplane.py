"""Assembles a control plane in one process: store, API server (HTTP and in-process),
and the controllers, all on one event loop."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.apiserver.app import HttpServer
from gpufleet.apiserver.nodeproxy import NodeProxy
from gpufleet.apiserver.server import ApiServer
from gpufleet.client.api import Client
from gpufleet.client.kubeconfig import write_kubeconfig
from gpufleet.client.transport import LocalTransport
from gpufleet.store.base import Store, open_store
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger("gpufleet")


@dataclass
class ControlPlane:
    store_url: str
    host: str = "127.0.0.1"
    port: int = 6443
    state_dir: Path | None = None
    run_controllers: bool = True
    run_scheduler: bool | None = None  # default: with the controllers
    clock: Clock = REAL_CLOCK
    store: Store | None = None
    api: ApiServer | None = None
    http: HttpServer | None = None
    client: Client | None = None
    node_proxy: NodeProxy | None = None
    _tasks: list[asyncio.Task] = field(default_factory=list)
    _stoppables: list[Any] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self.http is not None
        return f"http://{self.host}:{self.http.port}"

    async def start(self) -> None:
        self.store = open_store(self.store_url, clock=self.clock)
        await self.store.start()
        # Logs and metrics.k8s.io come from the node agents, through the node proxy.
        self.node_proxy = NodeProxy(self.store, clock=self.clock)
        self.api = ApiServer(self.store, clock=self.clock, log_provider=self.node_proxy.log_provider)
        self.node_proxy.install(self.api)
        await self.api.start()
        self.http = HttpServer(self.api, host=self.host, port=self.port)
        await self.http.start()
        self.client = Client(LocalTransport(self.api))
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            write_kubeconfig(self.state_dir / "kubeconfig", self.url)
        if self.run_controllers:
            from gpufleet.controllers.manager import start_controllers

            self._stoppables.append(await start_controllers(self.client, clock=self.clock))
        if self.run_scheduler if self.run_scheduler is not None else self.run_controllers:
            from gpufleet.scheduler import Scheduler

            scheduler = Scheduler(self.client, clock=self.clock)
            await scheduler.start()
            self._stoppables.append(scheduler)

    async def stop(self) -> None:
        for s in reversed(self._stoppables):
            await s.stop()
        if self.http is not None:
            await self.http.stop()
        if self.node_proxy is not None:
            await self.node_proxy.close()
        if self.store is not None:
            await self.store.close()
