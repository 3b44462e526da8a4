"""The API server's Prometheus metrics, with kube-apiserver's names and labels.

One ``ApiMetrics`` per ApiServer, on its own CollectorRegistry (a process may host several
servers: tests, HA setups). Requests are counted where the server dispatches them
(``ApiServer.handle``, through telemetry.py) and store calls where the server reaches its
store (``InstrumentedStore``), nowhere else.

Names, as kube-apiserver's (k8s.io/apiserver/pkg/endpoints/metrics):

- ``apiserver_request_total{verb,dry_run,group,version,resource,subresource,scope,component,code}``
- ``apiserver_request_duration_seconds{verb,dry_run,group,version,resource,subresource,scope,component}``;
  a WATCH or CONNECT is observed when its stream ends, as Kubernetes does (dashboards leave
  those verbs out of latency panels).
- ``apiserver_response_sizes{verb,group,version,resource,subresource,scope,component}``, for GET and LIST
- ``apiserver_longrunning_requests{verb,group,version,resource,subresource,scope,component}``
- ``apiserver_registered_watchers{group,version,kind}``
- ``apiserver_current_inflight_requests{request_kind}`` (readOnly, mutating; long-running requests
  are not in it)
- ``etcd_request_duration_seconds{operation,type}``: the store's latency, under the name
  Kubernetes dashboards query, though the store is SQLite or PostgreSQL; ``type`` is the
  group-qualified resource (``pods``, ``deployments.apps``).
- ``apiserver_audit_event_total``, ``apiserver_audit_error_total{plugin}`` (see audit.py)
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

COMPONENT = "apiserver"
# kube-apiserver's buckets for request and storage latency, and for response sizes.
_LATENCY_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
                    10.0, 15.0, 20.0, 30.0, 45.0, 60.0)
_SIZE_BUCKETS = tuple(1000.0 * 10 ** i for i in range(8))

# RequestInfo verbs -> the verbs kube-apiserver's metrics report (the REST route's).
_VERBS = {"get": "GET", "list": "LIST", "watch": "WATCH", "create": "POST", "update": "PUT", "patch": "PATCH",
          "delete": "DELETE", "deletecollection": "DELETECOLLECTION"}
_CONNECT_SUBRESOURCES = {"proxy", "exec", "attach", "portforward"}
# Kubernetes' long-running requests: watches and the streaming subresources.
LONG_RUNNING_SUBRESOURCES = {"attach", "exec", "proxy", "log", "portforward"}
_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT"}
_READ_VERBS = {"get", "list", "watch", "head", "options"}


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        labels = ["verb", "dry_run", "group", "version", "resource", "subresource", "scope", "component"]
        self.requests = Counter(
            "apiserver_request", "Counter of apiserver requests broken out for each verb, dry run value, group, "
            "version, resource, scope, component, and HTTP response code.", [*labels, "code"], registry=r)
        self.latency = Histogram(
            "apiserver_request_duration_seconds", "Response latency distribution in seconds for each verb, dry run "
            "value, group, version, resource, subresource, scope and component.", labels,
            buckets=_LATENCY_BUCKETS, registry=r)
        sized = ["verb", "group", "version", "resource", "subresource", "scope", "component"]
        self.response_sizes = Histogram(
            "apiserver_response_sizes", "Response size distribution in bytes for each group, version, verb, "
            "resource, subresource, scope and component.", sized, buckets=_SIZE_BUCKETS, registry=r)
        self.longrunning = Gauge(
            "apiserver_longrunning_requests", "Gauge of all active long-running apiserver requests broken out by "
            "verb, group, version, resource, scope and component. Not all requests are tracked this way.", sized,
            registry=r)
        self.watchers = Gauge(
            "apiserver_registered_watchers", "Number of currently registered watchers for a given resources",
            ["group", "version", "kind"], registry=r)
        self.inflight = Gauge(
            "apiserver_current_inflight_requests", "Number of requests being served now (not counting "
            "long-running ones) by request kind.", ["request_kind"], registry=r)
        self.inflight_of = {kind: self.inflight.labels(kind) for kind in ("readOnly", "mutating")}
        self.storage_latency = Histogram(
            "etcd_request_duration_seconds", "Store (SQLite or PostgreSQL) request latency in seconds for each "
            "operation and object type.", ["operation", "type"], buckets=_LATENCY_BUCKETS, registry=r)
        self.audit_events = Counter(
            "apiserver_audit_event", "Counter of audit events generated and sent to the audit backend.", registry=r)
        self.audit_errors = Counter(
            "apiserver_audit_error", "Counter of audit events that failed to be audited properly. Plugin "
            "identifies the plugin affected by the error.", ["plugin"], registry=r)
        ProcessCollector(registry=r)
        self._series: dict[tuple, tuple[Any, Any, Any]] = {}

    def series(self, labels: dict[str, str], code: int) -> tuple[Any, Any, Any]:
        """The request counter, latency and (GET, LIST) response size series of one label set,
        looked up once."""
        key = (labels["verb"], labels["dry_run"], labels["group"], labels["version"], labels["resource"],
               labels["subresource"], labels["scope"], code)
        found = self._series.get(key)
        if found is None:
            base = (*key[:7], COMPONENT)
            sized = (key[0], *key[2:7], COMPONENT) if key[0] in ("GET", "LIST") else None
            found = (self.requests.labels(*base, str(code)), self.latency.labels(*base),
                     self.response_sizes.labels(*sized) if sized else None)
            self._series[key] = found
        return found

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text format, version 0.0.4 (what kube-apiserver serves)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry), "text/plain; version=0.0.4; charset=utf-8"


def request_kind(verb: str) -> str:
    return "readOnly" if verb in _READ_VERBS else "mutating"


def reported_verb(info: Any, content_type: str = "") -> str:
    """The verb label kube-apiserver gives a request: the REST route's (GET, LIST, WATCH,
    POST, PUT, PATCH, APPLY, DELETE, DELETECOLLECTION, CONNECT) or, off the resource paths,
    the HTTP method."""
    if not info.is_resource_request:
        method = info.verb.upper()
        return method if method in _METHODS else "other"
    if info.subresource in _CONNECT_SUBRESOURCES:
        return "CONNECT"
    if info.verb == "patch" and content_type.split(";")[0].strip().lower() == "application/apply-patch+yaml":
        return "APPLY"
    return _VERBS.get(info.verb, "other")


def scope(info: Any) -> str:
    """kube-apiserver's CleanScope."""
    if info.name or info.verb == "create":
        return "resource"
    if info.namespace:
        return "namespace"
    if info.is_resource_request:
        return "cluster"
    return ""


class InstrumentedStore:
    """A store whose calls are timed into ``etcd_request_duration_seconds``; anything else
    is the wrapped store's."""

    _TIMED = ("create", "get", "update", "update_many", "delete", "list", "list_json", "history", "revision", "watch")

    def __init__(self, store: Any, metrics: ApiMetrics) -> None:
        self._store = store
        self._histogram = metrics.storage_latency

    @property
    def wrapped(self) -> Any:
        return self._store

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name not in self._TIMED:
            return attr
        histogram = self._histogram

        async def timed(*args: Any, **kwargs: Any) -> Any:
            resource = args[0] if args and name != "revision" else kwargs.get("resource")
            start = time.perf_counter()
            try:
                return await attr(*args, **kwargs)
            finally:
                histogram.labels(name, resource or "").observe(time.perf_counter() - start)

        return timed
