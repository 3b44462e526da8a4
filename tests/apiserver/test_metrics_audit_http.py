"""The API server's /metrics (behind RBAC, as the non-resource URL /metrics) and its audit
log, over the real TLS listener of an in-process control plane (no controllers)."""

from __future__ import annotations

import asyncio
import base64
import json
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.apiserver.audit import LogOptions, parse_policy
from gpufleet.cli.commands.token import create_token
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client import Client, HttpTransport

SECRET_VALUE = "hunter2-do-not-log"


async def plane(tmp_path: Path, **options: Any) -> ControlPlane:
    cp = ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path / "state",
                      run_controllers=False, **options)
    await cp.start()
    return cp


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    c = await plane(tmp_path)
    yield c
    await c.stop()


def http(cp: ControlPlane, token: str | None = None) -> httpx.AsyncClient:
    import ssl

    ctx = ssl.create_default_context(cadata=cp.ca_pem.decode())
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=cp.url, verify=ctx, headers=headers, timeout=30)


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out.append((s.labels, s.value))
    return out


async def service_account_token(admin: httpx.AsyncClient, ns: str, name: str) -> str:
    r = await admin.post(f"/api/v1/namespaces/{ns}/serviceaccounts",
                         json={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    assert r.status_code == 201, r.text
    r = await admin.post(f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token",
                         json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}})
    assert r.status_code == 201, r.text
    return r.json()["status"]["token"]


# -- /metrics ------------------------------------------------------------------------------------


async def test_metrics_count_requests_with_kube_apiserver_labels(cp: ControlPlane) -> None:
    async with http(cp, cp.admin_token) as admin:
        assert (await admin.get("/api/v1/namespaces/default/configmaps")).status_code == 200
        assert (await admin.get("/api/v1/nodes/nowhere")).status_code == 404
        r = await admin.post("/api/v1/namespaces/default/configmaps?dryRun=All",
                             json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
        assert r.status_code == 201
        assert (await admin.get("/apis/made.up/v1/things")).status_code == 404
        r = await admin.get("/api/v1/namespaces/default/configmaps", params={"watch": "1", "timeoutSeconds": "1"})
        assert r.status_code == 200
        r = await admin.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    total = samples(r.text, "apiserver_request_total")
    common = {"component": "apiserver", "group": "", "version": "v1", "subresource": ""}

    def has(**labels: str) -> bool:
        want = {**common, "dry_run": "", **labels}
        return any(all(ls.get(k) == v for k, v in want.items()) and value >= 1 for ls, value in total)

    assert has(verb="LIST", resource="configmaps", scope="namespace", code="200")
    assert has(verb="GET", resource="nodes", scope="resource", code="404")
    assert has(verb="POST", resource="configmaps", scope="resource", code="201", dry_run="All")
    assert has(verb="WATCH", resource="configmaps", scope="namespace", code="200")
    # A path nobody serves does not make up label values.
    assert has(verb="LIST", group="other", version="other", resource="other", scope="cluster", code="404")
    assert not any(ls.get("group") == "made.up" for ls, _ in total)
    latency = samples(r.text, "apiserver_request_duration_seconds_count")
    assert any(ls["verb"] == "LIST" and ls["resource"] == "configmaps" for ls, _ in latency)
    sizes = samples(r.text, "apiserver_response_sizes_count")
    assert any(ls["verb"] == "LIST" and ls["resource"] == "configmaps" for ls, _ in sizes)
    store = samples(r.text, "etcd_request_duration_seconds_count")
    assert any(ls == {"operation": "list", "type": "configmaps"} for ls, _ in store)
    inflight = dict((ls["request_kind"], v) for ls, v in samples(r.text, "apiserver_current_inflight_requests"))
    assert inflight == {"readOnly": 1.0, "mutating": 0.0}  # the scrape itself


async def test_an_open_watch_is_a_long_running_request_and_a_registered_watcher(cp: ControlPlane) -> None:
    async with http(cp, cp.admin_token) as admin:
        async with admin.stream("GET", "/api/v1/namespaces/default/pods",
                                params={"watch": "1", "timeoutSeconds": "30"}) as w:
            assert w.status_code == 200
            text = (await admin.get("/metrics")).text
            longrunning = samples(text, "apiserver_longrunning_requests")
            assert ({"component": "apiserver", "group": "", "version": "v1", "resource": "pods", "subresource": "",
                     "scope": "namespace", "verb": "WATCH"}, 1.0) in longrunning
            assert ({"group": "", "version": "v1", "kind": "Pod"}, 1.0) in samples(
                text, "apiserver_registered_watchers")
        for _ in range(100):  # the server sees the watch end once the connection closes
            text = (await admin.get("/metrics")).text
            if ({"group": "", "version": "v1", "kind": "Pod"}, 0.0) in samples(text, "apiserver_registered_watchers"):
                break
            await asyncio.sleep(0.05)
        assert ({"group": "", "version": "v1", "kind": "Pod"}, 0.0) in samples(text, "apiserver_registered_watchers")


async def test_metrics_need_a_token_and_get_on_the_non_resource_url(cp: ControlPlane) -> None:
    async with http(cp) as anonymous:
        r = await anonymous.get("/metrics")
    assert r.status_code == 401
    assert r.json()["kind"] == "Status" and r.json()["reason"] == "Unauthorized"
    async with http(cp, cp.admin_token) as admin:
        await admin.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": "team-a"}})
        editor = await create_token(Client(HttpTransport(cp.url, token=cp.admin_token, ca_data=cp.ca_pem)),
                                    role="edit", namespace="team-a", user="alice")
        # A ClusterRole for the URL, bound to a ServiceAccount, as one does for Prometheus.
        await admin.post("/apis/rbac.authorization.k8s.io/v1/clusterroles", json={
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "scrape"},
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]})
        await admin.post("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", json={
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "scrape"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "scrape"},
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "team-a"}]})
        sa_token = await service_account_token(admin, "team-a", "prometheus")
        other_sa = await service_account_token(admin, "team-a", "other")
        # The default system:monitoring ClusterRole, bound to a token user cluster-wide.
        monitor = await create_token(Client(HttpTransport(cp.url, token=cp.admin_token, ca_data=cp.ca_pem)),
                                     role="system:monitoring", namespace=None, user="grafana-agent")
    async with http(cp, editor["token"]) as alice:
        r = await alice.get("/metrics")
    assert r.status_code == 403
    assert r.json() == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": 'forbidden: User "alice" cannot get path "/metrics"', "reason": "Forbidden",
                        "code": 403}
    async with http(cp, other_sa) as other:
        assert (await other.get("/metrics")).status_code == 403
    for token in (sa_token, monitor["token"]):
        async with http(cp, token) as scraper:
            r = await scraper.get("/metrics")
            assert r.status_code == 200, r.text
            assert "apiserver_request_total" in r.text
            assert (await scraper.post("/metrics")).status_code == 403  # get only
            assert (await scraper.get("/api/v1/namespaces/team-a/secrets")).status_code == 403


