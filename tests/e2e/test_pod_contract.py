"""The pod contract on a real node: `gpufleet up` with its local agent on podman (the
default where podman can run containers), driven through the API as a user would.

- Two replicas with the same fixed containerPort both become Ready (each pod has a network
  namespace and an IP of its own) and serve through their Service's Endpoints, the gateway
  and the API server's services/pods proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufleet.client.api import Client
from gpufleet.client.kubeconfig import transport_from_kubeconfig

pytestmark = pytest.mark.e2e

BUSYBOX = "localhost/gpufleet/busybox:1"
_API = re.compile(r"API server listening on (\S+)")
_GATEWAY = re.compile(r"Gateway listening on (\S+)")


@dataclass
class Plane:
    url: str
    gateway: str
    kubeconfig: Path
    state: Path
    log: Path
    proc: subprocess.Popen

    def client(self) -> Client:
        return Client(transport_from_kubeconfig(str(self.kubeconfig)))

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), *args], input=input,
                              capture_output=True, text=True, timeout=60)


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


@contextlib.contextmanager
def running_plane(root: Path, *extra: str) -> Iterator[Plane]:
    """`gpufleet up` with its local agent, in `root`; stopped (SIGINT) at the end."""
    state = root / "state"
    log_path = root / "up.log"
    env = dict(os.environ, HOME=str(root), PYTHONUNBUFFERED="1")
    env.pop("KUBECONFIG", None)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.cli.main", "up", "--state-dir", str(state), "--port", "0",
             "--gateway-port", "0", "--gpus", "4", *extra],
            stdout=subprocess.PIPE, stderr=log, text=True, env=env, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    url = gateway = None
    deadline = time.monotonic() + 60
    try:
        while url is None:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                line = ""
            if line is None or time.monotonic() > deadline:
                pytest.fail(f"gpufleet up did not start\n{log_path.read_text()[-4000:]}")
            if m := _GATEWAY.search(line or ""):
                gateway = m.group(1)
            if m := _API.search(line or ""):
                url = m.group(1)
        assert gateway, log_path.read_text()
        yield Plane(url, gateway, state / "kubeconfig", state, log_path, proc)
    finally:
        _stop(Plane(url or "", gateway or "", state / "kubeconfig", state, log_path, proc))


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with running_plane(tmp_path_factory.mktemp("contract")) as p:
        yield p


def _stop(plane: Plane) -> None:
    """Stop the server: `gpufleet up` stops its local node's pods as it goes."""
    plane.proc.send_signal(2)
    try:
        plane.proc.wait(60)
    except subprocess.TimeoutExpired:
        plane.proc.kill()


def agent_containers(state: Path, namespace: str | None = None) -> list[str]:
    """The containers (sandboxes included) the local agent of the cluster in `state` runs."""
    import hashlib

    owner = hashlib.sha256(str((state / "agent").resolve()).encode()).hexdigest()[:12]
    args = ["podman", "ps", "-a", "-q", "--filter", f"label=gpufleet.io/owner={owner}"]
    if namespace:
        args += ["--filter", f"label=gpufleet.io/namespace={namespace}"]
    return subprocess.run(args, capture_output=True, text=True, check=False).stdout.split()


async def namespace(client: Client, name: str) -> str:
    await client.create({"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": name, "labels": {"gpufleet-test": "contract"}}}, raw=True)
    return name


async def wait_until(check, limit: float, what: str, plane: Plane):
    deadline = time.monotonic() + limit
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {limit}s waiting for {what}\n{plane.log.read_text()[-3000:]}")
        await asyncio.sleep(0.3)


def ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


