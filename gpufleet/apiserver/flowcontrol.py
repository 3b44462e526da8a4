"""Max in-flight requests with priority levels and per-user fairness (API Priority and Fairness
in spirit).

kube-apiserver bounds the requests it works on at once: ``--max-requests-inflight`` (400)
read-only and ``--max-mutating-requests-inflight`` (200) mutating ones, and APF splits those
seats into priority levels, queues fairly per flow inside a level and answers 429 with
Retry-After when a queue is full or a request waited too long. Here:

- **exempt**: ``system:masters`` (the control plane's loopback, the admin) and the health
  probes (/healthz, /livez, /readyz never get this far): never queued.
- **system**: nodes (``system:nodes``, ``system:node:*``) and control-plane identities
  (``system:kube-scheduler``, ``system:kube-controller-manager``, kube-system service
  accounts): a quarter of each pool's seats kept for them, so a tenant's flood cannot hold
  back Lease renewals and controllers.
- **workload**: everyone else, in the rest of the seats, where one user holds at most a
  quarter of them. A request over that waits briefly in its user's queue (a freed seat goes
  to the waiting user holding the fewest), then gets 429 TooManyRequests, Retry-After: 1.

Long-running requests (a watch once its stream begins; log, exec, attach, port-forward and
proxy) do not hold a seat while they stream, as in Kubernetes: the seat is released when the
handler returns its answer, before the body of a stream is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from gpufleet.apiserver.admission import UserInfo
from gpufleet.apiserver.errors import ApiException
from gpufleet.apiserver.requestinfo import RequestInfo

EXEMPT, SYSTEM, WORKLOAD = "exempt", "system", "workload"
# Subresources whose requests stream for as long as the client wants: never seated.
LONG_RUNNING_SUBRESOURCES = frozenset({"log", "exec", "attach", "portforward", "proxy"})
MUTATING_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})

_EXEMPT_GROUPS = frozenset({"system:masters"})
_SYSTEM_GROUPS = frozenset({"system:nodes"})
_SYSTEM_USERS = frozenset({"system:kube-scheduler", "system:kube-controller-manager", "system:apiserver"})
_SYSTEM_USER_PREFIXES = ("system:node:", "system:serviceaccount:kube-system:")


def too_many_requests(retry_after: int) -> ApiException:
    """Kubernetes' answer from the max-in-flight and APF filters."""
    return ApiException(429, "TooManyRequests", "Too many requests, please try again later.",
                        {"retryAfterSeconds": retry_after}, {"retry-after": str(retry_after)})


class Rejected(Exception):
    """No seat: the user's queue is full or the request waited its longest."""


@dataclass
class FlowControlConfig:
    max_requests_inflight: int = 400  # 0: no limit
    max_mutating_requests_inflight: int = 200  # 0: no limit
    system_share: float = 0.25  # of each pool, kept for nodes and the control plane
    user_share: float = 0.25  # of the workload seats, the most one user holds
    queue_length: int = 50  # a user's requests that may wait at once
    queue_wait: float = 1.0  # seconds a request waits for a seat before its 429
    retry_after: int = 1


@dataclass
class _Waiter:
    user: str
    future: asyncio.Future[None]


