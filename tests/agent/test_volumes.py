"""The volume manager with real files, real tmpfs mounts and a real API server.

Each test starts a control plane on SQLite, stores ConfigMaps and Secrets in it and lets a
VolumeManager make a pod's volumes under the test's own directory. The tests run as root
(ownership, tmpfs); what is left mounted after a failing test is unmounted by the fixture.
PersistentVolumeClaims and TokenRequests are served by the API server only where it has
them; where it does not, their tests read the objects through an injected getter and
token source (the files are still real).
"""
# The tests look at small files right after each step, on purpose on the event loop's thread.
# ruff: noqa: ASYNC230, ASYNC240

from __future__ import annotations

import base64
import os
import random
import socket
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent import hostmount
from gpufleet.agent.runtime.base import Mount
from gpufleet.agent.tokens import TokenError, TokenManager
from gpufleet.agent.volumes import (
    CONFIG_MAP,
    DOWNWARD_API,
    EMPTY_DIR,
    PROJECTED,
    SECRET,
    VolumeError,
    VolumeManager,
    pod_memory_limit,
)
from gpufleet.api.registry import REGISTRY
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client import NotFound
from gpufleet.utils.clock import FakeClock, RealClock, rfc3339

NODE = "node-a"
NS = "default"
MiB = 1 << 20
GiB = 1 << 30

# tmpfs mounts and chown; the rest runs as any user.
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (tmpfs mounts, chown)")


# -- fixtures and helpers -------------------------------------------------------------------


@pytest.fixture
async def cp(tmp_path: Path):
    plane = ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path / "cp",
                         run_controllers=False)
    await plane.start()
    try:
        yield plane
    finally:
        await plane.stop()


@pytest.fixture(autouse=True)
def unmount_leftovers(tmp_path: Path):
    yield
    for point, _ in hostmount.mounts_under(tmp_path):
        hostmount.unmount(point, detach=True)


