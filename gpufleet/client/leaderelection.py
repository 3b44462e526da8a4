"""Leader election through a coordination.k8s.io/v1 Lease, after client-go's leaderelection.

Several replicas of a component (the scheduler, the controller manager) campaign for one
Lease; the one whose name is in ``spec.holderIdentity`` acts, the others wait. The holder
renews ``spec.renewTime`` every ``retry_period``; a candidate takes the Lease over only when
it has not seen the record change for ``lease_duration`` seconds by its own clock (never by
comparing the remote ``renewTime`` with its own wall time, so clock offsets between machines
do not matter, only their rates). A holder that has not renewed for ``renew_deadline`` stops
acting at once, before anyone else can have taken over (``renew_deadline < lease_duration``).
Every write is a compare-and-swap on the Lease's resourceVersion, so of two candidates
racing for an expired Lease exactly one wins.

Like client-go, this does not fence: a leader paused longer than the lease (a stopped
process, a frozen VM) may act once more when it wakes, before it notices it lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.client.api import Client
from gpufleet.client.errors import AlreadyExists, ClientError, Conflict, NotFound
from gpufleet.utils.clock import REAL_CLOCK, Clock, rfc3339

log = logging.getLogger("gpufleet.leaderelection")

LEASE_NAMESPACE = "kube-system"
SCHEDULER_LEASE = "gpufleet-scheduler"
CONTROLLER_MANAGER_LEASE = "gpufleet-controller-manager"
# client-go's JitterFactor: renew_deadline must leave room for more than one retry.
JITTER_FACTOR = 1.2


def default_identity() -> str:
    """``<hostname>_<random>``, as kube-scheduler does: unique per process, so a restarted
    replica is a new candidate and never mistakes its predecessor's Lease for its own."""
    return f"{socket.gethostname().split('.')[0].lower()}_{os.getpid()}_{secrets.token_hex(4)}"


@dataclass
class LeaderElectionConfig:
    name: str
    identity: str
    namespace: str = LEASE_NAMESPACE
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    # Give the Lease up on a clean stop, so that another replica takes over at once
    # instead of after lease_duration.
    release_on_cancel: bool = True

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("leader election: identity must not be empty")
        if self.retry_period <= 0:
            raise ValueError("leader election: retry_period must be greater than zero")
        if self.lease_duration <= self.renew_deadline:
            raise ValueError(f"leader election: lease_duration ({self.lease_duration}s) must be greater "
                             f"than renew_deadline ({self.renew_deadline}s)")
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            raise ValueError(f"leader election: renew_deadline ({self.renew_deadline}s) must be greater "
                             f"than {JITTER_FACTOR} x retry_period ({self.retry_period}s)")
        if self.lease_duration < 1:
            raise ValueError("leader election: lease_duration must be at least 1s (the Lease holds whole seconds)")

    @classmethod
    def scaled(cls, name: str, identity: str, lease_duration: float, **kw: Any) -> LeaderElectionConfig:
        """A config keeping Kubernetes' default proportions (15s : 10s : 2s) for a given
        lease duration."""
        return cls(name=name, identity=identity, lease_duration=lease_duration,
                   renew_deadline=lease_duration * 2 / 3, retry_period=lease_duration * 2 / 15, **kw)


OnStarted = Callable[[], Awaitable[None]]
OnStopped = Callable[[], Awaitable[None]]
OnNewLeader = Callable[[str], None]