async def test_each_api_server_has_its_own_registry(tmp_path: Path) -> None:
    a = await plane(tmp_path / "a")
    b = await plane(tmp_path / "b")
    try:
        async with http(a, a.admin_token) as ca:
            for _ in range(3):
                await ca.get("/api/v1/namespaces/default/services")
        async with http(b, b.admin_token) as cb:
            text = (await cb.get("/metrics")).text
        assert not [s for s in samples(text, "apiserver_request_total") if s[0]["resource"] == "services"]
    finally:
        await a.stop()
        await b.stop()


# -- audit log ------------------------------------------------------------------------------------

POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
    "rules": [
        {"level": "None", "nonResourceURLs": ["/healthz*", "/readyz*", "/livez*", "/version"]},
        {"level": "Metadata", "resources": [{"group": "", "resources": ["secrets"]}],
         "omitStages": ["RequestReceived"]},
        {"level": "RequestResponse", "resources": [{"group": "", "resources": ["configmaps"]}],
         "namespaces": ["audited"], "omitStages": ["RequestReceived"]},
        {"level": "Request", "verbs": ["create", "update", "patch"]},
        {"level": "Metadata", "omitStages": ["RequestReceived"]},
    ],
}


def read_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_audit_log_records_requests_at_the_policy_levels(tmp_path: Path) -> None:
    log_path = tmp_path / "logs" / "audit.log"
    cp = await plane(tmp_path, audit_policy=parse_policy(POLICY), audit_log_path=str(log_path),
                     audit_log_options=LogOptions())
    try:
        async with http(cp, cp.admin_token) as admin:
            await admin.get("/healthz")
            r = await admin.post("/api/v1/namespaces/default/secrets", headers={"user-agent": "auditor-test/1"},
                                 json={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pw"},
                                       "stringData": {"password": SECRET_VALUE}})
            assert r.status_code == 201
            assert (await admin.get("/api/v1/namespaces/default/secrets/pw")).status_code == 200
            await admin.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": "audited"}})
            r = await admin.post("/api/v1/namespaces/audited/configmaps", json={
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"k": "v"}})
            assert r.status_code == 201
            r = await admin.post("/api/v1/namespaces/default/configmaps", json={
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"k": "plain"}})
            assert r.status_code == 201
            assert (await admin.get("/api/v1/namespaces/default/pods/missing")).status_code == 404
            async with http(cp) as anonymous:
                assert (await anonymous.get("/api/v1/pods")).status_code == 401
    finally:
        await cp.stop()
    assert stat.S_IMODE(log_path.stat().st_mode) == 0o600
    text = log_path.read_text()
    assert SECRET_VALUE not in text and base64.b64encode(SECRET_VALUE.encode()).decode() not in text
    events = read_events(log_path)
    assert all(e["kind"] == "Event" and e["apiVersion"] == "audit.k8s.io/v1" for e in events)
    assert not [e for e in events if e["requestURI"].startswith("/healthz")]  # level None

    def find(verb: str, uri: str) -> list[dict[str, Any]]:
        return [e for e in events if e["verb"] == verb and e["requestURI"] == uri]

    create_secret = find("create", "/api/v1/namespaces/default/secrets")
    assert [e["stage"] for e in create_secret] == ["ResponseComplete"]  # RequestReceived omitted by the rule
    ev = create_secret[0]
    assert ev["level"] == "Metadata"
    assert ev["user"]["username"] == "admin" and "system:masters" in ev["user"]["groups"]
    assert ev["sourceIPs"] == ["127.0.0.1"]
    assert ev["userAgent"] == "auditor-test/1"
    assert ev["objectRef"] == {"resource": "secrets", "namespace": "default", "apiVersion": "v1"}
    assert ev["responseStatus"] == {"metadata": {}, "code": 201}
    assert "requestObject" not in ev and "responseObject" not in ev
    assert ev["annotations"] == {"authorization.k8s.io/decision": "allow"}
    assert ev["requestReceivedTimestamp"] <= ev["stageTimestamp"]
    assert len(ev["auditID"]) == 36

    (get_secret,) = find("get", "/api/v1/namespaces/default/secrets/pw")
    assert get_secret["objectRef"]["name"] == "pw" and get_secret["level"] == "Metadata"

    (audited,) = find("create", "/api/v1/namespaces/audited/configmaps")
    assert audited["level"] == "RequestResponse"
    assert audited["requestObject"]["data"] == {"k": "v"}
    assert audited["responseObject"]["metadata"]["name"] == "cm"
    assert audited["responseObject"]["metadata"]["uid"]

    # Request level: the request's body, not the answer; the rule keeps RequestReceived.
    plain = find("create", "/api/v1/namespaces/default/configmaps")
    assert [e["stage"] for e in plain] == ["RequestReceived", "ResponseComplete"]
    assert len({e["auditID"] for e in plain}) == 1
    assert plain[1]["level"] == "Request" and plain[1]["requestObject"]["data"] == {"k": "plain"}
    assert "responseObject" not in plain[1] and "responseStatus" not in plain[0]

    (missing,) = find("get", "/api/v1/namespaces/default/pods/missing")
    assert missing["responseStatus"]["code"] == 404 and missing["responseStatus"]["reason"] == "NotFound"
    assert missing["responseStatus"]["status"] == "Failure"

    (refused,) = find("list", "/api/v1/pods")
    assert refused["user"] == {} and refused["responseStatus"]["code"] == 401