class Tokens:
    """A TokenRequest API stand-in: answers with numbered tokens and records each body."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.fail: Exception | None = None

    async def __call__(self, namespace: str, sa: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.fail is not None:
            raise self.fail
        self.requests.append((namespace, sa, body))
        seconds = body["spec"]["expirationSeconds"]
        return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {**body["spec"], "expirationSeconds": seconds},
                "status": {"token": f"token-{len(self.requests)}",
                           "expirationTimestamp": rfc3339(self.clock.now() + seconds)}}


def manager(cp: ControlPlane, tmp_path: Path, **kwargs: Any) -> VolumeManager:
    kwargs.setdefault("clock", RealClock())
    kwargs.setdefault("shm_root", tmp_path / "shm")
    kwargs.setdefault("node_allocatable", lambda: {"cpu": "16", "memory": "64Gi"})
    return VolumeManager(cp.client if cp is not None else None, NODE, tmp_path / "pods", **kwargs)


def make_pod(volumes: list[dict[str, Any]], mounts: list[dict[str, Any]] | None = None, *,
             name: str = "web", labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
             security: dict[str, Any] | None = None, resources: dict[str, Any] | None = None,
             **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox",
                                 "volumeMounts": mounts if mounts is not None else
                                 [{"name": v["name"], "mountPath": f"/mnt/{v['name']}"} for v in volumes]}
    if resources:
        container["resources"] = resources
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "uid": str(uuid.uuid4()),
                         "labels": labels or {"app": name}, "annotations": annotations or {}},
            "spec": {"nodeName": NODE, "containers": [container], "volumes": volumes,
                     **({"securityContext": security} if security else {}), **spec}}


async def put(cp: ControlPlane, kind: str, name: str, **body: Any) -> dict[str, Any]:
    obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": NS}, **body}
    try:
        current = await cp.client.get(kind.lower() + "s", name, NS, raw=True)
    except NotFound:
        return await cp.client.create(obj, raw=True)
    obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    return await cp.client.update(obj, raw=True)


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def mode_of(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def tmpfs_size(path: str | Path) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


def is_tmpfs(path: str | Path) -> bool:
    return hostmount.is_mount_point(path, "tmpfs")


async def setup_error(vm: VolumeManager, pod: dict[str, Any]) -> VolumeError:
    with pytest.raises(VolumeError) as exc:
        await vm.setup(pod)
    return exc.value


# -- emptyDir -------------------------------------------------------------------------------


async def test_empty_dir_is_a_world_writable_directory_in_the_kubelet_layout(cp, tmp_path):
    vm = manager(cp, tmp_path)
    pod = make_pod([{"name": "scratch", "emptyDir": {}}, {"name": "defaulted"}])
    vols = await vm.setup(pod)
    uid = pod["metadata"]["uid"]
    path = tmp_path / "pods" / uid / "volumes" / EMPTY_DIR / "scratch"
    assert vols.path("scratch") == str(path)
    assert path.is_dir() and mode_of(path) == 0o777
    # A volume without a source is an emptyDir, as the API defaults it.
    assert Path(vols.path("defaulted")).is_dir()
    for d in (tmp_path / "pods" / uid, tmp_path / "pods" / uid / "volumes", path.parent):
        assert mode_of(d) == 0o750
    assert vm.mounts(pod, pod["spec"]["containers"][0], vols) == [
        Mount(str(path), "/mnt/scratch", False), Mount(vols.path("defaulted"), "/mnt/defaulted", False)]
    # Content survives another sync.
    (path / "keep").write_text("x")
    await vm.setup(pod)
    assert (path / "keep").read_text() == "x"


@needs_root
async def test_memory_empty_dir_is_a_tmpfs_of_its_size_limit(cp, tmp_path):
    vm = manager(cp, tmp_path, can_mount=True)
    pod = make_pod([{"name": "fast", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}}])
    vols = await vm.setup(pod)
    path = vols.path("fast")
    assert is_tmpfs(path) and vols.volumes["fast"].tmpfs
    assert tmpfs_size(path) == 8 * MiB
    assert not vols.notices
    # Idempotent: no second mount on top of the first.
    await vm.setup(pod)
    assert [p for p, _ in hostmount.mounts_under(path)] == [os.path.realpath(path)]


@needs_root
async def test_memory_empty_dir_without_a_limit_is_bounded_by_the_pods_memory_limit(cp, tmp_path):
    vm = manager(cp, tmp_path, can_mount=True)
    pod = make_pod([{"name": "fast", "emptyDir": {"medium": "Memory"}}],
                   resources={"limits": {"memory": "16Mi"}})
    vols = await vm.setup(pod)
    assert tmpfs_size(vols.path("fast")) == 16 * MiB


async def test_memory_empty_dir_falls_back_to_dev_shm_when_the_agent_may_not_mount(cp, tmp_path):
    vm = manager(cp, tmp_path, can_mount=False)
    pod = make_pod([{"name": "fast", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}}])
    vols = await vm.setup(pod)
    path = Path(vols.path("fast"))
    assert path == tmp_path / "shm" / NODE / pod["metadata"]["uid"] / "fast"
    assert path.is_dir() and not is_tmpfs(path) and mode_of(path) == 0o777
    assert len(vols.notices) == 1 and 'emptyDir volume "fast" (medium: Memory)' in vols.notices[0]
    await vm.teardown(pod["metadata"]["uid"])
    assert not path.exists()


async def test_shm_size_comes_from_the_memory_empty_dir_at_dev_shm(cp, tmp_path):
    vm = manager(cp, tmp_path)
    shm = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}]
    at_shm = [{"name": "dshm", "mountPath": "/dev/shm"}]
    pod = make_pod(shm, at_shm)
    assert vm.shm_size(pod) == GiB
    vols = await vm.setup(pod)
    # The sandbox's /dev/shm is the volume: it is not mounted again.
    assert vm.mounts(pod, pod["spec"]["containers"][0], vols) == []
    unlimited = make_pod([{"name": "dshm", "emptyDir": {"medium": "Memory"}}], at_shm)
    assert vm.shm_size(unlimited) == 64 * GiB
    limited = make_pod([{"name": "dshm", "emptyDir": {"medium": "Memory"}}], at_shm,
                       resources={"limits": {"memory": "2Gi"}})
    assert vm.shm_size(limited) == 2 * GiB
    elsewhere = make_pod(shm, [{"name": "dshm", "mountPath": "/data"}])
    assert vm.shm_size(elsewhere) is None
    assert vm.shm_size(make_pod([{"name": "d", "emptyDir": {}}], [{"name": "d", "mountPath": "/dev/shm"}])) is None


def test_pod_memory_limit_needs_every_container_to_declare_one():
    def pod(*containers, init=()):
        return {"spec": {"containers": [{"name": f"c{i}", "resources": r} for i, r in enumerate(containers)],
                         "initContainers": list(init)}}
    lim = {"limits": {"memory": "1Gi"}}
    assert pod_memory_limit(pod(lim, lim)) == 2 * GiB
    assert pod_memory_limit(pod(lim, {})) is None
    big_init = {"name": "i", "resources": {"limits": {"memory": "3Gi"}}}
    assert pod_memory_limit(pod(lim, init=[big_init])) == 3 * GiB
    sidecar = {"name": "s", "restartPolicy": "Always", "resources": lim}
    assert pod_memory_limit(pod(lim, init=[sidecar])) == 2 * GiB


def test_pod_memory_limit_counts_the_sidecars_an_init_container_runs_beside():
    # Kubernetes' PodLimits: sidecar (1Gi) then init (2Gi) peak at 3Gi, above the 2Gi of the
    # sidecar and container together (the agent used to say 2Gi); overhead is added on top.
    gi = {"limits": {"memory": "1Gi"}}
    pod = {"spec": {"containers": [{"name": "c", "resources": gi}],
                    "initContainers": [{"name": "s", "restartPolicy": "Always", "resources": gi},
                                       {"name": "i", "resources": {"limits": {"memory": "2Gi"}}}],
                    "overhead": {"memory": "1Mi"}}}
    assert pod_memory_limit(pod) == 3 * GiB + 2**20


async def test_empty_dir_over_its_size_limit_is_reported_with_the_eviction_message(cp, tmp_path):
    vm = manager(cp, tmp_path)
    pod = make_pod([{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}, {"name": "free", "emptyDir": {}}])
    vols = await vm.setup(pod)
    (Path(vols.path("scratch")) / "small").write_bytes(os.urandom(100 * 1024))
    (Path(vols.path("free")) / "big").write_bytes(os.urandom(3 * MiB))
    assert vm.over_limit(pod) == []
    (Path(vols.path("scratch")) / "big").write_bytes(os.urandom(2 * MiB))
    [usage] = vm.over_limit(pod)
    assert usage.volume == "scratch" and usage.limit == MiB and usage.used > 2 * MiB
    assert usage.message == 'Usage of EmptyDir volume "scratch" exceeds the limit "1Mi". '


# -- configMap and secret -----------------------------------------------------------------


async def test_config_map_volume_projects_keys_as_links_into_the_data_dir(cp, tmp_path):
    await put(cp, "ConfigMap", "app-config", data={"app.yaml": "port: 80\n", "level": "info"},
              binaryData={"logo.bin": b64(b"\x00\x01\xff")})
    vm = manager(cp, tmp_path)
    pod = make_pod([{"name": "cfg", "configMap": {"name": "app-config"}},
                    {"name": "picked", "configMap": {"name": "app-config", "defaultMode": 0o600, "items": [
                        {"key": "level", "path": "conf/level.txt"},
                        {"key": "app.yaml", "path": "app.yaml", "mode": 0o755}]}}])
    vols = await vm.setup(pod)
    cfg = Path(vols.path("cfg"))
    assert cfg == tmp_path / "pods" / pod["metadata"]["uid"] / "volumes" / CONFIG_MAP / "cfg"
    assert sorted(os.listdir(cfg)) == sorted([os.readlink(cfg / "..data"), "..data", "app.yaml", "level",
                                              "logo.bin"])
    assert os.readlink(cfg / "..data").startswith("..20")
    assert os.readlink(cfg / "app.yaml") == "..data/app.yaml"
    assert (cfg / "app.yaml").read_text() == "port: 80\n"
    assert (cfg / "logo.bin").read_bytes() == b"\x00\x01\xff"
    assert mode_of(cfg / "level") == 0o644
    assert mode_of(cfg / os.readlink(cfg / "..data")) == 0o755
    picked = Path(vols.path("picked"))
    assert (picked / "conf" / "level.txt").read_text() == "info"
    assert os.readlink(picked / "conf") == "..data/conf"
    assert mode_of(picked / "conf" / "level.txt") == 0o600
    assert mode_of(picked / "app.yaml") == 0o755
    assert not (picked / "logo.bin").exists()
    # ConfigMap volumes are always read-only in the container.
    assert all(m.read_only for m in vm.mounts(pod, pod["spec"]["containers"][0], vols))


async def test_config_map_update_swaps_whole_while_an_open_reader_keeps_the_old_version(cp, tmp_path):
    await put(cp, "ConfigMap", "app-config", data={"a": "one", "b": "uno", "gone": "soon"})
    vm = manager(cp, tmp_path)
    pod = make_pod([{"name": "cfg", "configMap": {"name": "app-config"}}])
    cfg = Path((await vm.setup(pod)).path("cfg"))
    old_dir = os.readlink(cfg / "..data")
    reader = open(cfg / "a")  # held open across the update on purpose
    try:
        # Nothing changed: nothing is rewritten.
        await vm.setup(pod)
        assert os.readlink(cfg / "..data") == old_dir
        await put(cp, "ConfigMap", "app-config", data={"a": "two", "b": "dos", "new": "here"})
        await vm.setup(pod)
        assert reader.read() == "one"
    finally:
        reader.close()
    new_dir = os.readlink(cfg / "..data")
    assert new_dir != old_dir and not (cfg / old_dir).exists()
    assert (cfg / "a").read_text() == "two" and (cfg / "b").read_text() == "dos"
    assert (cfg / "new").read_text() == "here"
    assert not os.path.lexists(cfg / "gone")


async def test_optional_and_missing_config_maps_and_keys(cp, tmp_path):
    vm = manager(cp, tmp_path)
    pod = make_pod([{"name": "cfg", "configMap": {"name": "app-config"}}])
    err = await setup_error(vm, pod)
    assert (err.volume, err.reason) == ("cfg", "FailedMount")
    assert err.message == 'MountVolume.SetUp failed for volume "cfg" : configmap "app-config" not found'

    optional = make_pod([{"name": "cfg", "configMap": {"name": "app-config", "optional": True}}])
    vols = await vm.setup(optional)
    assert [n for n in os.listdir(vols.path("cfg")) if not n.startswith("..")] == []

    await put(cp, "ConfigMap", "app-config", data={"a": "1"})
    items = [{"key": "a", "path": "a"}, {"key": "nope", "path": "nope"}]
    err = await setup_error(vm, make_pod([{"name": "cfg", "configMap": {"name": "app-config", "items": items}}]))
    assert err.message == ('MountVolume.SetUp failed for volume "cfg" : configmap references non-existent '
                           "config key: nope")
    vols = await vm.setup(make_pod([{"name": "cfg", "configMap": {"name": "app-config", "items": items,
                                                                   "optional": True}}]))
    assert sorted(n for n in os.listdir(vols.path("cfg")) if not n.startswith("..")) == ["a"]

    # The optional ConfigMap appears on a later sync.
    vols = await vm.setup(optional)
    assert (Path(vols.path("cfg")) / "a").read_text() == "1"


@needs_root
async def test_secret_volume_is_decoded_on_a_tmpfs_with_its_modes(cp, tmp_path):
    await put(cp, "Secret", "db", data={"password": b64("s3cr3t"), "key.der": b64(b"\x30\x82\x00")})
    vm = manager(cp, tmp_path, can_mount=True)
    pod = make_pod([{"name": "creds", "secret": {"secretName": "db", "defaultMode": 0o400,
                                                 "items": [{"key": "password", "path": "db/password"}]}},
                    {"name": "all", "secret": {"secretName": "db"}}])
    vols = await vm.setup(pod)
    creds = Path(vols.path("creds"))
    assert creds.parent.name == SECRET and is_tmpfs(creds)
    assert (creds / "db" / "password").read_text() == "s3cr3t"
    assert mode_of(creds / "db" / "password") == 0o400
    all_ = Path(vols.path("all"))
    assert (all_ / "key.der").read_bytes() == b"\x30\x82\x00" and mode_of(all_ / "key.der") == 0o644

    err = await setup_error(vm, make_pod([{"name": "creds", "secret": {"secretName": "missing"}}]))
    assert err.message == 'MountVolume.SetUp failed for volume "creds" : secret "missing" not found'
    err = await setup_error(vm, make_pod([{"name": "creds", "secret": {
        "secretName": "db", "items": [{"key": "user", "path": "user"}]}}]))
    assert err.message == 'MountVolume.SetUp failed for volume "creds" : references non-existent secret key: user'
    vols = await vm.setup(make_pod([{"name": "creds", "secret": {"secretName": "missing", "optional": True}}]))
    assert Path(vols.path("creds")).is_dir()


async def test_secret_without_mount_permission_is_a_plain_directory(cp, tmp_path):
    await put(cp, "Secret", "db", data={"password": b64("pw")})
    vm = manager(cp, tmp_path, can_mount=False)
    vols = await vm.setup(make_pod([{"name": "creds", "secret": {"secretName": "db"}}]))
    assert not is_tmpfs(vols.path("creds")) and (Path(vols.path("creds")) / "password").read_text() == "pw"


async def test_a_getter_like_the_agents_is_used_for_the_objects(cp, tmp_path):
    asked: list[tuple[str, str, str]] = []

    async def get_object(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        asked.append((kind, namespace, name))
        try:
            return await cp.client.get(kind, name, namespace, raw=True)
        except NotFound:
            return None

    await put(cp, "ConfigMap", "app-config", data={"a": "1"})
    vm = manager(cp, tmp_path, get_object=get_object)
    vols = await vm.setup(make_pod([{"name": "cfg", "configMap": {"name": "app-config"}}]))
    assert (Path(vols.path("cfg")) / "a").read_text() == "1"
    assert asked == [("configmaps", NS, "app-config")]


# -- downward API ---------------------------------------------------------------------------


async def test_downward_api_writes_metadata_and_resources_and_follows_label_changes(cp, tmp_path):
    vm = manager(cp, tmp_path)
    items = [
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}, "mode": 0o600},
        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
        {"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}},
        {"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}},
        {"path": "tier", "fieldRef": {"fieldPath": "metadata.labels['tier']"}},
        {"path": "mem_mi", "resourceFieldRef": {"containerName": "main", "resource": "limits.memory",
                                                "divisor": "1Mi"}},
        {"path": "cpu_m", "resourceFieldRef": {"containerName": "main", "resource": "requests.cpu",
                                               "divisor": "1m"}},
        {"path": "cpu_limit", "resourceFieldRef": {"containerName": "main", "resource": "limits.cpu"}},
    ]
    pod = make_pod([{"name": "info", "downwardAPI": {"items": items}}], name="web",
                   labels={"tier": "front", "app": "web"}, annotations={"note": 'say "hi"\n'},
                   resources={"requests": {"cpu": "250m"}, "limits": {"memory": "512Mi"}})
    vols = await vm.setup(pod)
    info = Path(vols.path("info"))
    assert info.parent.name == DOWNWARD_API
    assert (info / "labels").read_text() == 'app="web"\ntier="front"'
    assert (info / "annotations").read_text() == 'note="say \\"hi\\"\\n"'
    assert mode_of(info / "annotations") == 0o600 and mode_of(info / "labels") == 0o644
    assert (info / "name").read_text() == "web" and (info / "ns").read_text() == NS
    assert (info / "uid").read_text() == pod["metadata"]["uid"]
    assert (info / "tier").read_text() == "front"
    assert (info / "mem_mi").read_text() == "512"
    assert (info / "cpu_m").read_text() == "250"
    # No CPU limit: the node's allocatable CPU, as the kubelet reports it.
    assert (info / "cpu_limit").read_text() == "16"

    pod["metadata"]["labels"]["tier"] = "back"
    reader = open(info / "labels")
    try:
        await vm.setup(pod)
        assert reader.read() == 'app="web"\ntier="front"'
    finally:
        reader.close()
    assert (info / "labels").read_text() == 'app="web"\ntier="back"'
    assert (info / "tier").read_text() == "back"


# -- projected and service account tokens ----------------------------------------------------


@needs_root
async def test_projected_volume_merges_its_sources_with_a_fresh_token(cp, tmp_path):
    await put(cp, "ConfigMap", "kube-root-ca.crt", data={"ca.crt": "CA"})
    await put(cp, "Secret", "extra", data={"k": b64("v")})
    clock = FakeClock()
    tokens = Tokens(clock)
    vm = manager(cp, tmp_path, clock=clock, token_source=tokens, can_mount=True)
    sources = [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"serviceAccountToken": {"path": "vault-token", "audience": "vault"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"secret": {"name": "extra"}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
    ]
    pod = make_pod([{"name": "kube-api-access", "projected": {"sources": sources, "defaultMode": 420}}],
                   serviceAccountName="builder")
    vols = await vm.setup(pod)
    vol = Path(vols.path("kube-api-access"))
    assert vol.parent.name == PROJECTED and is_tmpfs(vol)
    assert sorted(n for n in os.listdir(vol) if not n.startswith("..")) == [
        "ca.crt", "k", "namespace", "token", "vault-token"]
    assert (vol / "token").read_text() == "token-1" and (vol / "vault-token").read_text() == "token-2"
    assert mode_of(vol / "token") == 0o644
    assert (vol / "ca.crt").read_text() == "CA" and (vol / "k").read_text() == "v"
    assert (vol / "namespace").read_text() == NS
    (ns, sa, body), (_, _, vault) = tokens.requests
    assert (ns, sa) == (NS, "builder")
    assert body == {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
        "expirationSeconds": 3607,
        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "web", "uid": pod["metadata"]["uid"]}}}
    assert vault["spec"]["audiences"] == ["vault"] and vault["spec"]["expirationSeconds"] == 3600

    # Resyncs reuse the tokens until they are due, then the files change whole.
    await vm.setup(pod)
    assert len(tokens.requests) == 2
    clock.advance(3607 - 3607 * 20 // 100 + 1)
    await vm.setup(pod)
    assert len(tokens.requests) == 4
    assert (vol / "token").read_text() == "token-3"

    err = await setup_error(vm, make_pod([{"name": "p", "projected": {"sources": [
        {"configMap": {"name": "nope"}}, {"secret": {"name": "nope2"}}]}}]))
    assert err.message == ('MountVolume.SetUp failed for volume "p" : [configmap "nope" not found, '
                           'secret "nope2" not found]')


@needs_root
async def test_projected_token_with_fs_group_is_readable_by_the_group_only(cp, tmp_path):
    clock = FakeClock()
    vm = manager(cp, tmp_path, clock=clock, token_source=Tokens(clock))
    pod = make_pod([{"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}],
                   security={"fsGroup": 3000})
    vol = Path((await vm.setup(pod)).path("tok"))
    st = os.stat(vol / "token")
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == 3000


async def test_token_failure_is_a_mount_error(cp, tmp_path):
    clock = FakeClock()
    tokens = Tokens(clock)
    tokens.fail = RuntimeError('serviceaccounts "default" not found')
    vm = manager(cp, tmp_path, clock=clock, token_source=tokens)
    err = await setup_error(vm, make_pod([{"name": "tok", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token"}}]}}]))
    assert err.message == ('MountVolume.SetUp failed for volume "tok" : failed to fetch token: '
                           'serviceaccounts "default" not found')


async def test_token_refresh_follows_the_kubelets_schedule():
    clock = FakeClock()
    tokens = Tokens(clock)
    tm = TokenManager(tokens, clock, random.Random(7))

    async def get(seconds: int = 3600) -> str:
        issued = await tm.get(NS, "default", audiences=[], expiration_seconds=seconds, pod_name="p", pod_uid="u1")
        return issued.token

    assert await get() == "token-1"
    # Not before 80% of the lifetime less the largest jitter (10 s)...
    clock.advance(3600 * 0.8 - 11)
    assert await get() == "token-1"
    # ...and surely once 80% has passed.
    clock.advance(12)
    assert await get() == "token-2"

    # A failed refresh keeps a token that still holds; an expired one is an error.
    clock.advance(3600 * 0.8 + 1)
    tokens.fail = RuntimeError("the server is down")
    assert await get() == "token-2"
    clock.advance(3600)
    with pytest.raises(TokenError, match="expired and refresh failed: the server is down"):
        await get()
    tokens.fail = None
    assert await get() == "token-3"

    # Long-lived tokens are renewed after a day whatever their lifetime.
    two_days = 2 * 24 * 3600
    assert await get(two_days) == "token-4"
    clock.advance(24 * 3600 - 11)
    assert await get(two_days) == "token-4"
    clock.advance(12)
    assert await get(two_days) == "token-5"

    tm.forget_pod("u1")
    assert await get(two_days) == "token-6"


async def test_token_request_against_the_api_server(cp, tmp_path):
    await cp.client.create({"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": "default", "namespace": NS}}, raw=True)
    # What the root CA publisher keeps in every namespace (every pod's token volume reads it).
    await cp.client.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt",
                            "namespace": NS}, "data": {"ca.crt": cp.ca_pem.decode()}}, raw=True)
    vm = manager(cp, tmp_path)
    pod = await cp.client.create(make_pod([{"name": "tok", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}]}}], name="tok"), raw=True)
    vols = await vm.setup(pod)
    token = (Path(vols.path("tok")) / "token").read_text()
    assert token.count(".") == 2  # a JWT


# -- hostPath -------------------------------------------------------------------------------


async def test_host_path_types(cp, tmp_path):
    vm = manager(cp, tmp_path)
    host = tmp_path / "host"
    host.mkdir()
    (host / "file").write_text("f")
    (host / "dir").mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(host / "sock"))

    async def check(path: Path, type_: str) -> str | None:
        try:
            vols = await vm.setup(make_pod([{"name": "h", "hostPath": {"path": str(path), "type": type_}}]))
        except VolumeError as exc:
            assert exc.message.startswith('MountVolume.SetUp failed for volume "h" : ')
            return exc.message.split(" : ", 1)[1]
        assert vols.path("h") == str(path)
        return None

    try:
        assert await check(host / "new-dir" / "deep", "DirectoryOrCreate") is None
        assert (host / "new-dir" / "deep").is_dir() and mode_of(host / "new-dir" / "deep") == 0o755
        assert await check(host / "new-file", "FileOrCreate") is None
        assert (host / "new-file").is_file() and mode_of(host / "new-file") == 0o644
        assert await check(host / "dir", "Directory") is None
        assert await check(host / "file", "File") is None
        assert await check(host / "sock", "Socket") is None
        assert await check(Path("/dev/null"), "CharDevice") is None
        assert await check(host / "file", "Directory") == f"hostPath type check failed: {host / 'file'} is not a directory"
        assert await check(host / "file", "DirectoryOrCreate") == (
            f"hostPath type check failed: {host / 'file'} is not a directory")
        assert await check(host / "dir", "File") == f"hostPath type check failed: {host / 'dir'} is not a file"
        assert await check(host / "missing", "File") == f"hostPath type check failed: {host / 'missing'} is not a file"
        assert await check(host / "dir", "Socket") == f"hostPath type check failed: {host / 'dir'} is not a socket file"
        assert await check(host / "file", "CharDevice") == (
            f"hostPath type check failed: {host / 'file'} is not a character device")
        assert await check(Path("/dev/null"), "BlockDevice") == (
            "hostPath type check failed: /dev/null is not a block device")
        assert not (host / "missing").exists()
        # No type: no check (a missing path becomes a directory, as the runtime would make it).
        assert await check(host / "file", "") is None
        assert await check(host / "untyped", "") is None and (host / "untyped").is_dir()
    finally:
        sock.close()


# -- persistentVolumeClaim ------------------------------------------------------------------


class Objects:
    """The claims, volumes and nodes a test defines, read through the getter."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str, str], dict[str, Any]] = {}

    def add(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        self.items[(kind, meta.get("namespace", ""), meta["name"])] = obj
        return obj

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.items.get((kind, namespace, name))


def claim(name: str, pv: str = "", phase: str = "Bound", **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", **meta},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": pv,
                     "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": phase}}


