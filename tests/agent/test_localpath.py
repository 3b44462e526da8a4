"""The node's local-path cleanup against a real API server, over HTTPS with the node's own
token: a deleted volume's directory under the class's nodePath is removed and the volume
goes; anything that is not exactly a provisioned directory stays. Also what the Node
authorizer lets a node do with claims, volumes and classes (and nothing more)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.bootstrap import node_token
from gpufleet.agent.localpath import LocalPathCleanup
from gpufleet.api import storage
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client import Client, HttpTransport, NotFound
from gpufleet.controllers.localpath import default_class, provisioned_volume

NODE = "gpu-1"


async def eventually(check: Callable[[], Awaitable[Any]], limit_s: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + limit_s
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: last {result!r}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    plane = ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path / "state",
                         run_controllers=False)
    await plane.start()
    yield plane
    await plane.stop()


def connect(cp: ControlPlane, token: str | None) -> Client:
    return Client(HttpTransport(cp.url, token=token, ca_data=cp.ca_pem), read_retries=1)


@pytest.fixture
async def admin(cp: ControlPlane) -> AsyncIterator[Client]:
    async with connect(cp, cp.admin_token) as c:
        yield c


@pytest.fixture
async def node_client(cp: ControlPlane, tmp_path: Path) -> AsyncIterator[Client]:
    token = await node_token(lambda t: connect(cp, t), cp.join_token, NODE, tmp_path / "agent")
    async with connect(cp, token) as c:
        yield c


def claim(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "default", "uid": uid, "resourceVersion": "1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                     "volumeMode": "Filesystem"}}


async def provisioned(admin: Client, node_path: Path, name: str, uid: str, node: str = NODE) -> tuple[str, Path]:
    """A volume exactly as the provisioner writes it, and its directory with some data in it."""
    sc = (await admin.get("storageclasses", storage.LOCAL_PATH_CLASS, raw=True))
    pv = provisioned_volume(claim(name, uid), sc, node)
    created = await admin.create(pv, raw=True)
    directory = Path(created["spec"]["hostPath"]["path"])
    (directory / "epoch-3").mkdir(parents=True)
    (directory / "epoch-3" / "model.pt").write_bytes(b"weights")
    return created["metadata"]["name"], directory


def is_dir(*paths: Path) -> list[bool]:
    return [p.is_dir() for p in paths]


async def gone(admin: Client, name: str) -> bool:
    try:
        await admin.get("persistentvolumes", name, raw=True)
    except NotFound:
        return True
    return False


@pytest.fixture
async def node_path(admin: Client, tmp_path: Path) -> Path:
    path = tmp_path / "local-path"
    path.mkdir()
    await admin.create(default_class(str(path)), raw=True)
    return path


async def test_a_deleted_volumes_directory_is_removed_and_the_volume_goes(
        admin: Client, node_client: Client, node_path: Path) -> None:
    name, directory = await provisioned(admin, node_path, "ckpt", "0f6e7d3c-0000-4000-8000-000000000001")
    sibling = node_path / "keep-me"
    sibling.mkdir()
    cleanup = LocalPathCleanup(node_client, NODE)
    await cleanup.start()
    try:
        await eventually(lambda: _synced(cleanup), what="the cleanup's informer")
        assert is_dir(directory) == [True]
        await admin.delete("persistentvolumes", name)
        # pv-protection (added on create) goes first: the PV controller's job, done by hand here.
        pv = await admin.get("persistentvolumes", name, raw=True)
        pv["metadata"]["finalizers"] = [storage.LOCAL_PATH_CLEANUP_FINALIZER]
        await admin.update(pv, raw=True)
        await eventually(lambda: gone(admin, name), what="the volume to be deleted")
        assert is_dir(directory, sibling, node_path) == [False, True, True]
    finally:
        await cleanup.stop()


async def _synced(cleanup: LocalPathCleanup) -> bool:
    return cleanup.informer.has_synced


async def test_a_volume_still_protected_keeps_its_directory(
        admin: Client, node_client: Client, node_path: Path) -> None:
    name, directory = await provisioned(admin, node_path, "ckpt", "0f6e7d3c-0000-4000-8000-000000000002")
    cleanup = LocalPathCleanup(node_client, NODE)
    await cleanup.start()
    try:
        await eventually(lambda: _synced(cleanup), what="the cleanup's informer")
        await admin.delete("persistentvolumes", name)
        await eventually(lambda: _deleting(admin, name), what="the deletion to be recorded")
        await asyncio.sleep(0.5)
        pv = await admin.get("persistentvolumes", name, raw=True)
        assert set(pv["metadata"]["finalizers"]) == {storage.LOCAL_PATH_CLEANUP_FINALIZER,
                                                     storage.PV_PROTECTION_FINALIZER}
        assert is_dir(directory) == [True]
    finally:
        await cleanup.stop()


async def _deleting(admin: Client, name: str) -> bool:
    pv = await admin.get("persistentvolumes", name, raw=True)
    return bool(pv["metadata"].get("deletionTimestamp"))


async def test_a_path_outside_the_class_tree_is_left_alone(
        admin: Client, node_client: Client, node_path: Path, tmp_path: Path) -> None:
    precious = tmp_path / "datasets" / "imagenet"
    precious.mkdir(parents=True)
    (precious / "train.tar").write_bytes(b"data")
    name = "pvc-0f6e7d3c-0000-4000-8000-000000000003"
    pv = provisioned_volume(claim("ckpt", "0f6e7d3c-0000-4000-8000-000000000003"),
                            await admin.get("storageclasses", storage.LOCAL_PATH_CLASS, raw=True), NODE)
    pv["spec"]["hostPath"]["path"] = str(precious)
    pv["metadata"]["finalizers"] = [storage.LOCAL_PATH_CLEANUP_FINALIZER]
    await admin.create(pv, raw=True)
    cleanup = LocalPathCleanup(node_client, NODE)
    await cleanup.start()
    try:
        await eventually(lambda: _synced(cleanup), what="the cleanup's informer")
        await admin.delete("persistentvolumes", name)
        pv = await admin.get("persistentvolumes", name, raw=True)
        pv["metadata"]["finalizers"] = [storage.LOCAL_PATH_CLEANUP_FINALIZER]
        await admin.update(pv, raw=True)
        await eventually(lambda: gone(admin, name), what="the volume to be let go")
        assert (precious / "train.tar").read_bytes() == b"data"
        events = (await admin.list("events", "default", field_selector={"involvedObject.name": name}, raw=True)).items
        assert [e["reason"] for e in events] == ["VolumeFailedDelete"]
        assert str(precious) in events[0]["message"] and "not a directory the local-path provisioner made" \
            in events[0]["message"]
    finally:
        await cleanup.stop()


async def _status(c: Client, method: str, path: str, body: Any = None, params: Any = None) -> int:
    content = json.dumps(body) if body is not None else None
    headers = {"content-type": "application/json"} if content else None
    resp = await c.raw_request(method, path, params=params, content=content, headers=headers,
                               raise_for_status=False)
    return resp.status


async def test_a_node_reaches_only_its_pods_claims_their_volumes_and_its_local_volumes(
        admin: Client, node_client: Client, node_path: Path) -> None:
    mine, _ = await provisioned(admin, node_path, "ckpt", "0f6e7d3c-0000-4000-8000-000000000004")
    theirs, _ = await provisioned(admin, node_path, "other", "0f6e7d3c-0000-4000-8000-000000000005", node="gpu-2")
    for name in ("used", "unused"):
        body = claim(name, "")
        body["metadata"] = {"name": name, "namespace": "default"}
        await admin.create(body, raw=True)
    bound = await admin.get("persistentvolumeclaims", "used", "default", raw=True)
    bound["spec"]["volumeName"] = theirs
    await admin.update(bound, raw=True)
    pv = await admin.get("persistentvolumes", theirs, raw=True)
    pv["spec"]["claimRef"] = {"namespace": "default", "name": "used"}
    await admin.update(pv, raw=True)
    await admin.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "default"},
                        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox"}],
                                 "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "used"}}]}},
                       raw=True)
    claims = "/api/v1/namespaces/default/persistentvolumeclaims"
    volumes = "/api/v1/persistentvolumes"
    label = {"labelSelector": f"{storage.LOCAL_PATH_NODE_LABEL}={NODE}"}
    other_label = {"labelSelector": f"{storage.LOCAL_PATH_NODE_LABEL}=gpu-2"}
    allowed = [("GET", f"{claims}/used", None), ("GET", f"{volumes}/{theirs}", None),
               ("GET", f"{volumes}/{mine}", None), ("GET", volumes, label),
               ("GET", f"/apis/storage.k8s.io/v1/storageclasses/{storage.LOCAL_PATH_CLASS}", None)]
    for method, path, params in allowed:
        assert await _status(node_client, method, path, params=params) == 200, path
    refused = [("GET", f"{claims}/unused", None), ("GET", claims, None), ("GET", volumes, None),
               ("GET", volumes, other_label), ("GET", "/apis/storage.k8s.io/v1/storageclasses", None),
               ("DELETE", f"{volumes}/{mine}", None), ("DELETE", f"{claims}/used", None)]
    for method, path, params in refused:
        assert await _status(node_client, method, path, params=params) == 403, (method, path, params)
    listed = await node_client.list("persistentvolumes", label_selector=label["labelSelector"], raw=True)
    assert [p["metadata"]["name"] for p in listed.items] == [mine]
    # It may take a finalizer off a volume that lives on it, and do nothing else with it.
    pv = await node_client.get("persistentvolumes", mine, raw=True)
    pv["spec"]["capacity"] = {"storage": "100Gi"}
    assert await _status(node_client, "PUT", f"{volumes}/{mine}", pv) == 403
    pv = await node_client.get("persistentvolumes", mine, raw=True)
    pv["metadata"]["finalizers"] = [storage.PV_PROTECTION_FINALIZER]
    assert await _status(node_client, "PUT", f"{volumes}/{mine}", pv) == 200
    other = await admin.get("persistentvolumes", theirs, raw=True)
    other["metadata"]["finalizers"] = []
    assert await _status(node_client, "PUT", f"{volumes}/{theirs}", other) == 403