@dataclass
class Level:
    """One priority level's seats. ``per_user`` bounds the seats one user holds; when the
    level or the user is full, requests wait (at most ``queue_length`` a user, ``queue_wait``
    seconds) and a freed seat goes to the waiting user holding the fewest."""

    name: str
    seats: int
    per_user: int
    queue_length: int
    queue_wait: float
    in_use: int = 0
    by_user: dict[str, int] = field(default_factory=dict)
    queues: dict[str, deque[_Waiter]] = field(default_factory=dict)
    rejected: int = 0

    def _grantable(self, user: str) -> bool:
        return self.in_use < self.seats and self.by_user.get(user, 0) < self.per_user

    def _grant(self, user: str) -> None:
        self.in_use += 1
        self.by_user[user] = self.by_user.get(user, 0) + 1

    def waiting(self, user: str | None = None) -> int:
        if user is not None:
            return len(self.queues.get(user, ()))
        return sum(len(q) for q in self.queues.values())

    async def acquire(self, user: str) -> None:
        if self._grantable(user) and not self.queues.get(user):
            self._grant(user)
            return
        queue = self.queues.setdefault(user, deque())
        if len(queue) >= self.queue_length or self.queue_wait <= 0:
            if not queue:
                del self.queues[user]
            self.rejected += 1
            raise Rejected(self.name)
        loop = asyncio.get_running_loop()
        waiter = _Waiter(user, loop.create_future())
        queue.append(waiter)
        timer = loop.call_later(self.queue_wait, self._expire, waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(user)  # granted, but its request went away before using it
            raise
        finally:
            timer.cancel()
            self._forget(waiter)

    def _expire(self, waiter: _Waiter) -> None:
        if not waiter.future.done():
            self.rejected += 1
            waiter.future.set_exception(Rejected(self.name))

    def _forget(self, waiter: _Waiter) -> None:
        queue = self.queues.get(waiter.user)
        if queue is None:
            return
        with contextlib.suppress(ValueError):
            queue.remove(waiter)
        if not queue:
            del self.queues[waiter.user]

    def release(self, user: str) -> None:
        self.in_use -= 1
        held = self.by_user.get(user, 0) - 1
        if held > 0:
            self.by_user[user] = held
        else:
            self.by_user.pop(user, None)
        self._dispatch()

    def _dispatch(self) -> None:
        while self.in_use < self.seats:
            candidates = [u for u, q in self.queues.items() if q and self.by_user.get(u, 0) < self.per_user]
            if not candidates:
                return
            # Fewest seats held first; among equals, who has waited longest (dict order is
            # the order users started waiting, and a served user moves to the back).
            user = min(candidates, key=lambda u: self.by_user.get(u, 0))
            queue = self.queues.pop(user)
            waiter = queue.popleft()
            if queue:
                self.queues[user] = queue
            if waiter.future.done():
                continue
            self._grant(user)
            waiter.future.set_result(None)


def _level_sizes(total: int, config: FlowControlConfig) -> tuple[int, int]:
    system = max(1, round(total * config.system_share))
    return system, max(1, total - system)


class FlowControl:
    """Seats for the requests of one API server (see the module's text)."""

    def __init__(self, config: FlowControlConfig | None = None) -> None:
        self.config = config or FlowControlConfig()
        self.levels: dict[tuple[str, bool], Level] = {}
        for mutating, total in ((False, self.config.max_requests_inflight),
                                (True, self.config.max_mutating_requests_inflight)):
            if total <= 0:
                continue
            system, workload = _level_sizes(total, self.config)
            self.levels[(SYSTEM, mutating)] = Level(
                f"{SYSTEM}{'-mutating' if mutating else ''}", system, system,
                self.config.queue_length, self.config.queue_wait)
            self.levels[(WORKLOAD, mutating)] = Level(
                f"{WORKLOAD}{'-mutating' if mutating else ''}", workload,
                max(1, int(workload * self.config.user_share)), self.config.queue_length, self.config.queue_wait)

    @staticmethod
    def priority(user: UserInfo) -> str:
        if _EXEMPT_GROUPS.intersection(user.groups):
            return EXEMPT
        if (_SYSTEM_GROUPS.intersection(user.groups) or user.name in _SYSTEM_USERS
                or user.name.startswith(_SYSTEM_USER_PREFIXES)):
            return SYSTEM
        return WORKLOAD

    def level_for(self, user: UserInfo, info: RequestInfo) -> Level | None:
        """The level whose seat the request takes; None when it takes none."""
        if info.subresource in LONG_RUNNING_SUBRESOURCES and info.is_resource_request:
            return None
        priority = self.priority(user)
        if priority == EXEMPT:
            return None
        return self.levels.get((priority, info.verb in MUTATING_VERBS))

    @contextlib.asynccontextmanager
    async def seat(self, user: UserInfo, info: RequestInfo) -> AsyncIterator[None]:
        """Holds a seat while the body runs; 429 TooManyRequests when none comes in time."""
        level = self.level_for(user, info)
        if level is None:
            yield
            return
        try:
            await level.acquire(user.name)
        except Rejected:
            raise too_many_requests(self.config.retry_after) from None
        try:
            yield
        finally:
            level.release(user.name)