def volume(name: str, claim_name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "claimRef": {"kind": "PersistentVolumeClaim", "namespace": NS, "name": claim_name,
                                  "uid": f"uid-{claim_name}"}, **spec}}


def on_node(node: str) -> dict[str, Any]:
    return {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}


async def test_claims_bound_to_host_path_and_local_volumes(tmp_path):
    objects = Objects()
    data = tmp_path / "pv-data"
    local = tmp_path / "local-disk"
    local.mkdir()
    (local / "existing").write_text("keep")
    objects.add("persistentvolumeclaims", claim("data", "pvc-1"))
    objects.add("persistentvolumes", volume("pvc-1", "data", hostPath={"path": str(data), "type": "DirectoryOrCreate"},
                                            nodeAffinity=on_node(NODE)))
    objects.add("persistentvolumeclaims", claim("fast", "local-1"))
    objects.add("persistentvolumes", volume("local-1", "fast", local={"path": str(local)}))
    vm = manager(None, tmp_path, get_object=objects.get)
    pod = make_pod([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "fast", "persistentVolumeClaim": {"claimName": "fast", "readOnly": True}}])
    vols = await vm.setup(pod)
    assert vols.path("data") == str(data) and data.is_dir() and mode_of(data) == 0o755
    assert vols.path("fast") == str(local)
    assert vm.mounts(pod, pod["spec"]["containers"][0], vols) == [
        Mount(str(data), "/mnt/data", False), Mount(str(local), "/mnt/fast", True)]
    # Tearing the pod down leaves the claims' data where it is.
    (data / "model.bin").write_text("weights")
    await vm.teardown(pod["metadata"]["uid"])
    assert (data / "model.bin").read_text() == "weights" and (local / "existing").read_text() == "keep"


