"""The store-facing generic registry: create, update, get, delete and list of any kind.

As kube-apiserver's generic registry Store: each verb does what all kinds share (names,
system metadata, preconditions, decoding, defaulting, field ownership, admission, the
compare-and-swap against the store) and asks the kind's Strategy (strategy.py) for the rest.
The verb handlers (handlers/), the subresources (subresources/) and in-process callers
(controllers through ApiServer's methods, admission plugins) all write through it.
"""

from __future__ import annotations

import base64
import uuid
from typing import TYPE_CHECKING, Any

import orjson

from gpufleet.api.registry import ResourceType
from gpufleet.api.selectors import FieldSelector, LabelSelector
from gpufleet.apiserver import decoding, heartbeat, managedfields
from gpufleet.apiserver.admission import AdmissionContext, UserInfo
from gpufleet.apiserver.errors import ApiException, already_exists, bad_request, conflict, invalid, not_found
from gpufleet.apiserver.limits import check_object_size, off_loop
from gpufleet.apiserver.strategy import strategy_for
from gpufleet.store import base as store_base
from gpufleet.utils.clock import parse_rfc3339, rfc3339

if TYPE_CHECKING:
    from gpufleet.apiserver.server import ApiServer

MAX_PAGE = 5000
_SERVER_USER = "system:apiserver"
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
GENERATE_NAME_TRIES = 8


