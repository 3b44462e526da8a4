"""How programs in pods reach the API server: a TCP relay the agent listens on where pods
can reach it, forwarding to the API server the agent itself uses.

Kubernetes gives pods a ClusterIP for the API (the ``kubernetes`` Service) and
KUBERNETES_SERVICE_HOST/PORT. Here pods find ``kubernetes.default.svc`` in their /etc/hosts,
pointing at this relay: on the pod network's gateway for pods with a network namespace of
their own, on the node's address for pods on the host's network. The relay is plain TCP,
so TLS runs end to end between the pod and the API server (whose certificate names
kubernetes.default.svc), and the pod's own token is what authenticates it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

log = logging.getLogger(__name__)

# Lets the relay bind an address before its interface is up (the pod network's bridge
# comes up with the first pod).
_IP_FREEBIND = 15


class ApiRelay:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._servers: dict[str, asyncio.AbstractServer] = {}
        self._ports: dict[str, int] = {}
        self._conns: set[asyncio.Task] = set()

    async def listen(self, address: str, port: int = 0) -> int:
        """Listen on address (once; later calls answer the same port)."""
        if address in self._ports:
            return self._ports[address]
        sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_IP, _IP_FREEBIND, 1)
        sock.bind((address, port))
        sock.setblocking(False)
        server = await asyncio.start_server(self._serve, sock=sock)
        self._servers[address] = server
        self._ports[address] = sock.getsockname()[1]
        log.info("pods reach the API server %s:%d through %s:%d", *self.target, address, self._ports[address])
        return self._ports[address]

    def port(self, address: str) -> int | None:
        return self._ports.get(address)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._conns.add(task)
        try:
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.target), 10)
            except (OSError, TimeoutError) as exc:
                log.warning("API relay: cannot reach %s:%d: %s", *self.target, exc)
                return
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                up_writer.close()
        finally:
            writer.close()
            if task is not None:
                self._conns.discard(task)

    async def close(self) -> None:
        for server in self._servers.values():
            server.close()
        for task in list(self._conns):
            task.cancel()
        for server in self._servers.values():
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers.clear()
        self._ports.clear()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()