async def test_claims_that_cannot_be_used_yet(tmp_path):
    objects = Objects()
    vm = manager(None, tmp_path, get_object=objects.get)

    async def message(claim_name: str) -> str:
        err = await setup_error(vm, make_pod([{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]))
        assert err.volume == "data" and err.reason == "FailedMount"
        return err.message

    assert await message("data") == 'persistentvolumeclaim "data" not found'
    objects.add("persistentvolumeclaims", claim("pending", phase="Pending"))
    assert await message("pending") == ('PVC default/pending has non-bound phase ("Pending") or empty '
                                        'pvc.Spec.VolumeName ("")')
    objects.add("persistentvolumeclaims", claim("leaving", "pv-l", deletionTimestamp="2024-01-01T00:00:00Z"))
    assert await message("leaving") == "can't start pod because PVC default/leaving is being deleted"
    objects.add("persistentvolumeclaims", claim("elsewhere", "pv-e"))
    objects.add("persistentvolumes", volume("pv-e", "elsewhere", hostPath={"path": str(tmp_path / "e")},
                                            nodeAffinity=on_node("node-b")))
    assert await message("elsewhere") == ('MountVolume.NodeAffinity check failed for volume "pv-e" : '
                                          "no matching NodeSelectorTerms")
    assert not (tmp_path / "e").exists()
    objects.add("persistentvolumeclaims", claim("shared", "pv-nfs"))
    objects.add("persistentvolumes", volume("pv-nfs", "shared", nfs={"server": "nas", "path": "/export"}))
    assert await message("shared") == ('MountVolume.SetUp failed for volume "pv-nfs" : volume plugin '
                                       '"kubernetes.io/nfs" is not supported on this node (PersistentVolumes '
                                       "here: hostPath, local)")
    objects.add("persistentvolumeclaims", claim("stolen", "pv-s"))
    objects.add("persistentvolumes", volume("pv-s", "other", hostPath={"path": str(tmp_path / "s")}))
    assert "does not point to claim.UID" in await message("stolen")
    objects.add("persistentvolumeclaims", claim("nolocal", "pv-n"))
    objects.add("persistentvolumes", volume("pv-n", "nolocal", local={"path": str(tmp_path / "absent")}))
    assert await message("nolocal") == ('MountVolume.NewMounter initialization failed for volume "pv-n" : '
                                        f'path "{tmp_path / "absent"}" does not exist')


async def test_claims_against_the_api_server(cp, tmp_path):
    assert REGISTRY.resolve("persistentvolumeclaims") is not None
    vm = manager(cp, tmp_path)
    err = await setup_error(vm, make_pod([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]))
    assert err.message == 'persistentvolumeclaim "data" not found'
    data = tmp_path / "pv-data"
    pv = await cp.client.create({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-1"},
                                 "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                                          "hostPath": {"path": str(data), "type": "DirectoryOrCreate"}}}, raw=True)
    pvc = await cp.client.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                  "metadata": {"name": "data", "namespace": NS},
                                  "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-1",
                                           "resources": {"requests": {"storage": "1Gi"}}}}, raw=True)
    pv["spec"]["claimRef"] = {"kind": "PersistentVolumeClaim", "namespace": NS, "name": "data",
                              "uid": pvc["metadata"]["uid"]}
    await cp.client.update(pv, raw=True)
    pvc["status"] = {"phase": "Bound"}
    await cp.client.update_status(pvc, raw=True)
    vols = await vm.setup(make_pod([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]))
    assert vols.path("data") == str(data) and data.is_dir()