async def test_two_replicas_with_one_fixed_port_serve_through_their_service_and_the_gateway(plane: Plane):
    client = plane.client()
    try:
        ns = await namespace(client, "fixed-port")
        # busybox httpd answers with the file it is asked for: each replica serves its own name.
        script = "mkdir -p /tmp/www && hostname > /tmp/www/index.html && exec httpd -f -p 8000 -h /tmp/www"
        await client.create({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": ns},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{
                         "name": "web", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                         "command": ["sh", "-c", script],
                         "ports": [{"name": "http", "containerPort": 8000}],
                         "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}}]}}},
        }, ns, raw=True)
        await client.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns},
                             "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]}},
                            ns, raw=True)

        async def both_ready():
            pods = await client.list("Pod", ns, label_selector={"app": "web"}, raw=True)
            return pods if len(pods) == 2 and all(ready(p) for p in pods) else None

        pods = list(await wait_until(both_ready, 90, "both replicas Ready", plane))
        ips = {p["status"]["podIP"] for p in pods}
        assert len(ips) == 2 and pods[0]["status"]["hostIP"] not in ips, [p["status"] for p in pods]
        names = {p["metadata"]["name"] for p in pods}
        assert {(await asyncio.to_thread(_get, f"http://{ip}:8000/")).strip() for ip in ips} == names

        async def endpoints():
            ep = await client.get("Endpoints", "web", ns, raw=True)
            subsets = ep.get("subsets") or []
            got = {(a["ip"], s["ports"][0]["port"]) for s in subsets for a in s.get("addresses") or []}
            return got if len(got) == 2 else None

        assert await wait_until(endpoints, 30, "the Service's two endpoints", plane) == {(ip, 8000) for ip in ips}
        seen = set()
        for _ in range(20):
            seen.add((await asyncio.to_thread(_get, f"{plane.gateway}/services/{ns}/web/")).strip())
            if seen == names:
                break
        assert seen == names, seen
        # The API server's proxy reaches the pods' own IPs (the node's pod network) through
        # the node's agent: services/web:80/proxy picks a Ready pod, pods/<name>:8000/proxy that one.
        got = await client.raw_request("GET", f"/api/v1/namespaces/{ns}/services/web:80/proxy/")
        assert got.body.decode().strip() in names
        for name in names:
            got = await client.raw_request("GET", f"/api/v1/namespaces/{ns}/pods/{name}:8000/proxy/")
            assert got.body.decode().strip() == name
    finally:
        await client.close()


def waiting_reason(pod: dict) -> tuple[str, str]:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        w = (cs.get("state") or {}).get("waiting")
        if w:
            return w.get("reason", ""), w.get("message", "")
    return "", ""


async def test_images_are_pulled_from_a_registry_with_the_pods_pull_secret(plane: Plane, oci_registry):
    client = plane.client()
    try:
        ns = await namespace(client, "pull")
        await client.create(oci_registry.pull_secret("regcred", ns), ns, raw=True)
        image = oci_registry.images["busybox"]
        # Nothing local by that name: the agent must really pull it, with the secret's credentials.
        await asyncio.to_thread(subprocess.run, ["podman", "rmi", "-f", image], capture_output=True, check=False)
        await client.create({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pulled", "namespace": ns},
            "spec": {"imagePullSecrets": [{"name": "regcred"}], "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": image, "imagePullPolicy": "Always",
                                     "command": ["sh", "-c", "echo pulled and running; sleep 3600"]}]},
        }, ns, raw=True)

        async def running():
            pod = await client.get("Pod", "pulled", ns, raw=True)
            return pod if (pod.get("status") or {}).get("phase") == "Running" else None

        pod = await wait_until(running, 90, "the pulled pod Running", plane)
        cs = pod["status"]["containerStatuses"][0]
        assert cs["imageID"].startswith(f"{oci_registry.address}/gpufleet/busybox@sha256:"), cs
        events = await client.list("Event", ns, field_selector="involvedObject.name=pulled", raw=True)
        messages = [(e["reason"], e["message"]) for e in events]
        assert ("Pulling", f'Pulling image "{image}"') in messages, messages
        assert any(r == "Pulled" and m.startswith(f'Successfully pulled image "{image}" in ') for r, m in messages)

        # Without the secret the registry refuses, and the pod says so with the registry's words.
        await client.create({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "no-creds", "namespace": ns},
            "spec": {"containers": [{"name": "main", "image": image, "imagePullPolicy": "Always",
                                     "command": ["true"]}]},
        }, ns, raw=True)

        async def refused():
            reason, message = waiting_reason(await client.get("Pod", "no-creds", ns, raw=True))
            return message if reason in ("ErrImagePull", "ImagePullBackOff") else None

        assert "unauthorized: authentication required" in await wait_until(refused, 60, "no-creds refused", plane)
    finally:
        await client.close()


