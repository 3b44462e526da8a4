"""What the API server records of each request: its metrics (apimetrics.py) and, when a
policy is given, its audit events (audit.py).

``ApiServer.handle`` opens a ``RequestRecord`` as a request arrives, the dispatch fills in
what it learns (what the request addresses, who sent it, whether it was allowed), and
``Telemetry.finish`` records the answer; a streamed answer (a watch, ``logs -f``) is recorded
when its stream ends, as kube-apiserver records long-running requests.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import orjson

from gpufleet.apiserver import apimetrics
from gpufleet.apiserver.admission import UserInfo
from gpufleet.apiserver.audit import Auditor, Decision
from gpufleet.apiserver.auth.rbac import Attributes
from gpufleet.apiserver.requestinfo import RequestInfo, parse_request
from gpufleet.utils.clock import rfc3339
from gpufleet.utils.http import RawRequest, RawResponse

if TYPE_CHECKING:
    from gpufleet.apiserver.server import ApiServer

_JSON_BODY_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


@dataclass
class RequestRecord:
    req: RawRequest
    received: float  # the server clock's time, for the audit timestamps
    started: float = field(default_factory=time.perf_counter)
    audit_id: str = ""  # made when the first event of the request is
    info: RequestInfo | None = None
    user: UserInfo | None = None
    # "allow" / "forbid" once an authorizer has decided.
    decision: str = ""
    audit: Decision = field(default_factory=Decision)
    inflight_kind: str = ""


class Telemetry:
    def __init__(self, api: ApiServer) -> None:
        self.api = api
        self.metrics = apimetrics.ApiMetrics()
        self.auditor: Auditor | None = None

    def enable_audit(self, auditor: Auditor) -> None:
        self.auditor = auditor
        auditor.log.on_drop = lambda: self.metrics.audit_errors.labels("log").inc()

    def close(self) -> None:
        if self.auditor is not None:
            self.auditor.close()

    # ------------------------------------------------------------------ the request's course

    def begin(self, req: RawRequest) -> RequestRecord:
        rec = RequestRecord(req, self.api.clock.now())
        rec.inflight_kind = apimetrics.request_kind(req.method.lower())
        self.metrics.inflight_of[rec.inflight_kind].inc()
        return rec

    def authenticated(self, rec: RequestRecord, info: RequestInfo, user: UserInfo) -> None:
        """Who and what are known: the policy decides the level, and RequestReceived is logged."""
        rec.info, rec.user = info, user
        if self.auditor is None:
            return
        rec.audit = self._decide(rec)
        if rec.audit.logged and "RequestReceived" not in rec.audit.omit_stages:
            self._emit(rec, "RequestReceived", None)

    def abandoned(self, rec: RequestRecord) -> None:
        self.metrics.inflight_of[rec.inflight_kind].dec()

    def finish(self, rec: RequestRecord, resp: RawResponse) -> RawResponse:
        self.metrics.inflight_of[rec.inflight_kind].dec()
        if rec.info is None:
            req = rec.req
            rec.info = parse_request(req.method.upper(), req.path.rstrip("/") or "/", False)
        if self.auditor is not None and rec.user is None:
            rec.audit = self._decide(rec)  # refused before authentication, or an open path
        if resp.stream is None:
            self._record(rec, resp, len(resp.body))
            return resp
        if rec.audit.logged and "ResponseStarted" not in rec.audit.omit_stages:
            self._emit(rec, "ResponseStarted", resp)
        resp.stream = self._watched(rec, resp, resp.stream)
        return resp

    async def _watched(self, rec: RequestRecord, resp: RawResponse,
                       stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        labels = self._labels(rec, resp.status)
        info = rec.info
        assert info is not None
        longrunning = self.metrics.longrunning.labels(labels["verb"], labels["group"], labels["version"],
                                                      labels["resource"], labels["subresource"], labels["scope"],
                                                      apimetrics.COMPONENT)
        longrunning.inc()
        watchers = None
        if info.verb == "watch" and labels["resource"] != "other":
            rt = self.api.registry.by_resource(info.group, info.version, info.resource)
            if rt is not None:
                watchers = self.metrics.watchers.labels(info.group, info.version, rt.kind)
                watchers.inc()
        sent = 0
        try:
            async for chunk in stream:
                sent += len(chunk)
                yield chunk
        finally:
            longrunning.dec()
            if watchers is not None:
                watchers.dec()
            self._record(rec, resp, sent)
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()  # the watch underneath ends now, not when collected

    def _record(self, rec: RequestRecord, resp: RawResponse, size: int) -> None:
        elapsed = time.perf_counter() - rec.started
        labels = self._labels(rec, resp.status)
        counter, latency, sizes = self.metrics.series(labels, resp.status)
        counter.inc()
        latency.observe(elapsed)
        if sizes is not None:
            sizes.observe(size)
        if rec.audit.logged and "ResponseComplete" not in rec.audit.omit_stages:
            self._emit(rec, "ResponseComplete", resp)

    def _labels(self, rec: RequestRecord, code: int) -> dict[str, str]:
        """kube-apiserver's labels, with what a client made up (a resource nobody serves, a path
        that answered 404) as "other", so no request can grow the label sets."""
        info = rec.info
        assert info is not None
        dry_run = rec.req.param("dryRun") or ""
        out = {"verb": apimetrics.reported_verb(info, rec.req.headers.get("content-type", "")),
               "dry_run": dry_run if dry_run == "All" else "", "scope": apimetrics.scope(info)}
        if info.is_resource_request:
            rt = self.api.registry.by_resource(info.group, info.version, info.resource)
            if rt is not None or (info.group, info.version) in self.api.extra_groups:
                sub = info.subresource
                if sub and rt is not None and sub not in rt.subresources:
                    sub = "other"
                out.update(group=info.group, version=info.version, resource=info.resource, subresource=sub)
            else:
                out.update(group="other", version="other", resource="other", subresource="")
        else:
            out.update(group="", version="", resource="", subresource=info.path if code != 404 else "other")
        return out

    # ------------------------------------------------------------------ audit events

    def _decide(self, rec: RequestRecord) -> Decision:
        assert self.auditor is not None and rec.info is not None
        user = _requestor(rec.user)
        return self.auditor.policy.decide(user.name if user else None, list(user.groups) if user else [],
                                          Attributes.from_request(rec.info))

    def _emit(self, rec: RequestRecord, stage: str, resp: RawResponse | None) -> None:
        assert self.auditor is not None
        if not rec.audit_id:
            rec.audit_id = str(uuid.uuid4())
        try:
            line = orjson.dumps(self._event(rec, stage, resp))
        except TypeError:
            line = orjson.dumps(self._event(rec, stage, resp, bodies=False))
        if self.auditor.log.write(line):
            self.metrics.audit_events.inc()

    def _event(self, rec: RequestRecord, stage: str, resp: RawResponse | None, bodies: bool = True) -> dict:
        info, req, level = rec.info, rec.req, rec.audit
        assert info is not None
        attrs = Attributes.from_request(info)
        ev: dict[str, Any] = {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": level.level,
                              "auditID": rec.audit_id, "stage": stage, "requestURI": _request_uri(req),
                              "verb": attrs.verb}
        requestor = _requestor(rec.user)
        ev["user"] = _user(requestor) if requestor is not None else {}
        if requestor is not None and requestor is not rec.user and rec.user is not None:
            ev["impersonatedUser"] = _user(rec.user)
        ev["sourceIPs"] = _source_ips(req)
        if req.headers.get("user-agent"):
            ev["userAgent"] = req.headers["user-agent"]
        if info.is_resource_request:
            ref = {"resource": info.resource, "namespace": attrs.namespace, "name": info.name,
                   "apiGroup": info.group, "apiVersion": info.version, "subresource": info.subresource}
            ev["objectRef"] = {k: v for k, v in ref.items() if v}
        if resp is not None:
            ev["responseStatus"] = _response_status(resp)
        if bodies and info.is_resource_request and level.at_least("Request") and info.verb in _JSON_BODY_VERBS:
            obj = _json(req.body)
            if obj is not None:
                ev["requestObject"] = _without_managed_fields(obj) if level.omit_managed_fields else obj
        if (bodies and info.is_resource_request and level.at_least("RequestResponse") and resp is not None
                and resp.stream is None and stage == "ResponseComplete"):
            obj = _json(resp.body) if "json" in resp.headers.get("content-type", "") else None
            if obj is not None:
                ev["responseObject"] = _without_managed_fields(obj) if level.omit_managed_fields else obj
        ev["requestReceivedTimestamp"] = rfc3339(rec.received, micro=True)
        ev["stageTimestamp"] = rfc3339(self.api.clock.now(), micro=True)
        if rec.decision:
            ev["annotations"] = {"authorization.k8s.io/decision": rec.decision}
        return ev


def _requestor(user: UserInfo | None) -> UserInfo | None:
    """Who sent the request: the impersonator, when it acts as someone else."""
    by = getattr(user, "impersonator", None)
    return by if by is not None else user


def _user(u: UserInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"username": u.name}
    if u.uid:
        out["uid"] = u.uid
    if u.groups:
        out["groups"] = list(u.groups)
    if u.extra:
        out["extra"] = {k: list(v) for k, v in u.extra.items()}
    return out


def _request_uri(req: RawRequest) -> str:
    uri = quote(req.path, safe="/:@!$&'()*+,;=-._~")
    return f"{uri}?{urlencode(req.query)}" if req.query else uri


def _source_ips(req: RawRequest) -> list[str]:
    """As Kubernetes' utilnet.SourceIPs: X-Forwarded-For's, X-Real-Ip, then the peer."""
    ips = [ip.strip() for ip in req.headers.get("x-forwarded-for", "").split(",") if ip.strip()]
    real = req.headers.get("x-real-ip", "").strip()
    if real and real not in ips:
        ips.append(real)
    if req.remote_addr and (not ips or ips[-1] != req.remote_addr):
        ips.append(req.remote_addr)
    return ips


def _json(body: bytes) -> Any:
    if not body:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _response_status(resp: RawResponse) -> dict[str, Any]:
    """The Status the server answered with (errors and Success Statuses), else the code."""
    if resp.stream is None and "json" in resp.headers.get("content-type", "") and resp.body[:200].find(
            b'"Status"') >= 0:
        obj = _json(resp.body)
        if isinstance(obj, dict) and obj.get("kind") == "Status":
            status = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
            status.setdefault("metadata", {})
            status["code"] = resp.status
            return status
    return {"metadata": {}, "code": resp.status}


def _without_managed_fields(obj: Any) -> Any:
    if not isinstance(obj, dict):
        return obj
    out = dict(obj)
    meta = out.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    if isinstance(out.get("items"), list):
        out["items"] = [_without_managed_fields(i) for i in out["items"]]
    return out