class LeaderElector:
    """Campaigns for one Lease; runs ``on_started_leading`` when it wins and
    ``on_stopped_leading`` when it loses (or stops), then campaigns again.

    ``on_started_leading`` runs beside the renewals (a slow start must not let the Lease
    lapse) and is cancelled if leadership is lost before it finishes; ``on_stopped_leading``
    must then undo whatever part of it ran.
    """

    def __init__(
        self,
        client: Client,
        config: LeaderElectionConfig,
        *,
        on_started_leading: OnStarted,
        on_stopped_leading: OnStopped,
        on_new_leader: OnNewLeader | None = None,
        holder_gone: Callable[[str], bool] | None = None,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.client = client
        self.config = config
        self.clock = clock
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.on_new_leader = on_new_leader
        # Optional knowledge that a holder is surely gone (its process no longer exists),
        # which lets a candidate take the Lease without waiting out its duration.
        self.holder_gone = holder_gone
        self.first_attempt = asyncio.Event()  # set once the first acquire attempt is over
        # The last Lease read or written, and when (by our clock) its record last changed.
        self._lease: dict[str, Any] | None = None
        self._observed_spec: dict[str, Any] | None = None
        self._observed_time = 0.0
        self._reported_leader: str | None = None
        self._leading = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._lost_reason = ""
        self.terms = 0  # terms this elector has led

    # -- state ------------------------------------------------------------------------

    @property
    def identity(self) -> str:
        return self.config.identity

    @property
    def leader(self) -> str | None:
        """The holder as last observed (None: nobody)."""
        spec = self._observed_spec or {}
        return spec.get("holderIdentity") or None

    def is_leader(self) -> bool:
        """Whether the last observed record names us: note this is true from the moment a
        write names us, even before the callbacks ran."""
        return self.leader == self.identity

    @property
    def leading(self) -> bool:
        """Whether this elector is in a term (its component should be running)."""
        return self._leading

    def _lease_valid(self) -> bool:
        spec = self._observed_spec or {}
        duration = spec.get("leaseDurationSeconds") or 0
        return self._observed_time + duration > self.clock.monotonic()

    def _observe(self, lease: dict[str, Any]) -> None:
        spec = dict(lease.get("spec") or {})
        self._lease = lease
        if spec != self._observed_spec:
            self._observed_spec = spec
            self._observed_time = self.clock.monotonic()
        holder = spec.get("holderIdentity") or None
        if holder != self._reported_leader:
            self._reported_leader = holder
            if holder is not None and self.on_new_leader is not None:
                self.on_new_leader(holder)

    # -- one step ---------------------------------------------------------------------

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: create the Lease, renew ours, or take over an expired or released
        one. True when we hold it afterwards."""
        cfg = self.config
        now = rfc3339(self.clock.now(), micro=True)
        record: dict[str, Any] = {"holderIdentity": cfg.identity,
                                  "leaseDurationSeconds": max(1, round(cfg.lease_duration)),
                                  "acquireTime": now, "renewTime": now, "leaseTransitions": 0}
        # Fast path: while we lead, write over the Lease we last saw; a Conflict means
        # someone else wrote, and the slow path below reads what they wrote.
        if self.is_leader() and self._lease_valid() and self._lease is not None:
            spec = self._observed_spec or {}
            record["acquireTime"] = spec.get("acquireTime") or now
            record["leaseTransitions"] = spec.get("leaseTransitions") or 0
            try:
                self._observe(await self.client.update(self._with_spec(self._lease, record), raw=True))
                return True
            except Conflict:
                pass
            except ClientError as exc:
                log.warning("leader election %s: renewing failed: %s", cfg.name, exc)
                return False
        try:
            current = await self.client.get("leases", cfg.name, cfg.namespace, raw=True)
        except NotFound:
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": cfg.name, "namespace": cfg.namespace}, "spec": record}
            try:
                self._observe(await self.client.create(lease, cfg.namespace, raw=True))
            except (AlreadyExists, Conflict):
                return False
            except ClientError as exc:
                log.warning("leader election %s: creating the Lease failed: %s", cfg.name, exc)
                return False
            return True
        except ClientError as exc:
            log.warning("leader election %s: reading the Lease failed: %s", cfg.name, exc)
            return False
        self._observe(current)
        spec = self._observed_spec or {}
        holder = spec.get("holderIdentity")
        if holder and self._lease_valid() and not self.is_leader() and not (
                self.holder_gone is not None and self.holder_gone(holder)):
            return False  # held by another, and we saw it renewed within its duration
        if self.is_leader():
            record["acquireTime"] = spec.get("acquireTime") or now
            record["leaseTransitions"] = spec.get("leaseTransitions") or 0
        else:
            record["leaseTransitions"] = (spec.get("leaseTransitions") or 0) + 1
        try:
            self._observe(await self.client.update(self._with_spec(current, record), raw=True))
        except ClientError as exc:
            if not isinstance(exc, Conflict):
                log.warning("leader election %s: updating the Lease failed: %s", cfg.name, exc)
            return False
        return True

    async def release(self) -> bool:
        """Give the Lease up (holder cleared, duration 1s) if we hold it."""
        if not self.is_leader() or self._lease is None:
            return True
        lease = self._lease
        for _ in range(3):
            now = rfc3339(self.clock.now(), micro=True)
            spec = lease.get("spec") or {}
            record = {"leaseDurationSeconds": 1, "acquireTime": now, "renewTime": now,
                      "leaseTransitions": spec.get("leaseTransitions") or 0}
            try:
                self._observe(await self.client.update(self._with_spec(lease, record), raw=True))
                return True
            except Conflict:
                # A renewal whose answer we never got (a stop landing mid-request) moved
                # the version on: release what is there, if it is still ours.
                try:
                    lease = await self.client.get("leases", self.config.name, self.config.namespace, raw=True)
                except ClientError as exc:
                    log.warning("leader election %s: releasing the Lease failed: %s", self.config.name, exc)
                    return False
                if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                    return True
            except ClientError as exc:
                log.warning("leader election %s: releasing the Lease failed: %s", self.config.name, exc)
                return False
        return False

    @staticmethod
    def _with_spec(lease: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
        out = dict(lease)
        out["spec"] = {**{k: v for k, v in (lease.get("spec") or {}).items()
                          if k in ("strategy", "preferredHolder")}, **spec}
        return out

    # -- the loop ---------------------------------------------------------------------

    async def _attempt(self) -> bool:
        try:
            return await self.try_acquire_or_renew()
        except Exception:  # one bad answer must not end the campaign
            log.exception("leader election %s: attempt failed", self.config.name)
            return False

    async def _acquire(self) -> None:
        while True:
            try:
                ok = await self._attempt()
            finally:
                self.first_attempt.set()
            if ok:
                return
            await self.clock.sleep(self.config.retry_period)
            self._check_stopping()

    def _check_stopping(self) -> None:
        # A cancellation lost somewhere below (see _renew) still ends the loop.
        if self._stopping:
            raise asyncio.CancelledError

    async def _renew(self, starting: asyncio.Task[None]) -> str:
        """Renew every retry_period. Returns "lost" when renew_deadline passed without a
        success, "failed" when the component could not start."""
        cfg = self.config
        last = self.clock.monotonic()
        while True:
            await self.clock.sleep(cfg.retry_period)
            self._check_stopping()
            if starting.done() and not starting.cancelled() and starting.exception() is not None:
                log.error("leader election %s: starting the leader's work failed: %r; giving the Lease up",
                          cfg.name, starting.exception())
                return "failed"
            left = cfg.renew_deadline - (self.clock.monotonic() - last)
            ok = False
            if left > 0:
                try:
                    # A request that hangs counts as a failure once the deadline passes.
                    # (asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow
                    # a cancellation that lands as the attempt finishes, and stop() hang.)
                    async with asyncio.timeout(left):
                        ok = await self._attempt()
                except TimeoutError:
                    ok = False
            if ok:
                last = self.clock.monotonic()
            elif self.leader not in (None, self.identity):
                # Someone else holds it now: stop at once, not at the deadline.
                self._lost_reason = f"the Lease is held by {self.leader}"
                return "lost"
            elif self.clock.monotonic() - last >= cfg.renew_deadline:
                self._lost_reason = f"no renewal for {cfg.renew_deadline:g}s"
                return "lost"

    async def run_term(self) -> None:
        """Acquire, lead until the Lease is lost (or the task is cancelled), stop leading."""
        await self._acquire()
        self._leading = True
        self.terms += 1
        log.info("leader election %s: %s became leader", self.config.name, self.identity)
        starting = asyncio.create_task(self.on_started_leading(), name=f"leader:{self.config.name}:start")
        outcome = "stopped"
        try:
            outcome = await self._renew(starting)
        finally:
            self._leading = False
            if outcome == "lost":
                log.warning("leader election %s: %s lost leadership (%s); stopping",
                            self.config.name, self.identity, self._lost_reason)
            if not starting.done():
                starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await starting
            try:
                await self.on_stopped_leading()
            finally:
                if outcome == "lost":
                    # Forget our record: the next term must read the Lease afresh.
                    self._observed_spec, self._lease = None, None
                elif outcome == "failed" or self.config.release_on_cancel:
                    await self.release()

    async def run(self) -> None:
        """Campaign, lead, and campaign again after a lost term, until cancelled."""
        while True:
            await self.run_term()
            await self.clock.sleep(self.config.retry_period)
            self._check_stopping()

    def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self.run(), name=f"leader:{self.config.name}")

    async def stop(self) -> None:
        """Stop leading (the component first, then the Lease is released) or campaigning."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