async def test_generic_ephemeral_volumes_use_the_claim_made_for_the_pod(tmp_path):
    objects = Objects()
    vm = manager(None, tmp_path, get_object=objects.get)
    pod = make_pod([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}}], name="trainer")
    err = await setup_error(vm, pod)
    assert err.message == 'waiting for ephemeral volume controller to create the persistentvolumeclaim ' \
                          '"trainer-scratch"'
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "trainer", "uid": pod["metadata"]["uid"], "controller": True}
    objects.add("persistentvolumeclaims", claim("trainer-scratch", "pv-t"))
    err = await setup_error(vm, pod)
    assert err.message == "PVC default/trainer-scratch was not created for pod default/trainer (pod is not owner)"
    objects.add("persistentvolumeclaims", claim("trainer-scratch", "pv-t", ownerReferences=[owner]))
    objects.add("persistentvolumes", volume("pv-t", "trainer-scratch", hostPath={"path": str(tmp_path / "t"),
                                                                                   "type": "DirectoryOrCreate"}))
    vols = await vm.setup(pod)
    assert vols.path("scratch") == str(tmp_path / "t")


async def test_unsupported_volume_types_are_named(cp, tmp_path):
    vm = manager(cp, tmp_path)
    err = await setup_error(vm, make_pod([{"name": "share", "nfs": {"server": "nas", "path": "/x"}}]))
    assert err.message.startswith('MountVolume.SetUp failed for volume "share" : volume plugin "kubernetes.io/nfs" '
                                  "is not supported on this node")
    err = await setup_error(vm, make_pod([{"name": "x", "fancyNewType": {}}]))
    assert 'volume type "fancyNewType" is not supported on this node' in err.message
    err = await setup_error(vm, make_pod([{"name": "huge", "emptyDir": {"medium": "HugePages-2Mi"}}]))
    assert 'emptyDir medium "HugePages-2Mi" is not supported' in err.message


