"""A highly available control plane: leader election through Leases, and failover.

The elector's rules run against a real in-process API server on a fake clock; the failover
test starts real `gpufleet server` processes on one PostgreSQL, SIGKILLs the leader and
watches the others take over.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.apiserver.server import ApiServer
from gpufleet.client.api import Client
from gpufleet.client.errors import Conflict, NotFound, TransportError
from gpufleet.client.leaderelection import (
    CONTROLLER_MANAGER_LEASE,
    LEASE_NAMESPACE,
    SCHEDULER_LEASE,
    LeaderElectionConfig,
    LeaderElector,
)
from gpufleet.client.transport import FailoverTransport, LocalTransport
from gpufleet.store.base import open_store
from gpufleet.utils.clock import FakeClock, parse_rfc3339, rfc3339

# -- the elector, on a fake clock -----------------------------------------------------------


class SwitchableTransport(LocalTransport):
    """An in-process transport that can be cut off, as a network or a dead server would."""

    down = False

    async def request(self, method, path, **kw):  # type: ignore[override]
        if self.down:
            raise TransportError(f"{method} {path}: connection refused")
        return await super().request(method, path, **kw)


@pytest.fixture
async def api(tmp_path: Path):
    store = open_store(f"sqlite:///{tmp_path / 'db'}")
    await store.start()
    server = ApiServer(store)
    await server.start()
    yield server
    await store.close()


class Recorder:
    def __init__(self, clock: FakeClock | None = None) -> None:
        self.clock = clock
        self.events: list[str] = []
        self.times: list[float] = []

    async def started(self) -> None:
        self.events.append("started")
        self.times.append(self.clock.monotonic() if self.clock else 0.0)

    async def stopped(self) -> None:
        self.events.append("stopped")
        self.times.append(self.clock.monotonic() if self.clock else 0.0)


def elector(api: ApiServer, identity: str, clock: FakeClock, recorder: Recorder | None = None,
            transport: LocalTransport | None = None) -> LeaderElector:
    recorder = recorder or Recorder()
    config = LeaderElectionConfig(name="test-lock", identity=identity)  # 15s / 10s / 2s
    return LeaderElector(Client(transport or LocalTransport(api)), config, clock=clock,
                         on_started_leading=recorder.started, on_stopped_leading=recorder.stopped)


async def lease_spec(api: ApiServer) -> dict[str, Any]:
    lease = await Client(LocalTransport(api)).get("leases", "test-lock", LEASE_NAMESPACE, raw=True)
    return lease["spec"]


async def test_acquire_renew_and_takeover_by_the_observers_clock(api: ApiServer) -> None:
    clock = FakeClock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert await a.try_acquire_or_renew()
    first = await lease_spec(api)
    assert first["holderIdentity"] == "a" and first["leaseDurationSeconds"] == 15
    assert first["leaseTransitions"] == 0 and first["acquireTime"] == first["renewTime"]
    assert not await b.try_acquire_or_renew() and b.leader == "a"

    # a renews: renewTime moves, acquireTime stays; b, which saw the change, keeps waiting
    # a whole lease duration from when it saw it.
    clock.advance(2)
    assert await a.try_acquire_or_renew()
    renewed = await lease_spec(api)
    assert parse_rfc3339(renewed["renewTime"]) == parse_rfc3339(first["renewTime"]) + 2
    assert renewed["acquireTime"] == first["acquireTime"]
    clock.advance(10)
    assert not await b.try_acquire_or_renew()  # b saw the record change only now
    clock.advance(14)
    assert not await b.try_acquire_or_renew()
    clock.advance(2)  # 16s since b last saw a change: expired
    assert await b.try_acquire_or_renew()
    taken = await lease_spec(api)
    assert taken["holderIdentity"] == "b" and taken["leaseTransitions"] == 1
    assert parse_rfc3339(taken["acquireTime"]) == clock.now()
    # The old leader finds out on its next attempt and does not write.
    assert not await a.try_acquire_or_renew() and not a.is_leader()
    assert (await lease_spec(api))["holderIdentity"] == "b"


async def test_a_stale_remote_renew_time_is_not_taken_for_expiry(api: ApiServer) -> None:
    """A holder's renewTime an hour behind our wall clock (clock offset between machines)
    does not make the Lease look expired: only our own observation time counts."""
    clock = FakeClock()
    hour_ago = rfc3339(clock.now() - 3600, micro=True)
    await Client(LocalTransport(api)).create(
        {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
         "metadata": {"name": "test-lock", "namespace": LEASE_NAMESPACE},
         "spec": {"holderIdentity": "far-away", "leaseDurationSeconds": 15, "renewTime": hour_ago,
                  "acquireTime": hour_ago, "leaseTransitions": 4}}, LEASE_NAMESPACE)
    b = elector(api, "b", clock)
    assert not await b.try_acquire_or_renew()
    clock.advance(14)
    assert not await b.try_acquire_or_renew()
    clock.advance(2)
    assert await b.try_acquire_or_renew()
    assert (await lease_spec(api))["leaseTransitions"] == 5


async def test_a_leader_that_cannot_renew_stops_before_the_lease_can_expire(api: ApiServer) -> None:
    clock = FakeClock()
    recorder = Recorder()
    transport = SwitchableTransport(api)
    a = elector(api, "a", clock, recorder, transport)
    a.start()
    try:
        for _ in range(200):
            if recorder.events == ["started"]:
                break
            await asyncio.sleep(0.01)
        assert recorder.events == ["started"] and a.leading
        transport.down = True
        cut_at = clock.monotonic()
        for _ in range(2000):
            if "stopped" in recorder.events:
                break
            await asyncio.sleep(0.005)
        stopped_at = clock.monotonic()
        assert recorder.events == ["started", "stopped"] and not a.leading
        # It gave up within renew_deadline (+ one retry period) of its last renewal, which is
        # before any observer could take the Lease (lease_duration after seeing it).
        assert stopped_at - cut_at <= a.config.renew_deadline + a.config.retry_period
        assert stopped_at - cut_at < a.config.lease_duration
        # Back in reach, it campaigns again and, the Lease still naming it, leads a new term.
        transport.down = False
        for _ in range(2000):
            if recorder.events == ["started", "stopped", "started"]:
                break
            await asyncio.sleep(0.005)
        assert recorder.events == ["started", "stopped", "started"] and a.terms == 2
    finally:
        transport.down = False
        await a.stop()


async def test_a_leader_that_sees_another_holder_stops_at_once(api: ApiServer) -> None:
    """A leader paused past its lease (a stopped process) finds on waking that another took
    over: it stops on that first look, not renew_deadline later."""
    clock = FakeClock()
    recorder = Recorder(clock)
    a = elector(api, "a", clock, recorder)
    a.start()
    try:
        for _ in range(200):
            if recorder.events:
                break
            await asyncio.sleep(0.01)
        admin = Client(LocalTransport(api))
        for _ in range(100):  # the leader renews all the while (its clock's sleeps return at once)
            lease = await admin.get("leases", "test-lock", LEASE_NAMESPACE, raw=True)
            lease["spec"]["holderIdentity"] = "b"
            try:
                await admin.update(lease)
                break
            except Conflict:
                continue
        seen_at = clock.monotonic()
        for _ in range(2000):
            if "stopped" in recorder.events:
                break
            await asyncio.sleep(0.005)
        assert recorder.events[:2] == ["started", "stopped"]
        # Within one retry period of the takeover; it may since have taken the Lease back,
        # b never renewing it.
        assert recorder.times[1] - seen_at <= a.config.retry_period
    finally:
        await a.stop()


async def test_release_on_stop_hands_over_at_once(api: ApiServer) -> None:
    clock = FakeClock()
    recorder = Recorder()
    a, b = elector(api, "a", clock, recorder), elector(api, "b", clock)
    a.start()
    for _ in range(200):
        if recorder.events:
            break
        await asyncio.sleep(0.01)
    assert not await b.try_acquire_or_renew()
    await a.stop()
    assert recorder.events == ["started", "stopped"]
    released = await lease_spec(api)
    assert not released.get("holderIdentity") and released["leaseDurationSeconds"] == 1
    # No waiting out the old duration: a released Lease is free.
    assert await b.try_acquire_or_renew()
    taken = await lease_spec(api)
    assert taken["holderIdentity"] == "b" and taken["leaseTransitions"] == 1


def test_config_refuses_a_renew_deadline_past_the_lease() -> None:
    with pytest.raises(ValueError, match="lease_duration"):
        LeaderElectionConfig(name="x", identity="i", lease_duration=10, renew_deadline=10)
    with pytest.raises(ValueError, match="retry_period"):
        LeaderElectionConfig(name="x", identity="i", lease_duration=15, renew_deadline=2, retry_period=2)


async def test_failover_transport_moves_on_when_a_server_cannot_be_reached(api: ApiServer) -> None:
    from gpufleet.apiserver.app import HttpServer

    http = HttpServer(api, port=0)
    await http.start()
    dead = f"http://127.0.0.1:{_free_port()}"
    transport = FailoverTransport([dead, f"http://127.0.0.1:{http.port}"])
    try:
        client = Client(transport)
        assert (await client.get("namespaces", "default", raw=True))["metadata"]["name"] == "default"
        assert transport.server_url.endswith(str(http.port))
        lines = []
        transport._current = 0  # the dead one first again: a stream that cannot open moves on too
        async for line in transport.stream("GET", "/api/v1/namespaces/default"):
            lines.append(line)
        assert b'"name":"default"' in b"".join(lines)
    finally:
        await transport.close()
        await http.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- several real servers on one PostgreSQL ------------------------------------------------

LEASE = dict(duration=3.0, renew_deadline=2.0, retry_period=0.4)
_LISTENING = re.compile(r"API server listening on (http\S+)")


class Proc:
    """A gpufleet process with its stdout collected line by line."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        with open(log, "w") as err:
            self.popen = subprocess.Popen([sys.executable, "-m", "gpufleet.cli.main", *args], stdout=subprocess.PIPE,
                                          stderr=err, text=True, env=env, start_new_session=True)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_for_line(self, pattern: re.Pattern[str], timeout: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if line is None or time.monotonic() > deadline:
                raise AssertionError(f"no {pattern.pattern!r} from {self.popen.args}; log:\n"
                                     f"{self.log.read_text()[-3000:]}")
            if m := pattern.search(line):
                return m

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


def _server_args(store: str, state: Path) -> list[str]:
    return ["server", "--store", store, "--port", "0", "--state-dir", str(state), "--gateway-port", "-1",
            "--leader-elect-lease-duration", str(LEASE["duration"]),
            "--leader-elect-renew-deadline", str(LEASE["renew_deadline"]),
            "--leader-elect-retry-period", str(LEASE["retry_period"])]


def _share_credentials(first: Path, other: Path) -> None:
    """What a second server needs from the first: the CA (it signs its own serving
    certificate with it), the admin token and the join token."""
    (other / "pki").mkdir(parents=True, mode=0o700)
    for name in ("pki/ca.crt", "pki/ca.key", "tokens.csv", "join-token"):
        shutil.copy2(first / name, other / name)


def _pid_of(identity: str | None) -> int | None:
    parts = (identity or "").rsplit("_", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


async def _holders(client: Client) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in (SCHEDULER_LEASE, CONTROLLER_MANAGER_LEASE):
        try:
            lease = await client.get("leases", name, LEASE_NAMESPACE, raw=True)
            out[name] = (lease.get("spec") or {}).get("holderIdentity")
        except NotFound:
            out[name] = None
    return out


async def _until(fn, timeout: float, what: str):  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = await fn()
        except TransportError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)


def _deployment(name: str, replicas: int) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "main", "image": "busybox:1.36",
                                                           "command": ["sleep", "3600"],
                                                           "resources": {"requests": {"cpu": "100m"}}}]}}}}