async def test_a_wrong_image_is_errimagepull_then_imagepullbackoff_with_the_registrys_message(
        plane: Plane, oci_registry):
    client = plane.client()
    try:
        ns = await namespace(client, "wrong-image")
        await client.create(oci_registry.pull_secret("regcred", ns), ns, raw=True)
        image = oci_registry.ref("gpufleet/no-such-image:1")
        await client.create({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "typo", "namespace": ns},
            "spec": {"imagePullSecrets": [{"name": "regcred"}],
                     "containers": [{"name": "main", "image": image, "command": ["true"]}]},
        }, ns, raw=True)
        # Every status the agent wrote, in order, from a watch that saw the pod created.
        seen: list[tuple[str, str]] = []

        async def follow() -> None:
            async for ev in client.watch("Pod", ns, field_selector="metadata.name=typo", raw=True,
                                         timeout_seconds=60):
                got = waiting_reason(ev.object) if isinstance(ev.object, dict) else ("", "")
                if got[0] and (not seen or seen[-1][0] != got[0]):
                    seen.append(got)
                if got[0] == "ImagePullBackOff":
                    return

        await asyncio.wait_for(follow(), 70)
        # ErrImagePull first, with the registry's message; then the back-off, still saying why.
        pulls = [(r, m) for r, m in seen if r != "ContainerCreating"]
        assert [r for r, _ in pulls][:2] == ["ErrImagePull", "ImagePullBackOff"], seen
        assert "manifest unknown" in pulls[0][1], seen
        events = await client.list("Event", ns, field_selector="involvedObject.name=typo", raw=True)
        failed = [e["message"] for e in events if e["reason"] == "Failed"]
        assert any("manifest unknown" in m and image in m for m in failed), failed
        assert "Error: ErrImagePull" in failed and "Error: ImagePullBackOff" in failed, failed
        assert any(e["reason"] == "BackOff" and e["message"] == f'Back-off pulling image "{image}"' for e in events)
        reason, message = seen[-1]
        assert reason == "ImagePullBackOff" and "manifest unknown" in message, seen
        described = await asyncio.to_thread(plane.kubectl, "describe", "pod", "typo", "-n", ns)
        assert described.returncode == 0, described.stderr
        assert "ImagePullBackOff" in described.stdout and "manifest unknown" in described.stdout, described.stdout
    finally:
        await client.close()


def volume_pod(ns: str, name: str, image: str, *, claim: str | None = None, pull_policy: str = "IfNotPresent") -> dict:
    """Two containers sharing an emptyDir, reading a ConfigMap, a Secret and the downward
    API at their mountPaths, as a user other than root; with `claim`, a persistent volume too."""
    reader = ("while [ ! -f /scratch/shared ]; do sleep 0.1; done; "
              "echo cfg=$(cat /etc/cfg/greeting) sec=$(cat /etc/sec/password) name=$(cat /etc/info/name) "
              "shared=$(cat /scratch/shared) uid=$(id -u) gid=$(id -g) "
              "kept=$(cat /data/kept 2>/dev/null || echo none); "
              "[ -d /data ] && echo $HOSTNAME > /data/kept; echo done; sleep 3600")
    mounts = [{"name": "cfg", "mountPath": "/etc/cfg"}, {"name": "sec", "mountPath": "/etc/sec", "readOnly": True},
              {"name": "info", "mountPath": "/etc/info"}, {"name": "scratch", "mountPath": "/scratch"}]
    volumes = [{"name": "cfg", "configMap": {"name": "settings"}},
               {"name": "sec", "secret": {"secretName": "creds"}},
               {"name": "info", "downwardAPI": {"items": [{"path": "name",
                                                            "fieldRef": {"fieldPath": "metadata.name"}}]}},
               {"name": "scratch", "emptyDir": {}}]
    if claim:
        mounts.append({"name": "data", "mountPath": "/data"})
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": claim}})
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsUser": 1234, "runAsGroup": 1234, "fsGroup": 2000},
            "volumes": volumes,
            "containers": [
                {"name": "writer", "image": image, "imagePullPolicy": pull_policy,
                 "command": ["sh", "-c", "echo written-by-$(id -u) > /scratch/shared; sleep 3600"],
                 "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]},
                {"name": "reader", "image": image, "imagePullPolicy": pull_policy,
                 "command": ["sh", "-c", reader], "volumeMounts": mounts},
            ],
        },
    }