async def test_every_failing_volume_is_reported_and_the_others_are_made(cp, tmp_path):
    vm = manager(cp, tmp_path)
    pod = make_pod([{"name": "a", "configMap": {"name": "a"}}, {"name": "ok", "emptyDir": {}},
                    {"name": "b", "secret": {"secretName": "b"}}])
    err = await setup_error(vm, pod)
    assert [e.volume for e in err.errors] == ["a", "b"]
    assert Path(vm.known(pod["metadata"]["uid"]).path("ok")).is_dir()


# -- mounts and subPath ---------------------------------------------------------------------


async def test_sub_paths_are_created_inside_the_volume_and_expanded_from_the_env(cp, tmp_path):
    vm = manager(cp, tmp_path)
    mounts = [
        {"name": "work", "mountPath": "/logs", "subPath": "logs/main"},
        {"name": "work", "mountPath": "/etc/app.conf", "subPath": "app.conf", "readOnly": True},
        {"name": "work", "mountPath": "/per-pod", "subPathExpr": "pods/$(POD_NAME)"},
        {"name": "work", "mountPath": "relative"},
    ]
    pod = make_pod([{"name": "work", "emptyDir": {}}], mounts)
    vols = await vm.setup(pod)
    root = Path(vols.path("work"))
    (root / "app.conf").write_text("x=1")
    got = vm.mounts(pod, pod["spec"]["containers"][0], vols, {"POD_NAME": "web-0"})
    assert got == [Mount(str(root / "logs" / "main"), "/logs", False),
                   Mount(str(root / "app.conf"), "/etc/app.conf", True),
                   Mount(str(root / "pods" / "web-0"), "/per-pod", False),
                   Mount(str(root), "/relative", False)]
    # Created with the volume root's own mode.
    assert mode_of(root / "logs") == 0o777 and mode_of(root / "logs" / "main") == 0o777

    with pytest.raises(VolumeError) as exc:
        vm.mounts(pod, pod["spec"]["containers"][0], vols, {})
    assert exc.value.message == "missing value for POD_NAME"
    assert exc.value.reason == "CreateContainerConfigError"


@pytest.mark.parametrize(("sub_path", "message"), [
    ("/etc", "error SubPath `/etc` must not be an absolute path"),
    ("a/../../etc", "unable to provision SubPath `a/../../etc`: must not contain '..'"),
    ("..", "unable to provision SubPath `..`: must not contain '..'"),
    ("evil", 'failed to prepare subPath for volumeMount "work" of container "main"'),
    ("evil/passwd", 'failed to prepare subPath for volumeMount "work" of container "main"'),
    ("evil/newdir", 'failed to create subPath directory for volumeMount "work" of container "main"'),
    ("inner/up", 'failed to prepare subPath for volumeMount "work" of container "main"'),
])
async def test_sub_paths_that_escape_the_volume_are_refused(cp, tmp_path, sub_path, message):
    vm = manager(cp, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "passwd").write_text("root:x:0:0")
    pod = make_pod([{"name": "work", "emptyDir": {}}], [{"name": "work", "mountPath": "/w", "subPath": sub_path}])
    vols = await vm.setup(pod)
    root = Path(vols.path("work"))
    # What a container could have written into its volume beforehand.
    os.symlink(str(outside), root / "evil")
    (root / "inner").mkdir()
    os.symlink("../../../../../../outside", root / "inner" / "up")
    with pytest.raises(VolumeError) as exc:
        vm.mounts(pod, pod["spec"]["containers"][0], vols)
    assert exc.value.message == message
    assert not (outside / "newdir").exists()


