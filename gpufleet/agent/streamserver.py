"""The agent's stream endpoints, as the kubelet's /exec, /attach and /portforward: WebSockets
with the v5 channel framing, from the API server only (the agent port's token check covers
WebSocket handshakes too), which translates to whatever its client speaks.

  /exec/{namespace}/{pod}/{container}?command=...&stdin=&stdout=&stderr=&tty=
  /attach/{namespace}/{pod}/{container}?stdin=&stdout=&stderr=&tty=
      in:  0 stdin, 4 terminal size {"Width","Height"}, 255 [0] stdin closed
      out: 1 stdout, 2 stderr, 3 the v1 Status (exit code), then close
  /portforward/{namespace}/{pod}?port=N
      in:  0 bytes for the pod, 255 [0] half-close; out: 1 the pod's bytes, 3 an error (text)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

log = logging.getLogger(__name__)

PROTOCOL = "v5.channel.k8s.io"
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255


class StreamRefused(Exception):
    """Why a stream cannot be opened (the message the client is shown)."""

    def __init__(self, message: str, reason: str = "InternalError", code: int = 500) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code


@dataclass
class Process:
    """What an exec or attach runs: the runtime's ExecStream-like object (stdin writer,
    stdout/stderr readers, resize, wait), or, for an attach without one, ``output`` alone."""

    stream: Any = None
    output: AsyncIterator[bytes] | None = None
    report_exit: bool = True


class StreamEndpoints(Protocol):
    async def open_exec(self, namespace: str, pod: str, container: str, command: list[str],
                        tty: bool) -> Process: ...

    async def open_attach(self, namespace: str, pod: str, container: str, tty: bool, stdin: bool) -> Process: ...

    async def pod_address(self, namespace: str, pod: str, port: int) -> tuple[str, int]: ...


def success() -> dict[str, Any]:
    return {"metadata": {}, "status": "Success"}


def exit_status(code: int) -> dict[str, Any]:
    """Kubernetes' v1 Status for an exit code: kubectl exits with it, the Python client's
    returncode is it."""
    if code == 0:
        return success()
    return {"metadata": {}, "status": "Failure",
            "message": f"command terminated with non-zero exit code: exit status {code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


def failure(message: str, reason: str = "InternalError", code: int = 500) -> dict[str, Any]:
    return {"metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


async def _send(ws: WebSocket, channel: int, data: bytes = b"") -> bool:
    try:
        await ws.send_bytes(bytes([channel]) + data)
    except (WebSocketDisconnect, RuntimeError, OSError):
        return False
    return True


async def _pump(reader: asyncio.StreamReader, ws: WebSocket, channel: int) -> None:
    while True:
        try:
            data = await reader.read(32 * 1024)
        except OSError:  # a terminal whose last writer closed (EIO)
            return
        if not data or not await _send(ws, channel, data):
            return


async def _feed(ws: WebSocket, proc: Process, stdin: bool) -> None:
    """The client's stdin and terminal size, until it closes stdin or goes away."""
    s = proc.stream
    open_ = stdin and s is not None
    if s is not None and not stdin:
        with contextlib.suppress(Exception):
            s.stdin.close()
    while True:
        try:
            data = await ws.receive_bytes()
        except (WebSocketDisconnect, RuntimeError, KeyError):
            break
        if not data:
            continue
        ch, body = data[0], data[1:]
        if ch == STDIN and open_ and body:
            try:
                s.stdin.write(body)
                await s.stdin.drain()
            except (ConnectionError, OSError, RuntimeError):
                open_ = False
        elif ch == CLOSE and body[:1] == bytes([STDIN]) and open_:
            open_ = False
            with contextlib.suppress(Exception):
                s.stdin.close()
        elif ch == RESIZE and s is not None:
            try:
                size = json.loads(body)
                s.resize(int(size.get("Height") or 0), int(size.get("Width") or 0))
            except (ValueError, TypeError, AttributeError, OSError):
                pass
    # The client is gone: the process's stdin (and a terminal's writer) closes.
    if s is not None:
        with contextlib.suppress(Exception):
            s.stdin.close()


async def _run_process(ws: WebSocket, proc: Process, stdin: bool, stdout: bool, stderr: bool) -> dict[str, Any]:
    feeder = asyncio.ensure_future(_feed(ws, proc, stdin))
    try:
        s = proc.stream
        if s is None:
            assert proc.output is not None
            async for chunk in proc.output:
                if stdout and not await _send(ws, STDOUT, chunk):
                    break
            return success()
        pumps = [_pump(s.stdout, ws, STDOUT)] if stdout else []
        if s.stderr is not None and stderr:
            pumps.append(_pump(s.stderr, ws, STDERR))
        await asyncio.gather(*pumps)
        code = await s.wait()
        return exit_status(code) if proc.report_exit else success()
    finally:
        feeder.cancel()
        with contextlib.suppress(BaseException):
            await feeder


def stream_routes(endpoints: StreamEndpoints) -> list[WebSocketRoute]:
    async def process(ws: WebSocket, attach: bool) -> None:
        p, q = ws.path_params, ws.query_params
        tty, stdin = _truthy(q.get("tty")), _truthy(q.get("stdin"))
        stdout, stderr = _truthy(q.get("stdout")), _truthy(q.get("stderr")) and not tty
        await ws.accept(subprotocol=PROTOCOL)
        try:
            if attach:
                proc = await endpoints.open_attach(p["namespace"], p["pod"], p["container"], tty, stdin)
            else:
                proc = await endpoints.open_exec(p["namespace"], p["pod"], p["container"], q.getlist("command"), tty)
        except StreamRefused as exc:
            status = failure(str(exc), exc.reason, exc.code)
        else:
            try:
                status = await _run_process(ws, proc, stdin, stdout, stderr)
            finally:
                if proc.stream is not None:
                    proc.stream.close()
        await _send(ws, ERROR, json.dumps(status).encode())
        with contextlib.suppress(Exception):
            await ws.close()

    async def exec_(ws: WebSocket) -> None:
        await process(ws, attach=False)

    async def attach(ws: WebSocket) -> None:
        await process(ws, attach=True)

    async def portforward(ws: WebSocket) -> None:
        p = ws.path_params
        port_text = ws.query_params.get("port", "")
        await ws.accept(subprotocol=PROTOCOL)
        try:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise StreamRefused(f'invalid port "{port_text}"')
            host, port = await endpoints.pod_address(p["namespace"], p["pod"], int(port_text))
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
            except (OSError, TimeoutError) as exc:
                raise StreamRefused(f"failed to connect to localhost:{port_text} inside namespace of the pod: "
                                    f"{exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}") from None
        except StreamRefused as exc:
            await _send(ws, ERROR, str(exc).encode())
            with contextlib.suppress(Exception):
                await ws.close()
            return

        async def up() -> None:
            while True:
                try:
                    data = await ws.receive_bytes()
                except (WebSocketDisconnect, RuntimeError, KeyError):
                    return
                if not data:
                    continue
                if data[0] == STDIN and len(data) > 1:
                    writer.write(data[1:])
                    try:
                        await writer.drain()
                    except (ConnectionError, OSError):
                        return
                elif data[0] == CLOSE:
                    with contextlib.suppress(OSError):
                        writer.write_eof()

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(_pump(reader, ws, STDOUT))]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await ws.close()

    return [
        WebSocketRoute("/exec/{namespace}/{pod}/{container}", exec_),
        WebSocketRoute("/attach/{namespace}/{pod}/{container}", attach),
        WebSocketRoute("/portforward/{namespace}/{pod}", portforward),
    ]
