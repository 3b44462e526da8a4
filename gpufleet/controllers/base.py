"""The wiring every controller repeats.

``ControllerBase``: the client, clock, Event recorder and worker count every controller is
given; ``QueueController`` adds one work queue and its workers, started and stopped.

``KeyedController``: a controller keyed by its own object (a Service's Endpoints, a budget,
a quota, a Namespace, a Node): the object's informer feeding a work queue of its keys,
start/stop, the time a decision is made at, and ``act`` applying a decision. ``sync(key,
obj)`` is called with the cached object, None once it is gone.

``OwnerController`` adds what every owner controller repeats: expectations, the owner key
of a child, enqueueing the owners whose selector matches an orphan, and forgetting what was
remembered about an owner once it is gone (NotFound in the cache).

A controller built on it names its owner model and kind, registers event handlers for its
children, and implements ``sync(key, obj)``; ``forget(key)`` drops its own memory. The
decision inside ``sync`` is a pure function returning ``actions.Actions``; ``act`` applies
it with the controller's client, recorder and expectations.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

from gpufleet.api.k8s import Pod
from gpufleet.api.selectors import LabelSelector
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Controller, Requeue
from gpufleet.client.errors import ApiError, Conflict, NotFound
from gpufleet.client.events import EventRecorder
from gpufleet.client.informer import NAMESPACE_INDEX, Informer, SharedInformerFactory
from gpufleet.client.workqueue import WorkQueue
from gpufleet.controllers._common import Expectations, is_being_deleted, pod_is_ready, resolve_controller
from gpufleet.controllers.actions import Actions, Instant, Outcome, apply
from gpufleet.utils.clock import REAL_CLOCK, Clock, rfc3339

log = logging.getLogger(__name__)


class ControllerBase:
    """What every controller is given: the client, the clock, an Event recorder (its source
    ``component``, "<name>-controller" when empty) and its number of workers. Its own options
    are the fields of ``settings_type`` (a dataclass, with their defaults), built into
    ``self.settings`` from the keywords; or a subclass takes them as keywords and passes the
    rest on (``**kwargs``)."""

    name: ClassVar[str] = ""
    component: ClassVar[str] = ""  # the Events' source; "<name>-controller" when empty
    settings_type: ClassVar[Any] = None

    def __init__(
        self,
        client: Client,
        informers: SharedInformerFactory,
        *,
        clock: Clock = REAL_CLOCK,
        recorder: EventRecorder | None = None,
        workers: int = 2,
        **options: Any,
    ) -> None:
        if self.settings_type is not None:
            self.settings = self.settings_type(**options)
        elif options:
            raise TypeError(f"{type(self).__name__} got unexpected options: {', '.join(sorted(options))}")
        self.client = client
        self.clock = clock
        self.recorder = recorder or EventRecorder(client, self.component or f"{self.name}-controller", clock=clock)
        self.workers = workers

    def now(self) -> Instant:
        return Instant(self.clock.now(), rfc3339(self.clock.now()), self.clock.monotonic())


class QueueController(ControllerBase):
    """A controller with one work queue (named ``name``) whose workers call ``reconcile(key)``;
    the subclass decides what its keys are and what enqueues them."""

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.queue = WorkQueue(self.name, clock=self.clock)
        self.controller = Controller(self.name, self.reconcile, self.queue, workers=self.workers)

    async def start(self) -> None:
        await self.controller.start()

    async def stop(self) -> None:
        await self.controller.stop()

    async def reconcile(self, key: Any) -> Requeue | None:
        raise NotImplementedError


class KeyedController(QueueController):
    """Base for a controller of ``model`` objects keyed by their own key. ``informer_options``:
    passed to the informer (a namespace, a field selector)."""

    model: ClassVar[Any] = None
    informer_options: ClassVar[dict[str, Any]] = {}

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.informer: Informer = informers.informer(self.model, **self.informer_options)
        self.controller.watch(self.informer, update_matters=self.update_matters)

    def update_matters(self, old: Any, new: Any) -> bool:
        """Whether an update of a watched object needs a sync (a subclass narrows it)."""
        return True

    async def reconcile(self, key: Any) -> Requeue | None:
        return await self.sync(str(key), self.informer.get(str(key)))

    async def sync(self, key: str, obj: Any | None) -> Requeue | None:
        raise NotImplementedError

    async def act(self, key: str, owner: Any, actions: Actions, *, raise_errors: bool = True) -> Outcome:
        """Apply ``actions`` about ``owner`` (the object of ``key``; None when there is none)."""
        return await apply(self.client, actions, owner=owner, recorder=self.recorder, raise_errors=raise_errors)

    @staticmethod
    def requeue(actions: Actions) -> Requeue | None:
        return Requeue(after=actions.requeue_after) if actions.requeue_after is not None else None


class OwnerController(KeyedController):
    """Base for a controller of ``owner_model`` objects (kind ``kind``) and their children."""

    kind: ClassVar[str] = ""
    owner_model: ClassVar[Any] = None

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        self.model = self.owner_model  # the owner is the object of the key
        super().__init__(client, informers, **kwargs)
        self.owners: Informer = self.informer
        self.expectations = Expectations(self.clock)
        # What apply remembers of objects it created (memo keys), so a sync does not rewrite them.
        self.known: dict[Any, Any] = {}
        # UIDs of child pods this controller deleted and has not yet seen go (decide_pods).
        self._deleting: set[str] = set()

    # -- children's events ------------------------------------------------------------------

    def owner_key(self, child: Any) -> str | None:
        """The key of the cached owner that ``child``'s controller reference names (same uid)."""
        owner = resolve_controller(self.owners, child, self.kind)
        return objects.object_key(owner) if owner is not None else None

    def enqueue_owner(self, child: Any) -> str | None:
        key = self.owner_key(child)
        if key:
            self.queue.add(key)
        return key

    def enqueue_old_owner(self, old: Any, new: Any) -> bool:
        """A child updated: when its controller reference changed, the owner it left is
        enqueued. Whether the reference changed."""
        old_ref, new_ref = objects.controller_ref(old), objects.controller_ref(new)
        changed = objects.field(old_ref, "uid") != objects.field(new_ref, "uid")
        if changed and old_ref is not None:
            self.enqueue_owner(old)
        return changed

    def child_deleted(self, child: Any) -> str | None:
        """A child is gone: its deletion is observed (if this controller deleted it) and its
        owner synced. The owner's key, None when it has none cached."""
        key = self.owner_key(child)
        if key:
            self.expectations.deletion_observed(key, objects.object_key(child))
            self.queue.add(key)
        return key

    def child_created(self, child: Any) -> str | None:
        """A child naming a cached owner appeared: its creation is observed and its owner
        synced. The owner's key, None when it has none cached."""
        key = self.owner_key(child)
        if key:
            self.expectations.creation_observed(key)
            self.queue.add(key)
        return key

    def enqueue_matching(self, child: Any, selector_of: Callable[[Any], LabelSelector]) -> None:
        """Enqueue every owner in the child's namespace whose selector matches its labels (an
        orphan may be adopted by any of them)."""
        labels = objects.labels_of(child)
        for owner in self.owners.by_index(NAMESPACE_INDEX, objects.namespace_of(child)):
            if selector_of(owner).matches(labels):
                self.queue.add(objects.object_key(owner))

    def child_added(self, child: Any, selector_of: Callable[[Any], LabelSelector]) -> None:
        """A child created: a deleted one is a deletion; one with a controller reference has its
        creation observed and its owner synced; an orphan goes to the owners that may adopt it."""
        if is_being_deleted(child):
            self.child_deleted(child)
            return
        if objects.controller_ref(child) is not None:
            self.child_created(child)
            return
        self.enqueue_matching(child, selector_of)

    def child_updated(self, old: Any, new: Any, selector_of: Callable[[Any], LabelSelector]) -> None:
        """A child pod updated (StatefulSet and DaemonSet): deletion started, owner changed, or
        an owned pod's change (a newly Ready one wakes its owner again after minReadySeconds,
        when it counts as available); an orphan whose labels changed may be adopted."""
        if objects.resource_version_of(old) == objects.resource_version_of(new):
            return
        if is_being_deleted(new) and not is_being_deleted(old):
            self.child_deleted(new)
            return
        self.enqueue_old_owner(old, new)
        if objects.controller_ref(new) is not None:
            key = self.enqueue_owner(new)
            owner = self.owners.get(key) if key else None
            min_ready = (owner.spec.min_ready_seconds or 0) if owner is not None else 0
            if key and min_ready and not pod_is_ready(old) and pod_is_ready(new):
                self.queue.add_after(key, min_ready + 0.001)
            return
        if objects.labels_of(old) != objects.labels_of(new):
            self.enqueue_matching(new, selector_of)

    # -- sync --------------------------------------------------------------------------------

    async def reconcile(self, key: Any) -> Requeue | None:
        obj = self.owners.get(key)
        if obj is None:
            self.expectations.forget(key)
            self.forget(key)
            return None
        return await self.sync(key, obj)

    def retry_later(self, key: str, error: ApiError, what: str = "") -> Requeue | None:
        """What a sync answers when the API refused a write: nothing more to do on NotFound
        (the owner, or what was written, is gone); for another error (mostly a Conflict with a
        write the cache has not shown yet) it is logged and the owner looked at again."""
        if isinstance(error, NotFound):
            return None
        log.info("%s %s: %s%s", self.name, key, what, error)
        return Requeue()

    def forget(self, key: str) -> None:
        """Drop what the controller remembers about the owner ``key``, which is gone."""

    async def decide_pods(self, key: str, owner: Any, decide: Callable[[], Actions],
                          remember: Callable[[Actions, Outcome], None] | None = None) -> Requeue | None:
        """The sync of a controller whose decision makes and deletes pods: nothing while
        creations it made are not seen yet, then ``decide()``; the pods it deletes are kept in
        ``_deleting`` (a controller drops a uid when it sees the pod go) and the decision is
        applied (``apply_decision``, ``remember`` told what was done)."""
        if not self.expectations.satisfied(key):
            return None
        actions = decide()
        if actions.empty:
            return self.requeue(actions)
        self._deleting.update(d.uid for d in actions.deletes if d.kind is Pod and d.uid)
        return await self.apply_decision(key, owner, actions, remember)

    async def apply_decision(self, key: str, owner: Any, actions: Actions,
                             remember: Callable[[Actions, Outcome], None] | None = None) -> Requeue | None:
        """Apply a sync's decision, hand ``remember`` what was done (also when a write failed
        after others went through), and answer what the work queue does next: again at once
        after a Conflict, later after another refusal (``retry_later``), else as the decision
        asked."""
        try:
            outcome = await self.act(key, owner, actions, raise_errors=False)
            if remember is not None:
                remember(actions, outcome)
            if outcome.error is not None:
                raise outcome.error
        except Conflict:
            return Requeue()
        except ApiError as e:
            return self.retry_later(key, e)
        return self.requeue(actions)

    async def act(self, key: str, owner: Any, actions: Actions, *, raise_errors: bool = True) -> Outcome:
        return await apply(self.client, actions, owner=owner, recorder=self.recorder,
                           expectations=self.expectations, key=key, known=self.known,
                           raise_errors=raise_errors)
