"""The official `kubernetes` Python client against a real `gpufleet up`.

The client does no discovery: it goes straight to the REST paths and deserializes every
answer into its strictly validated models, so a missing required field or a Status where
it expects an object fails here even when kubectl would not notice.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from e2e_helpers import Cluster
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.e2e

WATCH_TIMEOUT = 5


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[client.ApiClient]:
    configuration = client.Configuration()
    config.load_kube_config(config_file=cluster.kubeconfig, client_configuration=configuration)
    with client.ApiClient(configuration) as api_client:
        yield api_client


@pytest.fixture(scope="module")
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture(scope="module")
def apps(api: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api)


def pod_body(name: str, **labels: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "ports": [{"containerPort": 80}]}]},
    }


def deployment_body(name: str, replicas: int = 1, image: str = "nginx:1.25") -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {"name": "main", "image": image, "ports": [{"containerPort": 8080, "name": "http"}]}
                    ]
                },
            },
        },
    }


def test_pod_crud(core: client.CoreV1Api) -> None:
    namespaces = {ns.metadata.name for ns in core.list_namespace().items}
    assert {"default", "kube-system"} <= namespaces

    created = core.create_namespaced_pod("default", pod_body("py-pod"))
    assert isinstance(created, client.V1Pod)
    assert created.metadata.uid and created.metadata.resource_version
    assert created.status.phase == "Pending"

    read = core.read_namespaced_pod("py-pod", "default")
    assert read.metadata.uid == created.metadata.uid
    assert read.spec.containers[0].ports[0].container_port == 80

    listed = core.list_namespaced_pod("default")
    assert "py-pod" in {p.metadata.name for p in listed.items}
    assert listed.metadata.resource_version
    assert [
        p.metadata.name for p in core.list_namespaced_pod("default", label_selector="app=py-pod").items
    ] == ["py-pod"]

    deleted = core.delete_namespaced_pod("py-pod", "default")
    assert isinstance(deleted, client.V1Pod)
    assert deleted.metadata.name == "py-pod"
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("py-pod", "default")
    assert missing.value.status == 404
    status = json.loads(missing.value.body)
    assert (status["kind"], status["reason"], status["message"]) == (
        "Status",
        "NotFound",
        'pods "py-pod" not found',
    )


def test_deployment_create_list_patch_scale(apps: client.AppsV1Api) -> None:
    created = apps.create_namespaced_deployment("default", deployment_body("py-web"))
    assert isinstance(created, client.V1Deployment) and created.spec.replicas == 1
    assert "py-web" in {d.metadata.name for d in apps.list_namespaced_deployment("default").items}

    # A dict body goes out as a strategic merge patch: containers merge by name.
    patched = apps.patch_namespaced_deployment(
        "py-web",
        "default",
        {"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "nginx:1.26"}]}}}},
    )
    (container,) = patched.spec.template.spec.containers
    assert container.image == "nginx:1.26"
    assert [(p.container_port, p.name) for p in container.ports] == [(8080, "http")]
    assert patched.metadata.generation == 2

    scale = apps.patch_namespaced_deployment_scale("py-web", "default", {"spec": {"replicas": 4}})
    assert isinstance(scale, client.V1Scale)
    assert scale.spec.replicas == 4
    assert apps.read_namespaced_deployment("py-web", "default").spec.replicas == 4
    assert apps.read_namespaced_deployment_scale("py-web", "default").spec.replicas == 4


def test_replace_with_stale_resource_version_conflicts(apps: client.AppsV1Api) -> None:
    apps.create_namespaced_deployment("default", deployment_body("py-stale"))
    stale = apps.read_namespaced_deployment("py-stale", "default")
    apps.patch_namespaced_deployment("py-stale", "default", {"metadata": {"labels": {"touched": "yes"}}})

    stale.spec.replicas = 7
    with pytest.raises(ApiException) as conflict:
        apps.replace_namespaced_deployment("py-stale", "default", stale)
    assert conflict.value.status == 409
    status = json.loads(conflict.value.body)
    assert status["reason"] == "Conflict"
    assert status["message"] == (
        'Operation cannot be fulfilled on deployments.apps "py-stale": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )

    # With the latest version it goes through. The Deployment controller writes the object's
    # status meanwhile (which moves its resourceVersion too), so the read and replace are
    # retried as any client must, until one lands.
    deadline = time.monotonic() + 30
    while True:
        fresh = apps.read_namespaced_deployment("py-stale", "default")
        fresh.spec.replicas = 7
        try:
            replaced = apps.replace_namespaced_deployment("py-stale", "default", fresh)
            break
        except ApiException as exc:
            if exc.status != 409 or time.monotonic() > deadline:
                raise
    assert replaced.spec.replicas == 7
    assert replaced.metadata.labels["touched"] == "yes"


def _collect(stream, until, events: list[tuple[str, str, str]]) -> None:
    for ev in stream:
        obj = ev["object"]
        events.append((ev["type"], obj.metadata.name, obj.metadata.resource_version))
        if until(events):
            return


def test_watch_sees_existing_then_changes(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_body("py-w1"))

    def change() -> None:
        time.sleep(0.5)
        core.patch_namespaced_pod("py-w1", "default", {"metadata": {"labels": {"phase": "two"}}})
        core.create_namespaced_pod("default", pod_body("py-w2"))
        core.delete_namespaced_pod("py-w1", "default")

    events: list[tuple[str, str, str]] = []
    w = watch.Watch()
    changer = threading.Thread(target=change)
    started = time.monotonic()
    changer.start()
    try:
        _collect(
            w.stream(core.list_namespaced_pod, "default", timeout_seconds=WATCH_TIMEOUT),
            lambda evs: evs[-1][:2] == ("DELETED", "py-w1"),
            events,
        )
    finally:
        w.stop()
        changer.join()
    assert time.monotonic() - started < WATCH_TIMEOUT, f"the watch did not deliver the deletion: {events}"

    kinds = [(t, n) for t, n, _ in events]
    # Existing pods come first, as ADDED (py-w1 among them).
    first_other = next(i for i, (t, _) in enumerate(kinds) if t != "ADDED")
    assert ("ADDED", "py-w1") in kinds[:first_other], kinds
    # The scheduler also writes to pending pods (PodScheduled=False: there is no node), as on a
    # real cluster; the test's own changes must still come in the order it made them.
    first_change = kinds.index(("MODIFIED", "py-w1"))
    mine = [k for k in kinds[first_change:] if k[1] in ("py-w1", "py-w2") and k != ("MODIFIED", "py-w2")]
    assert mine[-2:] == [("ADDED", "py-w2"), ("DELETED", "py-w1")], kinds
    assert set(mine[:-2]) == {("MODIFIED", "py-w1")}, kinds
    revisions = [int(rv) for _, _, rv in events[first_change:]]
    assert revisions == sorted(revisions) and len(set(revisions)) == len(revisions)
    core.delete_namespaced_pod("py-w2", "default")


def test_watch_resumes_from_a_resource_version(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_body("py-r1"))
    since = core.list_namespaced_pod("default").metadata.resource_version
    core.patch_namespaced_pod("py-r1", "default", {"metadata": {"labels": {"seen": "later"}}})
    core.create_namespaced_pod("default", pod_body("py-r2"))

    events: list[tuple[str, str, str]] = []
    w = watch.Watch()
    try:
        _collect(
            w.stream(
                core.list_namespaced_pod, "default", resource_version=since, timeout_seconds=WATCH_TIMEOUT
            ),
            lambda evs: ("ADDED", "py-r2") in [(t, n) for t, n, _ in evs],
            events,
        )
    finally:
        w.stop()
    # Only what happened after `since`: no replay of the pods that already existed. The scheduler
    # may also update py-r1 (PodScheduled=False: no node here) in between, as on a real cluster.
    kinds = [(t, n) for t, n, _ in events]
    assert kinds[0] == ("MODIFIED", "py-r1") and kinds[-1] == ("ADDED", "py-r2"), kinds
    assert set(kinds[:-1]) == {("MODIFIED", "py-r1")}, kinds
    assert all(int(rv) > int(since) for _, _, rv in events)
    for name in ("py-r1", "py-r2"):
        core.delete_namespaced_pod(name, "default")


def test_watch_query_flag_is_case_insensitive(cluster: Cluster, core: client.CoreV1Api) -> None:
    # kubernetes 33.x sends watch=True (Python's spelling); a server that reads it as false
    # answers with a list, and that client's watch then yields nothing at all.
    core.create_namespaced_pod("default", pod_body("py-caps"))
    url = f"{cluster.url}/api/v1/namespaces/default/pods?watch=True&timeoutSeconds=1"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {cluster.token}"})
    tls = ssl.create_default_context(cafile=str(cluster.state_dir / "pki" / "ca.crt"))
    with urllib.request.urlopen(request, timeout=10, context=tls) as resp:
        first = json.loads(resp.readline())
    assert first["type"] == "ADDED" and first["object"]["kind"] == "Pod"
    core.delete_namespaced_pod("py-caps", "default")


def test_merge_patch_content_type(apps: client.AppsV1Api) -> None:
    apps.create_namespaced_deployment("default", deployment_body("py-merge"))
    patched = apps.patch_namespaced_deployment(
        "py-merge",
        "default",
        {"metadata": {"labels": {"team": "vision", "app": None}}},
        _content_type="application/merge-patch+json",
    )
    assert patched.metadata.labels == {"team": "vision"}
    # RFC 7386 replaces lists whole: the ports go with the old container entry.
    patched = apps.patch_namespaced_deployment(
        "py-merge",
        "default",
        {"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "nginx:2"}]}}}},
        _content_type="application/merge-patch+json",
    )
    (container,) = patched.spec.template.spec.containers
    assert container.image == "nginx:2" and container.ports is None


def test_apply_patch_content_type(apps: client.AppsV1Api) -> None:
    body = deployment_body("py-apply", replicas=2)
    created = apps.patch_namespaced_deployment(
        "py-apply", "default", body, _content_type="application/apply-patch+yaml", field_manager="e2e-tests"
    )
    assert created.metadata.name == "py-apply" and created.spec.replicas == 2

    body["spec"]["replicas"] = 3
    updated = apps.patch_namespaced_deployment(
        "py-apply", "default", body, _content_type="application/apply-patch+yaml", field_manager="e2e-tests"
    )
    assert updated.spec.replicas == 3
    assert updated.metadata.uid == created.metadata.uid
    assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)


def test_writes_record_managed_fields(apps: client.AppsV1Api) -> None:
    applied = apps.patch_namespaced_deployment(
        "py-owned",
        "default",
        deployment_body("py-owned"),
        _content_type="application/apply-patch+yaml",
        field_manager="e2e-tests",
    )
    apps.patch_namespaced_deployment(
        "py-owned", "default", {"metadata": {"labels": {"extra": "1"}}}, field_manager="e2e-patcher"
    )
    live = apps.read_namespaced_deployment("py-owned", "default")
    managers = {(m.manager, m.operation) for m in live.metadata.managed_fields or []}
    assert {("e2e-tests", "Apply"), ("e2e-patcher", "Update")} <= managers, managers
    assert applied.metadata.managed_fields, "the apply response carries managedFields too"