async def test_audit_log_names_the_impersonator_and_records_refusals(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.log"
    log_path.write_text("")
    log_path.chmod(0o644)  # loosened by someone: tightened at start
    policy = parse_policy({"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
                           "rules": [{"level": "Metadata", "omitStages": ["RequestReceived"]}]})
    cp = await plane(tmp_path, audit_policy=policy, audit_log_path=str(log_path))
    try:
        async with http(cp, cp.admin_token) as admin:
            await admin.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": "team-a"}})
            editor = await create_token(Client(HttpTransport(cp.url, token=cp.admin_token, ca_data=cp.ca_pem)),
                                        role="edit", namespace="team-a", user="alice")
            r = await admin.get("/api/v1/namespaces/team-a/pods", headers={"impersonate-user": "bob"})
            assert r.status_code == 403
        async with http(cp, editor["token"]) as alice:
            assert (await alice.get("/api/v1/namespaces/kube-system/secrets")).status_code == 403
    finally:
        await cp.stop()
    assert stat.S_IMODE(log_path.stat().st_mode) == 0o600
    events = read_events(log_path)
    (impersonated,) = [e for e in events if e["requestURI"] == "/api/v1/namespaces/team-a/pods"]
    assert impersonated["user"]["username"] == "admin"
    assert impersonated["impersonatedUser"] == {"username": "bob", "groups": ["system:authenticated"]}
    assert impersonated["annotations"] == {"authorization.k8s.io/decision": "forbid"}
    (refused,) = [e for e in events if e["requestURI"] == "/api/v1/namespaces/kube-system/secrets"
                  and e["verb"] == "list"]
    assert refused["user"]["username"] == "alice"
    assert refused["responseStatus"]["code"] == 403 and refused["responseStatus"]["reason"] == "Forbidden"
    assert refused["annotations"] == {"authorization.k8s.io/decision": "forbid"}


async def test_a_watch_is_logged_when_it_starts_and_when_it_ends(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.log"
    policy = parse_policy({"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
                           "rules": [{"level": "Metadata", "verbs": ["watch"]}]})
    cp = await plane(tmp_path, audit_policy=policy, audit_log_path=str(log_path))
    try:
        async with http(cp, cp.admin_token) as admin:
            r = await admin.get("/api/v1/namespaces/default/pods", params={"watch": "1", "timeoutSeconds": "1"})
            assert r.status_code == 200
    finally:
        await cp.stop()
    events = read_events(log_path)
    assert [e["stage"] for e in events] == ["RequestReceived", "ResponseStarted", "ResponseComplete"]
    assert {e["verb"] for e in events} == {"watch"}
