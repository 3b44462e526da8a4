"""Liveness, readiness and startup probes with the kubelet's semantics: one loop per probe
and container, a result that flips only after ``successThreshold`` successes or
``failureThreshold`` failures in a row, and actions (exec, httpGet, tcpSocket) bounded by
``timeoutSeconds``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from gpufleet.utils.clock import Clock

log = logging.getLogger(__name__)

# (timeout seconds) -> (success, message for the Unhealthy event)
ProbeAction = Callable[[float], Awaitable[tuple[bool, str]]]


class Prober:
    """Runs one probe of one container attempt until cancelled.

    ``on_flip(result)`` is called when the probe's result changes; ``on_failure(message)``
    after every failed attempt (the Unhealthy events).
    """

    def __init__(self, kind: str, probe: Mapping[str, Any], action: ProbeAction, clock: Clock,
                 on_flip: Callable[[bool], None], on_failure: Callable[[str], None],
                 period_scale: float = 1.0) -> None:
        self.kind = kind
        self.probe = probe
        self.action = action
        self.clock = clock
        self.on_flip = on_flip
        self.on_failure = on_failure
        self.period_scale = period_scale
        # Until the first verdict: liveness assumes alive, readiness and startup assume not yet.
        self.result: bool = kind == "liveness"

    def _seconds(self, key: str, default: float) -> float:
        value = self.probe.get(key)
        return float(value if value is not None else default)

    async def run(self) -> None:
        delay = self._seconds("initialDelaySeconds", 0) * self.period_scale
        period = max(self._seconds("periodSeconds", 10), 1) * self.period_scale
        timeout = max(self._seconds("timeoutSeconds", 1), 1)
        success_needed = max(int(self._seconds("successThreshold", 1)), 1)
        failures_allowed = max(int(self._seconds("failureThreshold", 3)), 1)
        if delay > 0:
            await self.clock.sleep(delay)
        successes = failures = 0
        while True:
            try:
                ok, message = await asyncio.wait_for(self.action(timeout), timeout + 1)
            except TimeoutError:
                ok, message = False, f"probe timed out after {timeout:g}s"
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("%s probe errored", self.kind)
                ok, message = False, f"probe error: {exc}"
            if ok:
                successes, failures = successes + 1, 0
                if successes >= success_needed and not self.result:
                    self.result = True
                    self.on_flip(True)
            else:
                successes, failures = 0, failures + 1
                self.on_failure(message)
                if failures >= failures_allowed and (self.result or self.kind == "startup"):
                    self.result = False
                    self.on_flip(False)
            if self.kind == "startup" and self.result:
                return
            await self.clock.sleep(period)


def make_action(probe: Mapping[str, Any], *, host: str, resolve_port: Callable[[Any], int | None],
                run_exec: Callable[[list[str], float], Awaitable[tuple[int, str]]],
                http: httpx.AsyncClient) -> ProbeAction | None:
    """The probe's check as a callable; None for a probe kind the agent cannot run (gRPC)."""
    if probe.get("exec"):
        command = [str(a) for a in probe["exec"].get("command") or []]

        async def exec_action(limit_s: float) -> tuple[bool, str]:
            try:
                code, output = await run_exec(command, limit_s)
            except TimeoutError:
                return False, f"command {command!r} timed out"
            return code == 0, output.strip() or f"command {command!r} exited with {code}"

        return exec_action

    def connecting(spec: dict[str, Any], act: Callable[[str, int, float], Awaitable[tuple[bool, str]]]) -> ProbeAction:
        """An httpGet or tcpSocket probe: ``act(host, port, limit_s)`` once its port resolves."""

        async def action(limit_s: float) -> tuple[bool, str]:
            port = resolve_port(spec.get("port"))
            if port is None:
                return False, f"unknown port {spec.get('port')!r}"
            return await act(spec.get("host") or host, port, limit_s)

        return action

    if probe.get("httpGet"):
        spec = probe["httpGet"]

        async def http_action(target: str, port: int, limit_s: float) -> tuple[bool, str]:
            scheme = (spec.get("scheme") or "HTTP").lower()
            path = spec.get("path") or "/"
            if not path.startswith("/"):
                path = "/" + path
            url = f"{scheme}://{target}:{port}{path}"
            headers = {h["name"]: h.get("value", "") for h in spec.get("httpHeaders") or [] if h.get("name")}
            headers.setdefault("user-agent", "kube-probe/1.32")
            try:
                resp = await http.get(url, headers=headers, timeout=limit_s)
            except httpx.TimeoutException:
                return False, f'Get "{url}": context deadline exceeded (Client.Timeout exceeded while awaiting headers)'
            except httpx.HTTPError as exc:
                return False, f'Get "{url}": {_describe(exc)}'
            if 200 <= resp.status_code < 400:
                return True, ""
            return False, f"HTTP probe failed with statuscode: {resp.status_code}"

        return connecting(spec, http_action)
    if probe.get("tcpSocket"):
        spec = probe["tcpSocket"]

        async def tcp_action(target: str, port: int, limit_s: float) -> tuple[bool, str]:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(target, port), limit_s)
            except (OSError, TimeoutError) as exc:
                why = "i/o timeout" if isinstance(exc, TimeoutError) else "connect: connection refused"
                return False, f"dial tcp {target}:{port}: {why}"
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            return True, ""

        return connecting(spec, tcp_action)
    return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "dial tcp: connect: connection refused"
    return str(exc) or type(exc).__name__