def rv(obj: dict[str, Any]) -> int:
    """The object's resourceVersion as a number (0 when it has none)."""
    try:
        return int(obj.get("metadata", {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


def key_of(obj: dict[str, Any]) -> tuple[str, str]:
    m = obj.get("metadata", {})
    return (m.get("namespace", "") or "", m.get("name", ""))


def matches(obj: dict[str, Any], label_sel: LabelSelector | None, field_sel: FieldSelector | None) -> bool:
    if label_sel is not None and not label_sel.matches(obj.get("metadata", {}).get("labels") or {}):
        return False
    if field_sel is not None and not field_sel.matches(obj):
        return False
    return True


def same_object(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal but for resourceVersion and managedFields (a write that would change nothing)."""
    return _strip_for_compare(a) == _strip_for_compare(b)


def _strip_for_compare(obj: dict[str, Any]) -> dict[str, Any]:
    out = dict(obj)
    m = dict(out.get("metadata") or {})
    m.pop("resourceVersion", None)
    m.pop("managedFields", None)
    out["metadata"] = m
    return out


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    m = obj.get("metadata")
    if not isinstance(m, dict):
        m = {}
        obj["metadata"] = m
    return m


class GenericRegistry:
    """The verbs over ``api``'s store, clock and admission chains (read at each call, so a
    plugin added to ``api.mutating`` later takes part)."""

    def __init__(self, api: ApiServer) -> None:
        self.api = api

    @property
    def store(self) -> store_base.Store:
        return self.api.store

    # ------------------------------------------------------------------ shared steps

    async def admit(self, op: str, rt: ResourceType, ns: str, name: str, sub: str, obj: dict,
                    old: dict | None, user: UserInfo, dry_run: bool, mutate: bool) -> list[str]:
        """Runs the mutating or the validating chain; returns the warnings the plugins gave."""
        ctx = AdmissionContext(op, rt, ns, name, sub, user, dry_run, self.api)
        plugins = self.api.mutating if mutate else self.api.validating
        for p in plugins:
            if mutate:
                await p.admit(ctx, obj, old)  # type: ignore[union-attr]
            else:
                await p.validate(ctx, obj, old)  # type: ignore[union-attr]
        return ctx.warnings

    async def check_namespace(self, ns: str, rt: ResourceType) -> None:
        """A namespaced create needs its namespace, and one not being terminated."""
        if not rt.namespaced:
            return
        try:
            nso = await self.store.get("namespaces", "", ns)
        except store_base.NotFound:
            ns_rt = self.api.registry.by_key("namespaces")
            assert ns_rt is not None
            raise not_found(ns_rt, ns) from None
        if nso.get("metadata", {}).get("deletionTimestamp"):
            raise ApiException(
                403, "Forbidden",
                f'{rt.key} is forbidden: unable to create new content in namespace {ns} because it is being terminated',
                {"name": ns, "kind": rt.plural, "causes": [{"reason": "NamespaceTerminating",
                                                            "message": f"namespace {ns} is being terminated",
                                                            "field": "metadata.namespace"}]},
            )

    def track_fields(self, rt: ResourceType, old: dict[str, Any] | None, new: dict[str, Any],
                     manager: str | None, managed: bool, subresource: str) -> dict[str, Any]:
        """Field ownership of a non-apply write (Kubernetes' managedFields, operation Update)."""
        meta = new.get("metadata")
        if managed or manager is None:
            if isinstance(meta, dict) and not managed:
                # Internal writes keep what is stored; clients do not get to rewrite history.
                kept = managedfields.accepted_managed_fields(meta.get("managedFields"), old,
                                                             subresource=subresource)
                if kept is None:
                    meta.pop("managedFields", None)
                else:
                    meta["managedFields"] = kept
            return new
        try:
            return managedfields.record_update(
                old, new, manager=manager, kind=rt.kind, api_version=rt.api_version,
                now=rfc3339(self.api.clock.now()), subresource=subresource,
                ignore_status="status" in rt.subresources and subresource != "status",
            )
        except managedfields.ManagedFieldsError as e:
            raise bad_request(f"metadata.managedFields: {e}") from None

    # ------------------------------------------------------------------ get

    async def get(self, rt: ResourceType, ns: str, name: str) -> dict[str, Any]:
        try:
            return await self.store.get(rt.key, ns, name)
        except store_base.NotFound:
            raise not_found(rt, name) from None

    # ------------------------------------------------------------------ create

    async def create(
        self, rt: ResourceType, ns: str, body: Any, *, field_validation: str | None = None,
        user: UserInfo | None = None, dry_run: bool = False, manager: str | None = None, managed: bool = False,
    ) -> tuple[dict[str, Any], list[str]]:
        """``manager`` records field ownership (metadata.managedFields) as an Update;
        ``managed``: the caller (server-side apply) already did."""
        user = user or UserInfo(name=_SERVER_USER)
        strategy = strategy_for(rt)
        obj = decoding.check_type(rt, body)
        meta = _meta(obj)
        if rt.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and ns and body_ns != ns:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            ns = ns or body_ns or "default"
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
            ns = ""
        body_name = meta.get("name")
        if not body_name:
            prefix = meta.get("generateName")
            if not prefix:
                raise invalid(rt, "", [{"reason": "FieldValueRequired", "field": "metadata.name",
                                        "message": "Required value: name or generateName is required"}])
            meta["name"] = self._generate_name(rt, prefix)
        generated = meta.get("generateName") and meta["name"] != body_name
        name = meta["name"]
        await self.check_namespace(ns, rt)
        for system in ("uid", "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(system, None)
        meta["uid"] = str(uuid.UUID(int=self.api.rng_for(rt.key).getrandbits(128), version=4))
        meta["creationTimestamp"] = rfc3339(self.api.clock.now())
        await strategy.prepare_for_create(self.store, obj)
        obj = self.track_fields(rt, None, obj, manager, managed, "")
        model, warnings = await off_loop(decoding.decode, rt, obj, name, field_validation)
        obj = await off_loop(decoding.finish, rt, model, name, None, strategy)
        warnings += await self.admit("CREATE", rt, ns, name, "", obj, None, user, dry_run, mutate=True)
        if self.api.mutating:
            obj = await off_loop(lambda: decoding.finish(rt, decoding.decode(rt, obj, name, "Ignore")[0], name, None,
                                                         strategy))
        warnings += await self.admit("CREATE", rt, ns, name, "", obj, None, user, dry_run, mutate=False)
        if dry_run:
            return obj, warnings
        await off_loop(check_object_size, rt.kind, name, obj, self.api.limits.max_object_bytes)
        # A generated name already taken is generated again, 8 tries in all, as kube-apiserver
        # does (RetryGenerateName, on by default since 1.31).
        for attempt in range(GENERATE_NAME_TRIES if generated else 1):
            if attempt:
                # Into the object that is stored: admission and decoding made a new one.
                name = meta["name"] = obj["metadata"]["name"] = self._generate_name(rt, meta["generateName"])
            try:
                stored = await self.store.create(rt.key, ns, name, obj, ttl=strategy.ttl(self.api.event_ttl))
            except store_base.AlreadyExists:
                continue
            return stored, warnings
        raise already_exists(rt, name)

    def _generate_name(self, rt: ResourceType, prefix: str) -> str:
        """``prefix`` and 5 random characters, as names.SimpleNameGenerator makes them."""
        rng = self.api.rng_for(rt.key)
        return prefix[:58] + "".join(rng.choice(_NAME_ALPHABET) for _ in range(5))

    # ------------------------------------------------------------------ update

    async def update(
        self, rt: ResourceType, ns: str, name: str, body: Any, *, subresource: str = "",
        field_validation: str | None = None, user: UserInfo | None = None, dry_run: bool = False,
        current: dict[str, Any] | None = None, create_missing: bool = False, manager: str | None = None,
        managed: bool = False,
    ) -> tuple[dict[str, Any], list[str]]:
        user = user or UserInfo(name=_SERVER_USER)
        strategy = strategy_for(rt)
        obj = decoding.check_type(rt, body)
        meta = _meta(obj)
        if meta.get("name") and meta["name"] != name:
            raise bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
        if rt.namespaced and meta.get("namespace") and meta["namespace"] != ns:
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        meta["name"] = name
        if current is None:
            try:
                current = await self.store.get(rt.key, ns, name)
            except store_base.NotFound:
                if create_missing and not subresource:
                    meta.pop("resourceVersion", None)
                    return await self.create(rt, ns, obj, field_validation=field_validation, user=user,
                                             dry_run=dry_run, manager=manager, managed=managed)
                raise not_found(rt, name) from None
        expected = meta.get("resourceVersion")
        if expected is not None and not isinstance(expected, str):
            raise bad_request(f"metadata.resourceVersion: Invalid value: {expected!r}: must be a string "
                              "holding the resourceVersion you read")
        body_uid = meta.get("uid")
        if body_uid and body_uid != current.get("metadata", {}).get("uid"):
            raise conflict(rt, name, f"Precondition failed: UID in precondition: {body_uid}, UID in object meta: "
                                     f"{current.get('metadata', {}).get('uid')}")
        if expected:
            try:
                expected_rev = int(expected)
            except ValueError:
                raise bad_request(f'metadata.resourceVersion: Invalid value: "{expected}": must be an integer') from None
            if expected_rev != rv(current):
                raise conflict(rt, name)
        else:
            expected_rev = rv(current)
        new = self._merge_update(rt, obj, current, subresource)
        # A heartbeat changes only times the kind names; the rest is the stored object, which
        # was decoded, defaulted and validated when it was written.
        beat = heartbeat.heartbeat_only(strategy.heartbeat_fields, current, new)
        new = self.track_fields(rt, current, new, manager, managed, subresource)
        strategy.prepare_for_update(new, current)
        if beat:
            warnings: list[str] = []
        else:
            model, warnings = await off_loop(decoding.decode, rt, new, name, field_validation)
            old_model = await off_loop(rt.model.model_validate, current)
            new = await off_loop(decoding.finish, rt, model, name, old_model, strategy)
        op = "UPDATE"
        warnings += await self.admit(op, rt, ns, name, subresource, new, current, user, dry_run, mutate=True)
        warnings += await self.admit(op, rt, ns, name, subresource, new, current, user, dry_run, mutate=False)
        strategy.update_generation(new, current, subresource)
        stale = getattr(self.store, "is_stale", None)  # a store wrapper may not pass it on
        if same_object(new, current) and not (stale is not None and stale(rt.key, ns, name, rv(current))):
            # No-op updates do not bump the revision, as in Kubernetes; one stored with an
            # older encryption key is rewritten with the current one.
            return current, warnings
        if dry_run:
            new["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion", "")
            return new, warnings
        deleting = strategy.ready_to_delete(new)
        if not deleting:  # a write past the object size limit is refused before it is sent
            await off_loop(check_object_size, rt.kind, name, new, self.api.limits.max_object_bytes)
        try:
            if deleting:
                return await self.store.delete(rt.key, ns, name, expected_revision=expected_rev), warnings
            return await self.store.update(rt.key, ns, name, new, expected_revision=expected_rev), warnings
        except store_base.Conflict:
            raise conflict(rt, name) from None
        except store_base.NotFound:
            raise not_found(rt, name) from None

    def _merge_update(self, rt: ResourceType, obj: dict, current: dict, subresource: str) -> dict[str, Any]:
        """What a PUT may change: the main resource keeps status, /status keeps everything else,
        and system metadata is never the client's to set."""
        from gpufleet.apiserver.subresources import SUBRESOURCES

        sub = SUBRESOURCES.get(subresource)
        if sub is not None and sub.owns_part:
            return sub.merge_for_update(obj, current)
        cur_meta = current.get("metadata", {})
        new = dict(obj)
        meta = dict(obj.get("metadata") or {})
        for system in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation",
                       "namespace"):
            if system in cur_meta:
                meta[system] = cur_meta[system]
            else:
                meta.pop(system, None)
        meta.pop("resourceVersion", None)
        if cur_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(cur_meta.get("finalizers") or [])
            if added:
                raise invalid(rt, cur_meta.get("name", ""), [{
                    "reason": "FieldValueForbidden", "field": "metadata.finalizers",
                    "message": f"Forbidden: no new finalizers can be added if the object is being deleted, "
                               f"found new finalizers {sorted(added)}"}])
        new["metadata"] = meta
        strategy_for(rt).keep_status(new, current)
        return new

    # ------------------------------------------------------------------ delete

    async def delete(
        self, rt: ResourceType, ns: str, name: str, options: dict[str, Any] | None = None, *,
        user: UserInfo | None = None, dry_run: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """Returns (object, deleted_now). Graceful and finalizer-held deletions return the
        object with deletionTimestamp set and deleted_now False."""
        options = options or {}
        user = user or UserInfo(name=_SERVER_USER)
        strategy = strategy_for(rt)
        for _ in range(10):
            current = await self.get(rt, ns, name)
            meta = current.get("metadata", {})
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != meta.get("uid"):
                raise conflict(rt, name, f"Precondition failed: UID in precondition: {pre['uid']}, "
                                         f"UID in object meta: {meta.get('uid')}")
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
                raise conflict(rt, name, f"Precondition failed: ResourceVersion in precondition: "
                                         f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                                         f"{meta.get('resourceVersion')}")
            await self.admit("DELETE", rt, ns, name, "", current, current, user, dry_run, mutate=False)
            policy = options.get("propagationPolicy")
            finalizers = list(meta.get("finalizers") or [])
            if policy is not None:
                # The latest propagation policy wins, as in Kubernetes' deletion finalizers.
                finalizers = [f for f in finalizers if f not in ("orphan", "foregroundDeletion")]
                if policy == "Foreground":
                    finalizers.append("foregroundDeletion")
                elif policy == "Orphan":
                    finalizers.append("orphan")
            graceful, grace = strategy.graceful_delete(current, options.get("gracePeriodSeconds"))
            held = strategy.held_until_finalized
            if not finalizers and not graceful and not held:
                if dry_run:
                    return current, True
                try:
                    return await self.store.delete(rt.key, ns, name, expected_revision=rv(current)), True
                except store_base.Conflict:
                    continue
                except store_base.NotFound:
                    raise not_found(rt, name) from None
            # Deletion in progress: stamp it and let the owner of each finalizer (or the node
            # agent, for a graceful pod) finish the job.
            new = dict(current)
            new_meta = dict(meta)
            now = self.api.clock.now()
            if graceful:
                assert grace is not None
                prior = new_meta.get("deletionTimestamp")
                deadline = now + grace
                if prior and parse_rfc3339(prior) <= deadline:
                    deadline = parse_rfc3339(prior)
                new_meta["deletionTimestamp"] = rfc3339(deadline)
                new_meta["deletionGracePeriodSeconds"] = min(grace, new_meta.get("deletionGracePeriodSeconds", grace))
            elif not new_meta.get("deletionTimestamp"):
                new_meta["deletionTimestamp"] = rfc3339(now)
                new_meta["deletionGracePeriodSeconds"] = 0
            new_meta["finalizers"] = finalizers
            if not finalizers:
                new_meta.pop("finalizers")
            new["metadata"] = new_meta
            if held:
                strategy.mark_terminating(new, current)
                if strategy.ready_to_delete(new):
                    try:
                        return await self.store.delete(rt.key, ns, name, expected_revision=rv(current)), True
                    except store_base.Conflict:
                        continue
            if same_object(new, current):
                return current, False
            if dry_run:
                return new, False
            try:
                return await self.store.update(rt.key, ns, name, new, expected_revision=rv(current)), False
            except store_base.Conflict:
                continue
            except store_base.NotFound:
                raise not_found(rt, name) from None
        raise conflict(rt, name)

    # ------------------------------------------------------------------ list

    async def list(
        self, rt: ResourceType, ns: str, label_sel: LabelSelector | None = None,
        field_sel: FieldSelector | None = None, limit: int | None = None, continue_token: str | None = None,
    ) -> tuple[list[dict[str, Any]], int, str | None]:
        """(matching objects, the list's revision, the continue token of the next page)."""
        after = None
        list_rev = None
        if continue_token:
            try:
                tok = orjson.loads(base64.urlsafe_b64decode(continue_token.encode()))
                if not (isinstance(tok["ns"], str) and isinstance(tok["name"], str) and isinstance(tok["rv"], int)):
                    raise ValueError("continue token fields have the wrong types")
                after, list_rev = (tok["ns"], tok["name"]), int(tok["rv"])
            except Exception:
                raise bad_request("continue: Invalid value: the continue token is malformed; start the list "
                                  "again without it") from None
        only_name = field_sel.only_name() if field_sel is not None else None
        if only_name is not None and not after:
            try:
                obj = await self.store.get(rt.key, ns, only_name) if ns or not rt.namespaced else None
            except store_base.NotFound:
                obj = None
            if obj is not None or ns or not rt.namespaced:
                items = [obj] if obj is not None and matches(obj, label_sel, field_sel) else []
                return items, await self.store.revision(), None
        # An agent's list of its own pods (fieldSelector spec.nodeName=X) reads the store's index.
        node = field_sel.requires_exact_match("spec.nodeName") if field_sel is not None and rt.key == "pods" else None
        items: list[dict[str, Any]] = []
        if continue_token and list_rev is not None and list_rev < await self.store.revision():
            # Later pages show the world as of the first page, as Kubernetes' do.
            snapshot = await self._list_at(rt, ns, list_rev)
            pages = [store_base.ListResult([o for o in snapshot if key_of(o) > after], list_rev)]
        else:
            pages = None
        page = min(max(limit or 0, 500), MAX_PAGE)
        while True:
            if pages is not None:
                result = pages.pop()
            else:
                result = await self.store.list(rt.key, ns or None, limit=page, after=after, node=node or None)
            if list_rev is None:
                list_rev = result.revision
            for obj in result.items:
                if matches(obj, label_sel, field_sel):
                    items.append(obj)
                    if limit and len(items) >= limit:
                        m = obj["metadata"]
                        key = (m.get("namespace", ""), m["name"])
                        more = result.next_key is not None or obj is not result.items[-1]
                        token = None
                        if more:
                            token = base64.urlsafe_b64encode(orjson.dumps(
                                {"rv": list_rev, "ns": key[0], "name": key[1]})).decode()
                        return items, list_rev, token
            if result.next_key is None:
                return items, list_rev, None
            after = result.next_key

    async def list_json(self, rt: ResourceType, ns: str, limit: int | None = None
                        ) -> tuple[list[str] | list[bytes], int, str | None] | None:
        """A list without selectors as the stored JSON texts (``Store.list_json``): (texts, the
        list's revision, the continue token); None where it must be decoded (a custom resource,
        a kind served from another version's storage, encrypted values, a store without it)."""
        if type(rt) is not ResourceType or rt.storage_version or rt.storage_group is not None:
            return None
        list_json = getattr(self.store, "list_json", None)
        got = await list_json(rt.key, ns or None, limit=limit) if list_json is not None else None
        if got is None:
            return None
        rev, texts, next_key = got
        token = None
        if next_key is not None:
            token = base64.urlsafe_b64encode(orjson.dumps({"rv": rev, "ns": next_key[0], "name": next_key[1]})).decode()
        return texts, rev, token

    async def _list_at(self, rt: ResourceType, ns: str, revision: int) -> list[dict[str, Any]]:
        """The objects as they were at ``revision``: today's list with later history undone."""
        current = await self.store.list(rt.key, ns or None)
        try:
            events = await self.store.history(rt.key, ns or None, revision, current.revision)
        except store_base.Expired:
            raise ApiException(
                410, "Expired",
                "The provided continue parameter is too old to display a consistent list result. "
                "You can start a new list without the continue parameter.",
            ) from None
        state = {key_of(o): o for o in current.items}
        for ev in reversed(events):
            key = (ev.namespace, ev.name)
            if ev.type == "ADDED":
                state.pop(key, None)
            else:
                state[key] = ev.prev if ev.prev is not None else ev.object
        return [state[k] for k in sorted(state)]
