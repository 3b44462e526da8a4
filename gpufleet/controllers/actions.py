"""What a controller decided to do, as data, and the one step that does it.

A controller's sync is split in two: ``decide(observed, now) -> Actions`` reads a snapshot
(typed models from the informers, what the controller remembers, the time) and returns what
should change, touching nothing; ``apply`` sends it to the API server. The decision can then
be tested as a plain function, and every controller acts the same way: creates in slow-start
batches with expectations, deletes tolerant of objects already gone, a status written only
when it changed, Events on the owner.

``apply`` goes in a fixed order: Events, patches, updates, status, deletes, creates. The status is
written before the pods are touched, so a status write that conflicts leaves nothing half
done that the next sync would misread (a Failed condition lost after its pods were deleted
would read as lost pods).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from gpufleet.client.api import Client, retry_on_conflict
from gpufleet.client.errors import AlreadyExists, ApiError, Conflict, NotFound
from gpufleet.client.events import NORMAL, WARNING, EventRecorder
from gpufleet.controllers._common import Expectations, error_text, slow_start_batch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Instant:
    """The time a decision is made at: wall-clock seconds, the same as RFC 3339 text, and the
    monotonic clock (for back-offs and intervals kept in memory)."""

    wall: float
    text: str
    monotonic: float = 0.0


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Create:
    """An object to create (a wire dict). ``expect``: a child counted in the controller's
    expectations (pods), created in slow-start batches. ``on_exists``: what AlreadyExists
    means: "fail" (an error), "ignore" (it is there: done), or "update" (copy ``fields`` onto
    the stored object and write it when they differ). ``memo``: (key, value) remembered once
    created, so a later sync with the same value skips the request. ``optional``: an API
    that does not serve the kind is not an error (logged once). ``tag``: returned in
    ``Outcome.created`` when this create succeeded."""

    body: dict[str, Any]
    expect: bool = False
    on_exists: str = "fail"
    fields: tuple[str, ...] = ()
    memo: tuple[Any, Any] | None = None
    optional: bool = False
    success_reason: str | None = None
    failure_reason: str | None = None
    tag: Any = None

    @property
    def namespace(self) -> str | None:
        return (self.body.get("metadata") or {}).get("namespace") or None


@dataclass(frozen=True)
class Delete:
    """An object to delete. NotFound is success. ``expect``: counted in expectations.
    ``must``: an error is raised after the others were tried (else it is logged).
    ``ignore_conflict``: a Conflict (the uid precondition failed: it was replaced) is success.
    ``forget``: a memo key dropped once deleted."""

    kind: Any
    name: str
    namespace: str | None
    uid: str | None = None
    grace_period_seconds: int | None = None
    propagation_policy: str | None = None
    expect: bool = False
    must: bool = True
    ignore_conflict: bool = False
    forget: Any = None
    success_reason: str | None = None
    failure_reason: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True)
class Patch:
    """A merge patch (of ``subresource``, e.g. "status", when set). ``owner``: it patches the
    object the actions are about, whose answer is then the base the status is written on (so
    the status write does not conflict with it)."""

    kind: Any
    name: str
    namespace: str | None
    patch: dict[str, Any]
    owner: bool = False
    subresource: str | None = None


@dataclass(frozen=True)
class Update:
    """A whole object written back (PUT): its resourceVersion makes the write a compare-and-swap,
    so a cache behind someone else's write conflicts. Updates are sent in order, one at a time;
    a later update of an object updated before in the same apply is sent on the version that
    write answered. ``event``: recorded on the owner once the write succeeded."""

    body: dict[str, Any]
    event: Event | None = None

    @property
    def identity(self) -> tuple[Any, ...]:
        meta = self.body.get("metadata") or {}
        return (self.body.get("apiVersion"), self.body.get("kind"), meta.get("namespace"), meta.get("name"))


@dataclass
class Actions:
    """What one sync decided. ``status``: the owner's new status, None to leave it.
    ``reason``: which rule decided (a row of the controller's table), for logs and tests.
    ``memo``: what the controller should remember about the owner afterwards (its own
    in-memory bookkeeping: back-off deadlines, the last reported reason, ...)."""

    creates: list[Create] = field(default_factory=list)
    deletes: list[Delete] = field(default_factory=list)
    patches: list[Patch] = field(default_factory=list)
    updates: list[Update] = field(default_factory=list)
    status: dict[str, Any] | None = None
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    reason: str = ""
    memo: dict[str, Any] = field(default_factory=dict)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def requeue(self, after: float | None) -> None:
        """Ask to be called again after ``after`` seconds, keeping the earliest ask."""
        if after is None:
            return
        self.requeue_after = after if self.requeue_after is None else min(self.requeue_after, after)

    @property
    def empty(self) -> bool:
        return not (self.creates or self.deletes or self.patches or self.updates or self.events) \
            and self.status is None


@dataclass
class Outcome:
    """What ``apply`` did: the tags of the creates that succeeded, the deletes sent, and the
    first error of a create or a ``must`` delete (already raised unless ``raise_errors`` was
    False); ``answers``: the API's answer to each tagged create that was not counted in
    expectations (the object as stored); ``failed``: the deletes that failed (NotFound is
    success); ``owner``: the owner as the last patch or status write answered it, None when
    neither was sent; ``updated``: the API's answer to each update, in order."""

    created: list[Any] = field(default_factory=list)
    answers: dict[Any, dict[str, Any]] = field(default_factory=dict)
    deleted: list[Delete] = field(default_factory=list)
    failed: list[Delete] = field(default_factory=list)
    error: ApiError | None = None
    owner: dict[str, Any] | None = None
    updated: list[dict[str, Any]] = field(default_factory=list)


def _kind_word(kind: Any) -> str:
    if isinstance(kind, str):
        return kind.rsplit("/", 1)[-1].lower()
    return getattr(kind, "__name__", str(kind)).lower()


async def apply(
    client: Client,
    actions: Actions,
    *,
    owner: Any = None,
    recorder: EventRecorder | None = None,
    expectations: Expectations | None = None,
    key: str | None = None,
    known: dict[Any, Any] | None = None,
    raise_errors: bool = True,
) -> Outcome:
    """Carry out ``actions`` for ``owner`` (the object they are about, a model or a wire dict, whose controller key
    is ``key``): Events, patches, updates, status, deletes, creates. Patch, update and status
    errors raise at once; the first create or ``must`` delete error is raised once every delete was tried
    and the create batches stopped (or returned in the outcome with ``raise_errors=False``)."""
    known = known if known is not None else {}
    outcome = Outcome()

    async def record(type_: str, reason: str, message: str) -> None:
        if recorder is not None and owner is not None:
            await recorder.record(owner, type_, reason, message)

    for ev in actions.events:
        await record(ev.type, ev.reason, ev.message)

    base: dict[str, Any] | None = None
    for p in actions.patches:
        extra = {"subresource": p.subresource} if p.subresource else {}
        updated = await client.patch(p.kind, p.name, p.patch, p.namespace, raw=True, **extra)
        if p.owner:
            base = outcome.owner = updated

    versions: dict[tuple[Any, ...], str] = {}
    for u in actions.updates:
        body = u.body
        if u.identity in versions:
            body = {**body, "metadata": {**(body.get("metadata") or {}), "resourceVersion": versions[u.identity]}}
        answer = await client.update(body, raw=True)
        outcome.updated.append(answer)
        versions[u.identity] = (answer.get("metadata") or {}).get("resourceVersion", "")
        if u.event is not None:
            await record(u.event.type, u.event.reason, u.event.message)

    if actions.status is not None and owner is not None:
        body = base if base is not None else (owner.to_dict() if hasattr(owner, "to_dict") else dict(owner))
        body["status"] = actions.status
        outcome.owner = await client.update_status(body, raw=True)

    errors: list[ApiError] = []
    await _deletes(client, actions.deletes, record, expectations, key, known, errors, outcome)
    await _creates(client, actions.creates, record, expectations, key, known, errors, outcome)
    if errors:
        outcome.error = errors[0]
        if raise_errors:
            raise errors[0]
    return outcome


async def _deletes(client: Client, deletes: list[Delete], record: Any, expectations: Expectations | None,
                   key: str | None, known: dict[Any, Any], errors: list[ApiError], outcome: Outcome) -> None:
    if not deletes:
        return
    expected = [d for d in deletes if d.expect]
    if expected and expectations is not None and key is not None:
        expectations.expect_deletions(key, [d.key for d in expected])

    def observed(d: Delete) -> None:
        if d.expect and expectations is not None and key is not None:
            expectations.deletion_observed(key, d.key)

    async def delete_one(d: Delete) -> None:
        try:
            await client.delete(d.kind, d.name, d.namespace, grace_period_seconds=d.grace_period_seconds,
                                propagation_policy=d.propagation_policy, preconditions_uid=d.uid)
        except NotFound:
            observed(d)
        except Conflict as e:
            observed(d)
            if not d.ignore_conflict:
                await failed(d, e)
        except ApiError as e:
            # Never deleted, so its deletion will never be observed.
            observed(d)
            await failed(d, e)
        else:
            outcome.deleted.append(d)
            if d.success_reason:
                await record(NORMAL, d.success_reason, f"Deleted {_kind_word(d.kind)}: {d.name}")
        if d.forget is not None:
            known.pop(d.forget, None)

    async def failed(d: Delete, e: ApiError) -> None:
        outcome.failed.append(d)
        if d.failure_reason:
            await record(WARNING, d.failure_reason, f"Error deleting: {error_text(e)}")
        if d.must:
            errors.append(e)
        else:
            log.info("deleting %s %s: %s", _kind_word(d.kind), d.key, e)

    await asyncio.gather(*(delete_one(d) for d in deletes))


async def _creates(client: Client, creates: list[Create], record: Any, expectations: Expectations | None,
                   key: str | None, known: dict[Any, Any], errors: list[ApiError], outcome: Outcome) -> None:
    for c in creates:
        if c.expect:
            continue
        if c.memo is not None and known.get(c.memo[0]) == c.memo[1]:
            continue
        try:
            answer = await _create(client, c)
        except LookupError as e:
            if not c.optional:
                raise
            kind = c.body.get("kind")
            if not known.get(("unserved", kind)):
                log.warning("%s is not served (%s)", kind, e)
            known[("unserved", kind)] = True
            continue
        if c.tag is not None and answer is not None:
            outcome.answers[c.tag] = answer
        if c.memo is not None:
            known[c.memo[0]] = c.memo[1]

    pending = [c for c in creates if c.expect]
    if not pending:
        return
    if expectations is not None and key is not None:
        expectations.expect_creations(key, len(pending))

    def observed() -> None:
        if expectations is not None and key is not None:
            expectations.creation_observed(key)

    queue = list(pending)

    async def create_one() -> None:
        c = queue.pop(0)
        try:
            created = await _create(client, c)
        except ApiError as e:
            observed()
            if c.failure_reason:
                await record(WARNING, c.failure_reason, f"Error creating: {error_text(e)}")
            raise
        if created is None:  # it was there already
            observed()
            return
        outcome.created.append(c.tag)
        if c.success_reason:
            name = (created.get("metadata") or {}).get("name", "")
            await record(NORMAL, c.success_reason, f"Created {_kind_word(c.body.get('kind', ''))}: {name}")

    # Doubling batches (1, 2, 4, ...): a create refused for quota or admission is refused for
    # every pod alike, and stops after one.
    _, error = await slow_start_batch(len(pending), create_one)
    # Creates never sent will never be observed.
    for _ in range(len(queue)):
        observed()
    if error is not None:
        if not isinstance(error, ApiError):
            raise error
        errors.append(error)


async def _create(client: Client, c: Create) -> dict[str, Any] | None:
    """Create ``c``; None when it existed already and ``on_exists`` accepts that."""
    try:
        return await client.create(c.body, c.namespace, raw=True)
    except AlreadyExists:
        if c.on_exists == "fail":
            raise
        if c.on_exists == "ignore":
            return None
    meta = c.body.get("metadata") or {}
    kind = f"{c.body.get('apiVersion')}/{c.body.get('kind')}"

    async def attempt() -> None:
        fresh = await client.get(kind, meta.get("name"), c.namespace, raw=True)
        if any(fresh.get(f) != c.body.get(f) for f in c.fields):
            for f in c.fields:
                fresh[f] = c.body.get(f)
            await client.update(fresh, raw=True)

    await retry_on_conflict(attempt)
    return None
