"""A control plane over real HTTPS for the robustness tests, and the checks they share: a
refusal is a Status and moves nothing; a write answered 2xx is stored as answered."""

from __future__ import annotations

import asyncio
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpufleet.cli.controlplane import ControlPlane

CM = "/api/v1/namespaces/default/configmaps"
DEPLOY = "/apis/apps/v1/namespaces/default/deployments"
PODS = "/api/v1/namespaces/default/pods"
JSON = "application/json"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
NAMES = ("obj-0", "obj-1", "obj-2")


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
            "data": {"a": "1"}}


def deployment(name: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}}}}


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
                                                          "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}}


KINDS: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    "configmaps": (CM, configmap), "deployments": (DEPLOY, deployment), "pods": (PODS, pod),
}


@dataclass
class Sent:
    method: str
    path: str
    body: bytes = b""
    params: list[tuple[str, str]] = field(default_factory=list)
    headers: dict[str, bytes] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"{self.method} {self.path!r} params={self.params!r} headers={self.headers!r} body={self.body[:800]!r}"

    @property
    def dry_run(self) -> bool:
        return any(k == "dryRun" for k, _ in self.params)


def pct(text: str) -> str:
    return urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe="")


def url(path: str, params: list[tuple[str, str]]) -> str:
    """The path with the query percent-encoded by hand: a lone surrogate goes as the bytes of
    its (invalid) UTF-8 form, which an HTTP client's own encoding would refuse to send."""
    if not params:
        return path
    return path + "?" + "&".join(f"{pct(k)}={pct(v)}" for k, v in params)


class Cluster:
    """A ControlPlane on its own event loop in a thread; the test speaks to it over HTTPS."""

    def __init__(self, store_url: str, state_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="robust-apiserver", daemon=True)
        self.thread.start()
        self.cp = ControlPlane(store_url=store_url, port=0, state_dir=state_dir, run_controllers=False,
                               kubernetes_service=False)
        self._call(self.cp.start())
        ctx = ssl.create_default_context(cadata=self.cp.ca_pem.decode())
        self.http = httpx.Client(base_url=self.cp.url, verify=ctx, timeout=30,
                                 headers={"authorization": f"Bearer {self.cp.admin_token}"})

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)

    def close(self) -> None:
        self.http.close()
        try:
            self._call(self.cp.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()

    # -- reads the harness trusts

    def revision(self) -> str:
        r = self.http.get(CM, params={"limit": "1"})
        assert r.status_code == 200, r.text
        return r.json()["metadata"]["resourceVersion"]

    def get(self, path: str) -> httpx.Response:
        return self.http.get(path)

    def ensure(self, kind: str, name: str) -> dict[str, Any]:
        collection, make = KINDS[kind]
        r = self.get(f"{collection}/{name}")
        if r.status_code == 404:
            r = self.http.post(collection, json=make(name))
            assert r.status_code == 201, r.text
        assert r.status_code in (200, 201), r.text
        return r.json()

    # -- the request under test

    def send(self, sent: Sent) -> httpx.Response:
        try:
            return self.http.request(sent.method, url(sent.path, sent.params), content=sent.body or None,
                                     headers=sent.headers)
        except httpx.TransportError as e:
            raise AssertionError(f"{sent!r}: the connection failed ({type(e).__name__}: {e})") from e

    def check(self, sent: Sent, target: str | None = None) -> httpx.Response:
        """Sends the request and checks the properties; ``target`` is the object's path."""
        before = self.revision()
        before_obj = self.get(target).content if target else None
        r = self.send(sent)
        where = f"{sent!r} -> {r.status_code} {r.content[:600]!r}"
        assert r.status_code < 500, where
        assert r.headers.get("connection", "").lower() != "close", f"{where}: the server closed the connection"
        after = self.revision()
        if r.status_code >= 400:
            check_status(sent, r, where)
            assert after == before, f"{where}: a refusal, yet the store moved from {before} to {after}"
            if target:
                assert self.get(target).content == before_obj, f"{where}: a refusal, yet {target} changed"
        elif sent.method in ("POST", "PUT", "PATCH", "DELETE"):
            if sent.dry_run:
                assert after == before, f"{where}: a dry run, yet the store moved from {before} to {after}"
            else:
                check_stored(self, sent, r, where)
        return r


def check_status(sent: Sent, r: httpx.Response, where: str) -> None:
    assert r.headers.get("content-type", "").startswith("application/json"), f"{where}: not JSON"
    if sent.method == "HEAD":
        return
    s = r.json()
    assert isinstance(s, dict), where
    assert s.get("kind") == "Status" and s.get("apiVersion") == "v1", f"{where}: not a Status"
    assert s.get("status") == "Failure", where
    assert s.get("code") == r.status_code, f"{where}: code {s.get('code')} in a {r.status_code} answer"
    assert isinstance(s.get("message"), str) and s["message"], where


COLLECTIONS = {"ConfigMap": CM, "Deployment": DEPLOY, "Pod": PODS}


def check_stored(cluster: Cluster, sent: Sent, r: httpx.Response, where: str) -> None:
    obj = r.json()
    assert isinstance(obj, dict), where
    if obj.get("kind") == "Status":  # a delete that finished
        assert obj.get("status") == "Success", where
        meta = obj.get("details") or {}
    else:
        meta = obj.get("metadata") or {}
    name = meta.get("name")
    collection = COLLECTIONS.get(obj.get("kind", "")) if obj.get("kind") != "Status" else None
    if not name or (sent.method != "DELETE" and collection is None):
        return  # a List (deletecollection), or a kind this test does not read back
    path = f"{collection}/{urllib.parse.quote(name, safe='')}" if collection else sent.path
    back = cluster.get(path)
    if sent.method == "DELETE":
        gone = back.status_code == 404
        assert gone or back.json()["metadata"].get("deletionTimestamp"), f"{where}: deleted, yet still there"
        return
    assert back.status_code == 200, f"{where}: answered {r.status_code}, yet not stored ({back.status_code})"
    assert back.json() == obj, f"{where}: stored {back.content[:600]!r}, not what the answer said"