async def _running(client: Client, app: str, count: int) -> bool:
    items = list(await client.list("pods", "default", label_selector=f"app={app}", raw=True))
    running = [p for p in items if (p.get("status") or {}).get("phase") == "Running"
               and not (p.get("metadata") or {}).get("deletionTimestamp")]
    return len(running) == count


@pytest.mark.postgres
async def test_three_servers_one_leader_and_failover(postgres_url: str, tmp_path: Path) -> None:
    env = dict(os.environ, HOME=str(tmp_path), PYTHONUNBUFFERED="1")
    env.pop("KUBECONFIG", None)
    states = [tmp_path / f"server-{i}" for i in range(3)]
    procs: list[Proc] = []
    client: Client | None = None
    try:
        first = Proc(_server_args(postgres_url, states[0]), tmp_path / "server-0.log", env)
        procs.append(first)
        urls = [first.wait_for_line(_LISTENING).group(1)]
        for state in states[1:]:
            _share_credentials(states[0], state)
        others = [Proc(_server_args(postgres_url, s), tmp_path / f"{s.name}.log", env) for s in states[1:]]
        procs += others
        urls += [p.wait_for_line(_LISTENING).group(1) for p in others]
        assert all(u.startswith("https://") for u in urls)

        admin = next(line.split(",")[0] for line in (states[0] / "tokens.csv").read_text().splitlines()
                     if ",admin," in line)
        ca = str(states[0] / "pki" / "ca.crt")
        # Every server accepts the first one's admin token over TLS checked against its CA.
        for url in urls:
            async with Client(FailoverTransport([url], token=admin, ca_file=ca)) as c:
                await c.get("namespaces", "default", raw=True)
        client = Client(FailoverTransport(urls[1:], token=admin, ca_file=ca))

        # The first server won both Leases at once; the others stand by.
        holders = await _holders(client)
        assert {_pid_of(h) for h in holders.values()} == {first.popen.pid}, holders
        await asyncio.sleep(3 * LEASE["retry_period"])
        assert await _holders(client) == holders
        assert not any("became leader" in line for p in others for line in p.output)

        agent = Proc(["agent", "--server", ",".join(urls), "--token-file", str(states[0] / "join-token"),
                      "--certificate-authority", ca, "--runtime", "simulated", "--gpus", "0", "--name", "ha-node",
                      "--state-dir", str(tmp_path / "agent"), "--cpus", "8", "--memory", "16Gi"],
                     tmp_path / "agent.log", env)
        procs.append(agent)
        agent.wait_for_line(re.compile(r"agent ha-node serving"))
        await client.create(_deployment("before", 2), "default")
        await _until(lambda: _running(client, "before", 2), 30, "the first deployment's pods to run")

        # SIGKILL the leader: no release, the others must wait the Lease out.
        node_lease = await client.get("leases", "ha-node", "kube-node-lease", raw=True)
        killed_at = time.monotonic()
        first.stop(signal.SIGKILL)
        survivors = {p.popen.pid for p in others}

        async def taken_over() -> dict[str, str | None] | None:
            h = await _holders(client)
            return h if all(_pid_of(v) in survivors for v in h.values()) else None

        new_holders = await _until(taken_over, 30, "a surviving server to take both Leases")
        failover = time.monotonic() - killed_at
        print(f"\nfailover: both Leases held by survivors {failover:.2f}s after SIGKILL "
              f"(lease {LEASE['duration']}s, retry {LEASE['retry_period']}s); holders {new_holders}")

        # The new leaders' controllers and scheduler serve new work, and the agent, which was
        # talking to the dead server, runs it through another one.
        await client.create(_deployment("after", 2), "default")
        await _until(lambda: _running(client, "after", 2), 30, "the new deployment's pods to run")
        await client.set_scale("deployments", "before", 3, "default")
        await _until(lambda: _running(client, "before", 3), 30, "the scaled-up deployment's pods to run")

        async def heartbeat_moved() -> bool:
            lease = await client.get("leases", "ha-node", "kube-node-lease", raw=True)
            return lease["spec"]["renewTime"] != node_lease["spec"]["renewTime"]

        await _until(heartbeat_moved, 30, "the agent to renew its node Lease through another server")
        leaders = [p for p in others if any("became leader" in line for line in p.output)]
        assert leaders, "no surviving server said it became leader"
    finally:
        if client is not None:
            await client.close()
        for p in reversed(procs):
            p.stop()