async def make_sources(client: Client, ns: str) -> None:
    await client.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": ns},
                         "data": {"greeting": "hello-config"}}, ns, raw=True)
    await client.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds", "namespace": ns},
                         "stringData": {"password": "s3cr3t"}}, ns, raw=True)


async def reader_says(plane: Plane, client: Client, ns: str, pod: str) -> str:
    async def said():
        out = await asyncio.to_thread(plane.kubectl, "logs", pod, "-n", ns, "-c", "reader")
        return out.stdout if "done" in out.stdout else None

    return await wait_until(said, 90, f"{pod}'s reader to report", plane)


async def test_volumes_and_the_user_of_a_pods_two_containers(plane: Plane):
    client = plane.client()
    try:
        ns = await namespace(client, "volumes")
        await make_sources(client, ns)
        await client.create(volume_pod(ns, "vols", BUSYBOX), ns, raw=True)
        line = await reader_says(plane, client, ns, "vols")
        assert "cfg=hello-config sec=s3cr3t name=vols shared=written-by-1234 uid=1234 gid=1234" in line, line
    finally:
        await client.close()


PYTHON = "localhost/gpufleet/python:3.11"
IN_CLUSTER = """
from kubernetes import client, config
config.load_incluster_config()
api = client.CoreV1Api()
print("own", sorted(p.metadata.name for p in api.list_namespaced_pod("{own}").items), flush=True)
try:
    api.list_namespaced_pod("{other}")
    print("other allowed", flush=True)
except client.ApiException as e:
    print("other", e.status, e.reason, flush=True)
"""


async def test_a_program_in_a_pod_calls_the_api_with_its_service_account(plane: Plane):
    client = plane.client()
    try:
        own = await namespace(client, "identity-a")
        other = await namespace(client, "identity-b")
        # As in Kubernetes, a service account may do nothing until a role says so.
        await client.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                             "metadata": {"name": "pod-reader", "namespace": own},
                             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]},
                            own, raw=True)
        await client.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                             "metadata": {"name": "default-reads-pods", "namespace": own},
                             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                         "name": "pod-reader"},
                             "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": own}]},
                            own, raw=True)

        async def default_sa():
            try:
                return await client.get("ServiceAccount", "default", own, raw=True)
            except Exception:
                return None

        await wait_until(default_sa, 30, "the default service account", plane)
        await client.create({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "caller", "namespace": own},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": PYTHON, "imagePullPolicy": "IfNotPresent",
                "command": ["python", "-c", IN_CLUSTER.format(own=own, other=other)]}]},
        }, own, raw=True)

        async def finished():
            pod = await client.get("Pod", "caller", own, raw=True)
            return pod if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None

        pod = await wait_until(finished, 90, "the caller pod to finish", plane)
        out = (await asyncio.to_thread(plane.kubectl, "logs", "caller", "-n", own)).stdout
        assert pod["status"]["phase"] == "Succeeded", out
        assert "own ['caller']" in out and "other 403 Forbidden" in out, out
        env = {e["name"] for c in pod["spec"]["containers"] for e in c.get("env") or []}
        assert "KUBERNETES_SERVICE_HOST" not in env  # the agent adds it; the spec stays the user's
    finally:
        await client.close()


async def test_a_local_path_claim_keeps_its_files_across_the_pod_being_recreated(plane: Plane):
    client = plane.client()
    try:
        ns = await namespace(client, "claims")
        await make_sources(client, ns)
        # The default class, local-path: provisioned on the node the first pod lands on.
        await client.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                             "metadata": {"name": "data", "namespace": ns},
                             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}},
                            ns, raw=True)
        await client.create(volume_pod(ns, "keeper", BUSYBOX, claim="data"), ns, raw=True)
        first = await reader_says(plane, client, ns, "keeper")
        assert "kept=none" in first and "uid=1234" in first, first
        claim = await client.get("PersistentVolumeClaim", "data", ns, raw=True)
        assert claim["status"]["phase"] == "Bound" and claim["spec"]["storageClassName"] == "local-path", claim
        await client.delete("Pod", "keeper", ns, grace_period_seconds=1)

        async def gone():
            try:
                await client.get("Pod", "keeper", ns, raw=True)
            except Exception:
                return True
            return False

        await wait_until(gone, 60, "the first pod gone", plane)
        await client.create(volume_pod(ns, "keeper", BUSYBOX, claim="data"), ns, raw=True)
        second = await reader_says(plane, client, ns, "keeper")
        assert "kept=keeper" in second, second
    finally:
        await client.close()