async def test_a_mount_of_a_volume_the_pod_does_not_have(cp, tmp_path):
    vm = manager(cp, tmp_path)
    pod = make_pod([{"name": "work", "emptyDir": {}}], [{"name": "other", "mountPath": "/o"}])
    vols = await vm.setup(pod)
    with pytest.raises(VolumeError) as exc:
        vm.mounts(pod, pod["spec"]["containers"][0], vols)
    assert exc.value.message == 'cannot find volume "other" to mount into container "main"'


@pytest.mark.parametrize("can_mount", [pytest.param(True, marks=needs_root), False], ids=["tmpfs", "no-mounts"])
async def test_a_sub_path_of_a_config_map_or_secret_keeps_the_version_the_container_started_with(
        cp, tmp_path, can_mount):
    await put(cp, "ConfigMap", "app-config", data={"app.conf": "v1", "nested": "n1"})
    await put(cp, "Secret", "db", data={"pw": b64("p1")})
    vm = manager(cp, tmp_path, can_mount=can_mount)
    items = [{"key": "app.conf", "path": "app.conf"}, {"key": "nested", "path": "dir/nested"}]
    mounts = [{"name": "cfg", "mountPath": "/etc/app.conf", "subPath": "app.conf"},
              {"name": "cfg", "mountPath": "/etc/dir", "subPath": "dir"},
              {"name": "cfg", "mountPath": "/etc/cfg"},
              {"name": "creds", "mountPath": "/etc/pw", "subPath": "pw"}]
    pod = make_pod([{"name": "cfg", "configMap": {"name": "app-config", "items": items}},
                    {"name": "creds", "secret": {"secretName": "db"}}], mounts)
    container = pod["spec"]["containers"][0]
    vols = await vm.setup(pod)
    file_mount, dir_mount, whole, secret_mount = vm.mounts(pod, container, vols)
    assert Path(file_mount.host_path).read_text() == "v1"
    assert (Path(dir_mount.host_path) / "nested").read_text() == "n1"
    assert Path(secret_mount.host_path).read_text() == "p1"
    assert all(m.read_only for m in (file_mount, dir_mount, whole, secret_mount))
    await put(cp, "ConfigMap", "app-config", data={"app.conf": "v2", "nested": "n2"})
    await put(cp, "Secret", "db", data={"pw": b64("p2")})
    await vm.setup(pod)
    assert (Path(whole.host_path) / "app.conf").read_text() == "v2"
    assert Path(file_mount.host_path).read_text() == "v1"
    assert (Path(dir_mount.host_path) / "nested").read_text() == "n1"
    assert Path(secret_mount.host_path).read_text() == "p1"
    # A restarted container gets the current version.
    file_mount, dir_mount, _, secret_mount = vm.mounts(pod, container, vols)
    assert Path(file_mount.host_path).read_text() == "v2"
    assert (Path(dir_mount.host_path) / "nested").read_text() == "n2"
    assert Path(secret_mount.host_path).read_text() == "p2"
    await vm.teardown(pod["metadata"]["uid"])
    assert hostmount.mounts_under(tmp_path / "pods") == []
    assert not (tmp_path / "pods" / pod["metadata"]["uid"]).exists()


# -- fsGroup --------------------------------------------------------------------------------


@needs_root
async def test_fs_group_owns_the_volumes_that_support_it(cp, tmp_path):
    await put(cp, "ConfigMap", "app-config", data={"a": "1"})
    await put(cp, "Secret", "db", data={"pw": b64("x")})
    host = tmp_path / "host"
    host.mkdir()
    vm = manager(cp, tmp_path)
    pod = make_pod([{"name": "scratch", "emptyDir": {}},
                    {"name": "cfg", "configMap": {"name": "app-config"}},
                    {"name": "creds", "secret": {"secretName": "db", "defaultMode": 0o400}},
                    {"name": "host", "hostPath": {"path": str(host)}}],
                   security={"fsGroup": 2345})
    vols = await vm.setup(pod)
    scratch = os.stat(vols.path("scratch"))
    assert scratch.st_gid == 2345 and stat.S_IMODE(scratch.st_mode) == 0o2777
    cfg = Path(vols.path("cfg"))
    assert os.stat(cfg / "a").st_gid == 2345 and mode_of(cfg / "a") == 0o644
    data_dir = cfg / os.readlink(cfg / "..data")
    assert os.stat(data_dir).st_gid == 2345 and mode_of(data_dir) == 0o2755
    assert os.lstat(cfg / "a").st_gid == 2345  # the link itself
    creds = Path(vols.path("creds"))
    assert mode_of(creds / "pw") == 0o440 and os.stat(creds / "pw").st_gid == 2345
    # hostPath volumes are never re-owned.
    assert os.stat(host).st_gid == 0
    assert not vols.fs_group_skipped and not vols.notices
    # New content written by an update is owned too.
    await put(cp, "ConfigMap", "app-config", data={"a": "2", "b": "3"})
    await vm.setup(pod)
    assert os.stat(cfg / "b").st_gid == 2345


@needs_root
async def test_fs_group_on_a_local_volume_respects_on_root_mismatch(tmp_path):
    objects = Objects()
    local = tmp_path / "disk"
    local.mkdir()
    (local / "old").write_text("x")
    os.chmod(local / "old", 0o600)
    objects.add("persistentvolumeclaims", claim("fast", "local-1"))
    objects.add("persistentvolumes", volume("local-1", "fast", local={"path": str(local)}))
    vm = manager(None, tmp_path, get_object=objects.get)
    volumes = [{"name": "fast", "persistentVolumeClaim": {"claimName": "fast"}}]
    pod = make_pod(volumes, security={"fsGroup": 4000, "fsGroupChangePolicy": "OnRootMismatch"})
    await vm.setup(pod)
    assert os.stat(local).st_gid == 4000 and mode_of(local) & 0o2070 == 0o2070
    assert os.stat(local / "old").st_gid == 4000 and mode_of(local / "old") == 0o660
    # The root is right already: a new pod with OnRootMismatch does not walk the volume.
    (local / "newer").write_text("y")
    os.chown(local / "newer", 0, 0)  # the setgid directory gave it the group already
    os.chmod(local / "newer", 0o600)
    await vm.setup(make_pod(volumes, security={"fsGroup": 4000, "fsGroupChangePolicy": "OnRootMismatch"}))
    assert os.stat(local / "newer").st_gid == 0 and mode_of(local / "newer") == 0o600
    # Without the policy (Always) every pod walks it.
    await vm.setup(make_pod(volumes, security={"fsGroup": 4000}))
    assert os.stat(local / "newer").st_gid == 4000 and mode_of(local / "newer") == 0o660


