"""The typed client every component uses to talk to the API server.

One class over a Transport: REST verbs in Kubernetes conventions, typed models in and out
(or dicts with ``raw=True``), watches as async iterators, and errors as the exception
types of gpufleet.client.errors. Nothing here retries behind the caller's back except a
connection that could not be made for a read; writes are never repeated implicitly because
the server may have applied them.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from gpufleet.api.registry import REGISTRY, Registry, ResourceType
from gpufleet.client import objects
from gpufleet.client.errors import ApiError, Conflict, TransportError, error_from_response, error_from_status
from gpufleet.client.transport import Params, Transport
from gpufleet.utils import jsoncodec
from gpufleet.utils.clock import REAL_CLOCK, Clock
from gpufleet.utils.gcpause import gc_paused
from gpufleet.utils.http import RawResponse

log = logging.getLogger(__name__)

PatchType = Literal["merge", "strategic", "json", "apply"]

PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    # The apply body is YAML by media type; JSON is valid YAML and is what kubectl sends.
    "apply": "application/apply-patch+yaml",
}

KindLike = type | ResourceType | str

_MODELS_MODULE = "gpufleet.api.k8s"
# Answers at least this long (a list of thousands) are decoded with the cyclic GC paused.
_LARGE_BODY = 1 << 20
# A list's items are decoded this many at a time, the event loop free between chunks.
DECODE_CHUNK = 500

T = TypeVar("T")


@dataclass
class ObjectList:
    items: list[Any]
    resource_version: str = ""
    # Where the next page starts; empty when this is the last (or only) page.
    continue_: str = ""
    kind: str = ""

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


@dataclass
class WatchEvent:
    # ADDED, MODIFIED, DELETED or BOOKMARK (ERROR events are raised, never yielded).
    type: str
    # A model (or dict with raw=True). A BOOKMARK's object is always the dict the server
    # sent: it carries only metadata.resourceVersion, which most models would reject.
    object: Any
    raw_object: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def resource_version(self) -> str:
        return objects.resource_version_of(self.raw_object)


class Client:
    """``Client(transport)``; every call is a coroutine except ``watch``, an async iterator."""

    def __init__(
        self,
        transport: Transport,
        registry: Registry = REGISTRY,
        *,
        default_namespace: str = "default",
        clock: Clock = REAL_CLOCK,
        read_retries: int = 3,
        read_backoff: float = 0.1,
    ) -> None:
        self.transport = transport
        self.registry = registry
        self.default_namespace = default_namespace
        self.clock = clock
        self.read_retries = read_retries
        self.read_backoff = read_backoff
        # False: every EventRecorder on this client records nothing (as client-go's recorders
        # write nothing while their broadcaster has no sink); a trace replay that needs no
        # Events turns them off.
        self.record_events = True
        # "<rt.key>/<version>" -> model class, or None when the models module lacks it.
        self._models: dict[str, type | None] = {}

    async def close(self) -> None:
        await self.transport.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- kinds and models -------------------------------------------------------------

    def resource_type(self, kind: KindLike) -> ResourceType:
        """A ResourceType for a model class, a ResourceType, or a name ('pods', 'deployments.apps',
        'Deployment', 'apps/v1/Deployment')."""
        if isinstance(kind, ResourceType):
            return kind
        if isinstance(kind, type):
            api_version = getattr(kind, "API_VERSION", None)
            kind_name = getattr(kind, "KIND", None)
            rt = None
            if api_version and kind_name:
                rt = self.registry.by_api_version_kind(api_version, kind_name)
            if rt is None:
                try:
                    rt = self.registry.for_model(kind)
                except (ImportError, AttributeError):
                    rt = None
            if rt is None:
                raise LookupError(f"{kind.__name__} is not a registered kind")
            return rt
        if isinstance(kind, str):
            rt = None
            if kind.count("/") >= 1 and not kind.startswith("/"):
                api_version, _, kind_name = kind.rpartition("/")
                rt = self.registry.by_api_version_kind(api_version, kind_name)
            if rt is None:
                rt = self.registry.resolve(kind)
            if rt is None:
                raise LookupError(f"the server doesn't have a resource type {kind!r}")
            return rt
        raise TypeError(f"kind must be a model class, a ResourceType or a string, not {type(kind).__name__}")

    def _resource_type_of(self, obj: Any) -> ResourceType:
        if isinstance(obj, dict):
            api_version, kind = obj.get("apiVersion"), obj.get("kind")
            if not api_version or not kind:
                raise ValueError("a dict object needs apiVersion and kind")
            rt = self.registry.by_api_version_kind(api_version, kind)
            if rt is None:
                raise LookupError(f"the server doesn't have a resource type {api_version}/{kind}")
            return rt
        return self.resource_type(type(obj))

    def model_for(self, rt: ResourceType) -> type | None:
        # By version: one resource may be served in several (autoscaling/v1 and v2 HPAs).
        key = f"{rt.key}/{rt.version}"
        if key not in self._models:
            try:
                self._models[key] = rt.model
            except (ImportError, AttributeError):
                self._models[key] = None
        return self._models[key]

    def _model_for_gvk(self, api_version: str, kind: str) -> type | None:
        rt = self.registry.by_api_version_kind(api_version, kind)
        if rt is not None:
            return self.model_for(rt)
        # Kinds outside the registry that the models module still defines (Scale, Status).
        try:
            module = importlib.import_module(_MODELS_MODULE)
        except ImportError:
            return None
        cls = getattr(module, kind, None)
        if isinstance(cls, type) and getattr(cls, "API_VERSION", None) == api_version:
            return cls
        return None

    def decode(self, data: dict[str, Any], rt: ResourceType | None = None, *, raw: bool = False) -> Any:
        """A wire dict as the model of its kind (or unchanged with raw=True / no model)."""
        if raw or not isinstance(data, dict):
            return data
        model = None
        if rt is not None and data.get("kind") in (None, rt.kind):
            model = self.model_for(rt)
        elif data.get("apiVersion") and data.get("kind"):
            model = self._model_for_gvk(data["apiVersion"], data["kind"])
        if model is None:
            return data
        if rt is not None:
            # Items of a list and some subresource answers come without kind/apiVersion.
            data = {"apiVersion": rt.api_version, "kind": rt.kind, **data}
        from_dict = getattr(model, "from_dict", None)
        return from_dict(data) if from_dict else model.model_validate(data)

    def _encode(self, obj: Any, rt: ResourceType) -> dict[str, Any]:
        data = objects.to_dict(obj)
        data.setdefault("apiVersion", rt.api_version)
        data.setdefault("kind", rt.kind)
        return data

    def _namespace(self, rt: ResourceType, namespace: str | None, obj: Any = None) -> str | None:
        if not rt.namespaced:
            return None
        obj_ns = objects.namespace_of(obj) if obj is not None else ""
        if namespace and obj_ns and namespace != obj_ns:
            raise ValueError(f"namespace {namespace!r} does not match the object's {obj_ns!r}")
        return namespace or obj_ns or self.default_namespace

    # -- raw requests -----------------------------------------------------------------

    async def raw_request(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        json: Any = None,
        content: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
        raise_for_status: bool = True,
    ) -> RawResponse:
        """One request as is; an error status raises ApiError unless raise_for_status=False."""
        method = method.upper()
        attempts = self.read_retries if method in ("GET", "HEAD") else 1
        for attempt in range(attempts):
            try:
                resp = await self.transport.request(
                    method, path, params=params, json=json, content=content, headers=headers
                )
                break
            except TransportError:
                if attempt + 1 >= attempts:
                    raise
                await self.clock.sleep(self._backoff(attempt))
        if raise_for_status and resp.status >= 400:
            raise error_from_response(resp.status, resp.body, resp.headers)
        return resp

    def _backoff(self, attempt: int) -> float:
        base = self.read_backoff * (2**attempt)
        return base * (1 + 0.2 * random.random())

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = await self.raw_request(method, path, **kwargs)
        if not resp.body:
            return {}
        try:
            if len(resp.body) < _LARGE_BODY:
                return jsoncodec.loads(resp.body)
            with gc_paused():  # a large list: see utils/gcpause.py
                return jsoncodec.loads(resp.body)
        except ValueError as exc:
            raise ApiError(resp.status, "BadResponse", f"{method} {path}: the answer is not JSON") from exc

    # -- verbs ------------------------------------------------------------------------

    async def get(self, kind: KindLike, name: str, namespace: str | None = None, *, raw: bool = False) -> Any:
        rt = self.resource_type(kind)
        data = await self._json("GET", rt.path(self._namespace(rt, namespace), name))
        return self.decode(data, rt, raw=raw)

    async def list(
        self,
        kind: KindLike,
        namespace: str | None = None,
        *,
        label_selector: str | Mapping[str, str] | None = None,
        field_selector: str | Mapping[str, str] | None = None,
        limit: int | None = None,
        continue_: str | None = None,
        resource_version: str | None = None,
        raw: bool = False,
    ) -> ObjectList:
        """Objects of a kind; ``namespace=None`` lists every namespace. Without ``limit`` every
        page is fetched; with it, one page and its ``continue_`` token."""
        rt = self.resource_type(kind)
        path = rt.path(namespace if rt.namespaced else None)
        items: list[Any] = []
        first_rv = ""
        token = continue_
        while True:
            params = {
                "labelSelector": _selector(label_selector),
                "fieldSelector": _selector(field_selector),
                "limit": limit,
                "continue": token or None,
                "resourceVersion": resource_version if not token else None,
            }
            data = await self._json("GET", path, params=params)
            meta = data.get("metadata") or {}
            first_rv = first_rv or meta.get("resourceVersion", "") or ""
            page = data.get("items") or []
            for start in range(0, len(page), DECODE_CHUNK):
                if start:
                    await asyncio.sleep(0)  # a long list decodes with the event loop free between chunks
                items.extend(self.decode(item, rt, raw=raw) for item in page[start:start + DECODE_CHUNK])
            token = meta.get("continue") or ""
            if limit is not None or not token:
                return ObjectList(items, first_rv, token, data.get("kind") or rt.list_kind)

    async def create(
        self,
        obj: Any,
        namespace: str | None = None,
        *,
        field_manager: str | None = None,
        dry_run: bool = False,
        raw: bool = False,
    ) -> Any:
        rt = self._resource_type_of(obj)
        ns = self._namespace(rt, namespace, obj)
        body = self._encode(obj, rt)
        if ns:
            body.setdefault("metadata", {})["namespace"] = ns
        params = {"fieldManager": field_manager, "dryRun": "All" if dry_run else None}
        data = await self._json("POST", rt.path(ns), params=params, json=body)
        return self.decode(data, rt, raw=raw)

    async def update(self, obj: Any, *, field_manager: str | None = None, raw: bool = False) -> Any:
        """PUT the whole object; its metadata.resourceVersion makes it a compare-and-swap
        (Conflict when someone wrote in between)."""
        return await self._put(obj, None, field_manager, raw)

    async def update_status(self, obj: Any, *, field_manager: str | None = None, raw: bool = False) -> Any:
        return await self._put(obj, "status", field_manager, raw)

    async def _put(self, obj: Any, subresource: str | None, field_manager: str | None, raw: bool) -> Any:
        rt = self._resource_type_of(obj)
        name = objects.name_of(obj)
        if not name:
            raise ValueError("update needs metadata.name")
        ns = self._namespace(rt, None, obj)
        body = self._encode(obj, rt)
        if ns:
            body.setdefault("metadata", {})["namespace"] = ns
        data = await self._json(
            "PUT", rt.path(ns, name, subresource), params={"fieldManager": field_manager}, json=body
        )
        return self.decode(data, rt, raw=raw)

    async def patch(
        self,
        kind: KindLike,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: PatchType = "merge",
        field_manager: str | None = None,
        subresource: str | None = None,
        force: bool | None = None,
        raw: bool = False,
    ) -> Any:
        rt = self.resource_type(kind)
        try:
            content_type = PATCH_CONTENT_TYPES[patch_type]
        except KeyError:
            raise ValueError(f"patch_type must be one of {sorted(PATCH_CONTENT_TYPES)}") from None
        if patch_type == "apply" and not field_manager:
            # Server-side apply records ownership per manager; the API rejects it without one.
            field_manager = "gpufleet"
        if isinstance(patch, str | bytes):
            # Already serialized (an apply body written as YAML, say): sent as given.
            content = patch
        else:
            body = patch if isinstance(patch, dict | list) else objects.to_dict(patch)
            if patch_type == "apply" and isinstance(body, dict):
                body = {"apiVersion": rt.api_version, "kind": rt.kind, **body}
            content = jsoncodec.dumps(body)
        ns = self._namespace(rt, namespace)
        params = {"fieldManager": field_manager, "force": force}
        data = await self._json(
            "PATCH",
            rt.path(ns, name, subresource),
            params=params,
            content=content,
            headers={"content-type": content_type},
        )
        return self.decode(data, rt if subresource in (None, "status") else None, raw=raw)

    async def apply(
        self, obj: Any, *, field_manager: str = "gpufleet", force: bool = False, raw: bool = False
    ) -> Any:
        """Server-side apply: create the object or merge the fields this manager owns."""
        rt = self._resource_type_of(obj)
        name = objects.name_of(obj)
        ns = self._namespace(rt, None, obj)
        body = self._encode(obj, rt)
        if ns:
            body.setdefault("metadata", {})["namespace"] = ns
        return await self.patch(
            rt, name, body, ns, patch_type="apply", field_manager=field_manager, force=force, raw=raw
        )

    async def delete(
        self,
        kind: KindLike,
        name: str,
        namespace: str | None = None,
        *,
        propagation_policy: Literal["Foreground", "Background", "Orphan"] | None = None,
        grace_period_seconds: int | None = None,
        preconditions_uid: str | None = None,
        preconditions_resource_version: str | None = None,
        raw: bool = False,
    ) -> Any:
        """Returns the deleted object (or the object as it is while finalizers run), or the
        Status dict when the server answers with one."""
        rt = self.resource_type(kind)
        options: dict[str, Any] = {}
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        preconditions = {}
        if preconditions_uid:
            preconditions["uid"] = preconditions_uid
        if preconditions_resource_version:
            preconditions["resourceVersion"] = preconditions_resource_version
        if preconditions:
            options["preconditions"] = preconditions
        body = {"kind": "DeleteOptions", "apiVersion": "v1", **options} if options else None
        data = await self._json("DELETE", rt.path(self._namespace(rt, namespace), name), json=body)
        if isinstance(data, dict) and data.get("kind") == "Status":
            return data
        return self.decode(data, rt, raw=raw)

    async def create_subresource(
        self,
        kind: KindLike,
        name: str,
        subresource: str,
        body: Any,
        namespace: str | None = None,
        *,
        raw: bool = False,
    ) -> Any:
        """POST ``body`` to an object's subresource (serviceaccounts/token, pods/eviction,
        pods/binding); the answer is decoded as the kind it names (TokenRequest, Status...)."""
        rt = self.resource_type(kind)
        path = rt.path(self._namespace(rt, namespace), name, subresource)
        data = await self._json("POST", path, json=objects.to_dict(body))
        return self.decode(data, raw=raw)

    async def get_scale(
        self, kind: KindLike, name: str, namespace: str | None = None, *, raw: bool = False
    ) -> Any:
        rt = self.resource_type(kind)
        data = await self._json("GET", rt.path(self._namespace(rt, namespace), name, "scale"))
        return self.decode(data, raw=raw)

    async def set_scale(
        self, kind: KindLike, name: str, replicas: int, namespace: str | None = None, *, raw: bool = False
    ) -> Any:
        return await self.patch(
            kind, name, {"spec": {"replicas": replicas}}, namespace, subresource="scale", raw=raw
        )

    # -- streams ----------------------------------------------------------------------

    async def watch(
        self,
        kind: KindLike,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        field_selector: str | Mapping[str, str] | None = None,
        timeout_seconds: int | None = None,
        allow_bookmarks: bool = True,
        raw: bool = False,
    ) -> AsyncIterator[WatchEvent]:
        """Changes after ``resource_version`` (or the current objects as ADDED, then changes,
        when it is None) until the server ends the stream. An ERROR event raises its error:
        Gone/Expired when the version is too old to resume from — list again."""
        rt = self.resource_type(kind)
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "labelSelector": _selector(label_selector),
            "fieldSelector": _selector(field_selector),
            "timeoutSeconds": timeout_seconds,
            "allowWatchBookmarks": "true" if allow_bookmarks else None,
        }
        path = rt.path(namespace if rt.namespaced else None)
        lines = await self._open_stream(path, params)
        try:
            async for line in lines:
                if not line.strip():
                    continue
                try:
                    event = jsoncodec.loads(line)
                except ValueError as exc:
                    raise TransportError(f"watch {path}: undecodable event {line[:200]!r}") from exc
                etype = event.get("type")
                obj = event.get("object") or {}
                if etype == "ERROR":
                    raise error_from_status(obj, obj.get("code") if isinstance(obj, dict) else None)
                if etype == "BOOKMARK":
                    yield WatchEvent("BOOKMARK", obj, obj)
                    continue
                yield WatchEvent(etype, self.decode(obj, rt, raw=raw), obj)
        finally:
            await lines.aclose()

    async def _open_stream(self, path: str, params: Params) -> Any:
        """Open a stream, retrying only while no answer came at all (connection refused)."""
        for attempt in range(self.read_retries):
            stream = self.transport.stream("GET", path, params)
            first = _Peeked(stream)
            try:
                await first.prime()
                return first
            except TransportError:
                await first.aclose()
                if attempt + 1 >= self.read_retries:
                    raise
                await self.clock.sleep(self._backoff(attempt))
            except BaseException:
                await first.aclose()
                raise
        raise AssertionError("unreachable")

    async def log(
        self,
        name: str,
        namespace: str | None = None,
        container: str | None = None,
        follow: bool = False,
        tail_lines: int | None = None,
        previous: bool = False,
        *,
        since_seconds: int | None = None,
        timestamps: bool = False,
    ) -> Any:
        """A pod's log: the text, or with follow=True an async iterator of lines (str) that
        ends when the container does."""
        rt = self.resource_type("pods")
        path = rt.path(self._namespace(rt, namespace), name, "log")
        params = {
            "container": container,
            "follow": "true" if follow else None,
            "tailLines": tail_lines,
            "previous": "true" if previous else None,
            "sinceSeconds": since_seconds,
            "timestamps": "true" if timestamps else None,
        }
        if not follow:
            resp = await self.raw_request("GET", path, params=params)
            return resp.body.decode("utf-8", "replace")
        stream = await self._open_stream(path, params)
        return _decode_lines(stream)


class _Peeked:
    """An async line iterator whose first item was already read, so connection errors and
    error statuses surface when the stream is opened rather than on first use."""

    _EMPTY = object()

    def __init__(self, source: AsyncIterator[bytes]) -> None:
        self._source = source
        self._first: Any = self._EMPTY
        self._done = False

    async def prime(self) -> None:
        try:
            self._first = await self._source.__anext__()
        except StopAsyncIteration:
            self._done = True

    def __aiter__(self) -> _Peeked:
        return self

    async def __anext__(self) -> bytes:
        if self._first is not self._EMPTY:
            first, self._first = self._first, self._EMPTY
            return first
        if self._done:
            raise StopAsyncIteration
        return await self._source.__anext__()

    async def aclose(self) -> None:
        aclose = getattr(self._source, "aclose", None)
        if aclose is not None:
            await aclose()


async def _decode_lines(stream: _Peeked) -> AsyncIterator[str]:
    try:
        async for line in stream:
            yield line.decode("utf-8", "replace")
    finally:
        await stream.aclose()


def _selector(sel: str | Mapping[str, str] | None) -> str | None:
    if sel is None or isinstance(sel, str):
        return sel or None
    return ",".join(f"{k}={v}" for k, v in sel.items()) or None


async def retry_on_conflict(
    fn: Callable[[], Awaitable[T]],
    attempts: int = 5,
    *,
    delay: float = 0.01,
    jitter: float = 0.1,
    clock: Clock = REAL_CLOCK,
) -> T:
    """Run ``fn`` (which must re-read what it updates) until it does not raise Conflict, at
    most ``attempts`` times — client-go's RetryOnConflict with its DefaultRetry timing."""
    for attempt in range(attempts):
        try:
            return await fn()
        except Conflict:
            if attempt + 1 >= attempts:
                raise
            await clock.sleep(delay * (1 + jitter * random.random()))
    raise AssertionError("unreachable")