async def test_gpufleet_up_stops_its_pods_as_it_stops_and_leaves_another_clusters_alone(plane: Plane, tmp_path):
    client = plane.client()
    try:
        ns = await namespace(client, "survivor")
        await client.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stays", "namespace": ns},
                             "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                                 "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                                 "command": ["sleep", "3600"]}]}}, ns, raw=True)

        async def running():
            pod = await client.get("Pod", "stays", ns, raw=True)
            return (pod.get("status") or {}).get("phase") == "Running"

        await wait_until(running, 60, "the first cluster's pod running", plane)
        mine = set(await asyncio.to_thread(agent_containers, plane.state, ns))
        assert len(mine) == 2  # the container and its sandbox
        # A second cluster on this machine: its node has the same name, its containers are its own.
        with running_plane(tmp_path) as other:
            other_client = other.client()
            try:
                await other_client.create({"apiVersion": "v1", "kind": "Pod",
                                           "metadata": {"name": "brief", "namespace": "default"},
                                           "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                                               "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                                               "command": ["sleep", "3600"]}]}}, "default", raw=True)

                async def other_running():
                    pod = await other_client.get("Pod", "brief", "default", raw=True)
                    return (pod.get("status") or {}).get("phase") == "Running"

                await wait_until(other_running, 60, "the second cluster's pod running", other)
                theirs = set(await asyncio.to_thread(agent_containers, other.state))
                assert len(theirs) == 2 and not theirs & mine
            finally:
                await other_client.close()
        # Stopped, the second cluster took its pods with it and left the first one's running.
        assert await asyncio.to_thread(agent_containers, other.state) == []
        assert set(await asyncio.to_thread(agent_containers, plane.state, ns)) == mine
        assert await running()
    finally:
        await client.close()


async def test_a_missing_config_map_holds_the_pod_and_updates_reach_it_and_dev_shm_is_sized(plane: Plane):
    client = plane.client()
    try:
        ns = await namespace(client, "updates")
        script = ("df -k /dev/shm | tail -1 | awk '{print \"shm=\" $2}'; "
                  "while :; do echo mode=$(cat /etc/cfg/mode); sleep 0.5; done")
        await client.create({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "watcher", "namespace": ns},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "volumes": [{"name": "cfg", "configMap": {"name": "live"}},
                                 {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "256Mi"}}],
                     "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                                     "command": ["sh", "-c", script],
                                     "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"},
                                                      {"name": "shm", "mountPath": "/dev/shm"}]}]},
        }, ns, raw=True)

        async def failed_mount():
            events = await client.list("Event", ns, field_selector="involvedObject.name=watcher", raw=True)
            return [e["message"] for e in events if e["reason"] == "FailedMount"]

        messages = await wait_until(failed_mount, 30, "FailedMount for the missing config map", plane)
        assert 'MountVolume.SetUp failed for volume "cfg" : configmap "live" not found' in messages, messages
        pod = await client.get("Pod", "watcher", ns, raw=True)
        assert pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"

        await client.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "live", "namespace": ns},
                             "data": {"mode": "first"}}, ns, raw=True)

        async def says(text: str):
            out = await asyncio.to_thread(plane.kubectl, "logs", "watcher", "-n", ns)
            return out.stdout if text in out.stdout else None

        first = await wait_until(lambda: says("mode=first"), 60, "the pod to start with the config map", plane)
        # The pod's /dev/shm is the memory-backed emptyDir's size (NCCL wants more than 64 MiB).
        assert "shm=262144" in first, first
        await client.patch("ConfigMap", "live", {"data": {"mode": "second"}}, ns, raw=True)
        # The kubelet's sync period is a minute; the agent's is ten seconds.
        await wait_until(lambda: says("mode=second"), 40, "the update to reach the running pod", plane)
    finally:
        await client.close()