async def test_fs_group_is_skipped_and_reported_when_the_agent_may_not_chown(cp, tmp_path):
    vm = manager(cp, tmp_path, can_chown=False)
    pod = make_pod([{"name": "scratch", "emptyDir": {}}], security={"fsGroup": 2345})
    vols = await vm.setup(pod)
    assert os.stat(vols.path("scratch")).st_gid == os.getegid()
    assert vols.fs_group_skipped
    assert vols.notices == ['fsGroup 2345 was not applied to volume(s) "scratch": the agent may not change file '
                            "ownership (it needs root or CAP_CHOWN)"]
    # The same on every sync, so the agent can tell it once and keep the condition.
    again = await vm.setup(pod)
    assert again.fs_group_skipped and again.notices == vols.notices


# -- teardown and orphans -------------------------------------------------------------------


@needs_root
async def test_teardown_unmounts_and_removes_everything_but_host_data(cp, tmp_path):
    await put(cp, "ConfigMap", "app-config", data={"a": "1"})
    await put(cp, "Secret", "db", data={"pw": b64("x")})
    host = tmp_path / "host"
    host.mkdir()
    (host / "precious").write_text("data")
    vm = manager(cp, tmp_path, can_mount=True)
    pod = make_pod([{"name": "fast", "emptyDir": {"medium": "Memory", "sizeLimit": "4Mi"}},
                    {"name": "scratch", "emptyDir": {}},
                    {"name": "cfg", "configMap": {"name": "app-config"}},
                    {"name": "creds", "secret": {"secretName": "db"}},
                    {"name": "host", "hostPath": {"path": str(host)}}],
                   [{"name": "cfg", "mountPath": "/one", "subPath": "a"}])
    vols = await vm.setup(pod)
    vm.mounts(pod, pod["spec"]["containers"][0], vols)
    uid = pod["metadata"]["uid"]
    pod_dir = tmp_path / "pods" / uid
    assert len(hostmount.mounts_under(pod_dir)) == 2
    (Path(vols.path("scratch")) / "x").write_text("x")
    await vm.teardown(uid)
    assert hostmount.mounts_under(tmp_path / "pods") == []
    assert not pod_dir.exists()
    assert (host / "precious").read_text() == "data"
    # Again: nothing left to do, no error.
    await vm.teardown(uid)


@needs_root
async def test_cleanup_orphans_after_a_restart(cp, tmp_path):
    await put(cp, "Secret", "db", data={"pw": b64("x")})
    first = manager(cp, tmp_path, can_mount=True)
    live = make_pod([{"name": "creds", "secret": {"secretName": "db"}}], name="live")
    gone = make_pod([{"name": "creds", "secret": {"secretName": "db"}},
                     {"name": "fast", "emptyDir": {"medium": "Memory"}}], name="gone")
    gone_shm = make_pod([{"name": "fast", "emptyDir": {"medium": "Memory"}}], name="gone-shm")
    live_vols = await first.setup(live)
    await first.setup(gone)
    await manager(cp, tmp_path, can_mount=False).setup(gone_shm)
    other = tmp_path / "pods" / "not-a-pod-dir"
    other.mkdir()
    (other / "file").write_text("x")

    restarted = manager(cp, tmp_path, can_mount=True)
    await restarted.cleanup_orphans({live["metadata"]["uid"]})
    assert not (tmp_path / "pods" / gone["metadata"]["uid"]).exists()
    assert not (tmp_path / "shm" / NODE / gone_shm["metadata"]["uid"]).exists()
    assert (Path(live_vols.path("creds")) / "pw").read_text() == "x"
    assert is_tmpfs(live_vols.path("creds"))
    assert (other / "file").exists()
    assert [p for p, _ in hostmount.mounts_under(tmp_path / "pods")] == [os.path.realpath(live_vols.path("creds"))]
    # The restarted manager picks the live pod up where the first left it.
    again = await restarted.setup(live)
    assert (Path(again.path("creds")) / "pw").read_text() == "x"
    assert len(hostmount.mounts_under(tmp_path / "pods")) == 1


async def test_mounts_of_every_type_carry_the_volumes_read_only_rule(cp, tmp_path):
    await put(cp, "ConfigMap", "app-config", data={"a": "1"})
    await put(cp, "Secret", "db", data={"pw": b64("x")})
    host = tmp_path / "host"
    host.mkdir()
    clock = FakeClock()
    vm = manager(cp, tmp_path, clock=clock, token_source=Tokens(clock))
    volumes = [{"name": "scratch", "emptyDir": {}},
               {"name": "cfg", "configMap": {"name": "app-config"}},
               {"name": "creds", "secret": {"secretName": "db"}},
               {"name": "info", "downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}},
               {"name": "sa", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
               {"name": "host", "hostPath": {"path": str(host), "type": "Directory"}}]
    mounts = [{"name": v["name"], "mountPath": f"/mnt/{v['name']}"} for v in volumes]
    mounts.append({"name": "host", "mountPath": "/ro-host", "readOnly": True})
    pod = make_pod(volumes, mounts)
    vols = await vm.setup(pod)
    got = {m.container_path: m for m in vm.mounts(pod, pod["spec"]["containers"][0], vols)}
    assert {p: m.read_only for p, m in got.items()} == {
        "/mnt/scratch": False, "/mnt/cfg": True, "/mnt/creds": True, "/mnt/info": True, "/mnt/sa": True,
        "/mnt/host": False, "/ro-host": True}
    assert got["/mnt/host"].host_path == str(host)
    assert (Path(got["/mnt/info"].host_path) / "n").read_text() == "web"
    assert (Path(got["/mnt/sa"].host_path) / "token").read_text() == "token-1"
    assert (Path(got["/mnt/creds"].host_path) / "pw").read_text() == "x"
