"""StatefulSets and DaemonSets on a real node, driven with the real kubectl: `gpufleet up` with
its local agent on the process runtime (the fastest that runs real programs).

- A StatefulSet of three with volumeClaimTemplates: pods db-0, db-1, db-2 created in order,
  each after the one before is Running and Ready (seen on a watch opened before the apply);
  a claim data-db-<n> for each, bound by the local-path provisioner; every pod deleted comes
  back under its own name and reads back what it wrote to its own volume.
- A rolling update with a partition replaces only the ordinals at or above it;
  `kubectl rollout status/history/undo` and `kubectl scale` work on the set; scaled away,
  a replica's claim stays.
- A DaemonSet runs one pod on the node; `kubectl rollout restart` and `rollout status` roll it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
from e2e_helpers import columns, table
from test_pod_contract import Plane, running_plane, wait_until

from gpufleet.client.errors import NotFound

pytestmark = pytest.mark.e2e

NS = "stateful"
SCRIPT = ("echo kept=$(cat /data/ordinal 2>/dev/null || echo none) mode=${MODE:-v1}; "
          "echo $ORDINAL > /data/ordinal; echo done; exec sleep 3600")
MANIFEST = f"""apiVersion: v1
kind: Service
metadata: {{name: db, namespace: {NS}}}
spec:
  clusterIP: None
  selector: {{app: db}}
  ports: [{{port: 5432}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: db, namespace: {NS}}}
spec:
  replicas: 3
  serviceName: db
  selector: {{matchLabels: {{app: db}}}}
  template:
    metadata: {{labels: {{app: db}}}}
    spec:
      terminationGracePeriodSeconds: 1
      securityContext: {{runAsUser: 1234, runAsGroup: 1234, fsGroup: 2000}}
      containers:
      - name: db
        image: localhost/gpufleet/busybox:1
        command: [sh, -c, "{SCRIPT}"]
        env:
        - name: ORDINAL
          valueFrom: {{fieldRef: {{fieldPath: "metadata.labels['apps.kubernetes.io/pod-index']"}}}}
        volumeMounts: [{{name: data, mountPath: /data}}]
  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {{requests: {{storage: 1Gi}}}}
"""


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with running_plane(tmp_path_factory.mktemp("sets"), "--runtime", "process") as p:
        yield p


def kubectl(plane: Plane, *args: str, input: str | None = None) -> str:
    out = plane.kubectl(*args, input=input)
    assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out.stdout


async def akubectl(plane: Plane, *args: str, input: str | None = None) -> str:
    return await asyncio.to_thread(kubectl, plane, *args, input=input)


def ready(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions") or [])


async def said(plane: Plane, pod: str, uid: str | None = None) -> str:
    """The pod's first log line once it wrote it (for the pod of ``uid`` when given)."""
    client = plane.client()
    try:
        async def line():
            try:
                p = await client.get("Pod", pod, NS, raw=True)
            except NotFound:
                return None
            if uid is not None and p["metadata"]["uid"] == uid:
                return None
            out = await asyncio.to_thread(plane.kubectl, "logs", pod, "-n", NS)
            return out.stdout.splitlines()[0] if "done" in out.stdout else None

        return await wait_until(line, 60, f"{pod} to write its line", plane)
    finally:
        await client.close()


async def test_statefulset_pods_come_in_order_and_keep_their_volumes(plane: Plane):
    client = plane.client()
    try:
        await akubectl(plane, "create", "namespace", NS)
        events: list[tuple[str, str, bool]] = []
        watching = asyncio.Event()

        async def watch() -> None:
            async for ev in client.watch("Pod", NS, raw=True, resource_version="0"):
                watching.set()
                events.append((ev.type, ev.object["metadata"]["name"], ready(ev.object)))

        task = asyncio.create_task(watch())
        await asyncio.sleep(0)  # the watch is opened before the set exists
        out = await akubectl(plane, "apply", "-f", "-", input=MANIFEST)
        assert "statefulset.apps/db created" in out, out
        status = await akubectl(plane, "rollout", "status", "statefulset/db", "-n", NS, "--timeout=90s")
        # The partition is defaulted to 0, so kubectl speaks of a partitioned rollout, as with Kubernetes.
        assert status.splitlines()[-1] == "partitioned roll out complete: 3 new pods have been updated...", status
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

        added = [name for kind, name, _ in events if kind == "ADDED"]
        assert added == ["db-0", "db-1", "db-2"], events
        for i in (1, 2):
            created_at = events.index(("ADDED", f"db-{i}", False))
            before = [name for _, name, is_ready in events[:created_at] if is_ready]
            assert f"db-{i - 1}" in before, f"db-{i} created before db-{i - 1} was ready: {events}"

        # Kubernetes' columns.
        sts = await akubectl(plane, "get", "sts", "-n", NS)
        assert columns(sts.splitlines()[0]) == ["NAME", "READY", "AGE"]
        assert table(sts)[0]["READY"] == "3/3"
        wide = await akubectl(plane, "get", "sts", "-n", NS, "-o", "wide")
        assert columns(wide.splitlines()[0]) == ["NAME", "READY", "AGE", "CONTAINERS", "IMAGES"]
        pvc = table(await akubectl(plane, "get", "pvc", "-n", NS))
        assert sorted((r["NAME"], r["STATUS"]) for r in pvc) == [
            ("data-db-0", "Bound"), ("data-db-1", "Bound"), ("data-db-2", "Bound")]
        pod = await client.get("Pod", "db-1", NS, raw=True)
        assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("db-1", "db")
        described = await akubectl(plane, "describe", "sts", "db", "-n", NS)
        for line in ("Replicas:           3 desired | 3 total", "Update Strategy:    RollingUpdate",
                     "Pods Status:        3 Running / 0 Waiting / 0 Succeeded / 0 Failed", "Volume Claims:"):
            assert line in described, described
        # The official client reads the set and its revisions.
        official = await asyncio.to_thread(_official_view, str(plane.kubeconfig))
        assert official == (3, "db", 1), official

        first = {f"db-{i}": await said(plane, f"db-{i}") for i in range(3)}
        assert all(line.startswith("kept=none") for line in first.values()), first

        # Every pod deleted comes back with its own name and its own volume.
        uids = {f"db-{i}": (await client.get("Pod", f"db-{i}", NS, raw=True))["metadata"]["uid"] for i in range(3)}
        await akubectl(plane, "delete", "pod", "db-0", "db-1", "db-2", "-n", NS, "--wait=false")
        again = {name: await said(plane, name, uid) for name, uid in uids.items()}
        assert again == {f"db-{i}": f"kept={i} mode=v1" for i in range(3)}, again
    finally:
        await client.close()


async def test_partitioned_rolling_update_history_undo_and_scale(plane: Plane):
    client = plane.client()
    try:
        await akubectl(plane, "patch", "statefulset", "db", "-n", NS, "-p",
                       '{"spec":{"updateStrategy":{"rollingUpdate":{"partition":2}}}}')
        before = (await client.get("StatefulSet", "db", NS, raw=True))["status"]["currentRevision"]
        uids = {f"db-{i}": (await client.get("Pod", f"db-{i}", NS, raw=True))["metadata"]["uid"] for i in range(3)}
        await akubectl(plane, "set", "env", "statefulset/db", "-n", NS, "MODE=v2")
        status = await akubectl(plane, "rollout", "status", "statefulset/db", "-n", NS, "--timeout=60s")
        assert "partitioned roll out complete: 1 new pods have been updated..." in status, status
        assert await said(plane, "db-2", uids["db-2"]) == "kept=2 mode=v2"
        for name in ("db-0", "db-1"):  # below the partition: untouched
            pod = await client.get("Pod", name, NS, raw=True)
            assert pod["metadata"]["uid"] == uids[name]
            assert pod["metadata"]["labels"]["controller-revision-hash"] == before

        history = await akubectl(plane, "rollout", "history", "statefulset/db", "-n", NS)
        assert [r["REVISION"] for r in table(history.split("\n", 1)[1])] == ["1", "2"], history
        revs = table(await akubectl(plane, "get", "controllerrevisions", "-n", NS))
        assert sorted((r["CONTROLLER"], r["REVISION"]) for r in revs) == [
            ("statefulset.apps/db", "1"), ("statefulset.apps/db", "2")]

        # Undo goes back to revision 1's template, which becomes revision 3.
        new_uid = (await client.get("Pod", "db-2", NS, raw=True))["metadata"]["uid"]
        out = await akubectl(plane, "rollout", "undo", "statefulset/db", "-n", NS)
        assert "statefulset.apps/db rolled back" in out, out
        assert await said(plane, "db-2", new_uid) == "kept=2 mode=v1"
        history = await akubectl(plane, "rollout", "history", "statefulset/db", "-n", NS)
        assert [r["REVISION"] for r in table(history.split("\n", 1)[1])] == ["2", "3"], history

        # Scaled to one: db-2 then db-1 go (highest first); their claims stay.
        out = await akubectl(plane, "scale", "statefulset", "db", "-n", NS, "--replicas=1")
        assert "statefulset.apps/db scaled" in out

        async def one_left():
            pods = [p["metadata"]["name"] for p in await client.list("Pod", NS, raw=True)]
            return pods == ["db-0"]

        await wait_until(one_left, 60, "scale down to db-0", plane)
        claims = sorted(c["metadata"]["name"] for c in await client.list("PersistentVolumeClaim", NS, raw=True))
        assert claims == ["data-db-0", "data-db-1", "data-db-2"]
        assert table(await akubectl(plane, "get", "sts", "db", "-n", NS))[0]["READY"] == "1/1"
    finally:
        await client.close()


def _official_view(kubeconfig: str) -> tuple[int, str, int]:
    from kubernetes import client, config

    api = client.AppsV1Api(config.new_client_from_config(config_file=kubeconfig))
    sts = api.read_namespaced_stateful_set("db", NS)
    revisions = api.list_namespaced_controller_revision(NS).items
    return sts.status.ready_replicas, sts.spec.service_name, len(revisions)


DAEMONSET = f"""apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: node-agent, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: node-agent}}}}
  template:
    metadata: {{labels: {{app: node-agent}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: agent
        image: localhost/gpufleet/busybox:1
        command: [sh, -c, "echo on $NODE; exec sleep 3600"]
        env:
        - name: NODE
          valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}
"""


async def test_daemonset_runs_on_the_node_and_rolls_with_restart(plane: Plane):
    client = plane.client()
    try:
        out = await akubectl(plane, "apply", "-f", "-", input=DAEMONSET)
        assert "daemonset.apps/node-agent created" in out, out
        status = await akubectl(plane, "rollout", "status", "daemonset/node-agent", "-n", NS, "--timeout=60s")
        assert 'daemon set "node-agent" successfully rolled out' in status, status
        ds = await akubectl(plane, "get", "ds", "-n", NS)
        assert columns(ds.splitlines()[0]) == ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE",
                                               "NODE SELECTOR", "AGE"]
        row = table(ds)[0]
        assert [row[k] for k in ("DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "NODE SELECTOR")] == [
            "1", "1", "1", "1", "1", "<none>"]
        nodes = [n["metadata"]["name"] for n in await client.list("Node", raw=True)]
        pods = [p for p in await client.list("Pod", NS, label_selector="app=node-agent", raw=True)]
        assert [p["spec"]["nodeName"] for p in pods] == nodes
        first_uid = pods[0]["metadata"]["uid"]
        described = await akubectl(plane, "describe", "ds", "node-agent", "-n", NS)
        assert "Desired Number of Nodes Scheduled: 1" in described, described

        out = await akubectl(plane, "rollout", "restart", "daemonset/node-agent", "-n", NS)
        assert "daemonset.apps/node-agent restarted" in out, out
        status = await akubectl(plane, "rollout", "status", "daemonset/node-agent", "-n", NS, "--timeout=60s")
        assert 'daemon set "node-agent" successfully rolled out' in status, status
        pods = [p for p in await client.list("Pod", NS, label_selector="app=node-agent", raw=True)
                if not p["metadata"].get("deletionTimestamp")]
        assert len(pods) == 1 and pods[0]["metadata"]["uid"] != first_uid
        assert "kubectl.kubernetes.io/restartedAt" in pods[0]["metadata"]["annotations"]
        history = await akubectl(plane, "rollout", "history", "daemonset/node-agent", "-n", NS)
        assert [r["REVISION"] for r in table(history.split("\n", 1)[1])] == ["1", "2"], history

        # Bad input is refused with Kubernetes' words, naming the field.
        bad = MANIFEST.split("---\n")[1].replace("name: db,", "name: bad,").replace(
            "replicas: 3", "replicas: 3\n  podManagementPolicy: Random")
        out = await asyncio.to_thread(plane.kubectl, "apply", "-f", "-", input=bad)
        assert out.returncode == 1 and out.stderr.strip() == (
            'The StatefulSet "bad" is invalid: spec.podManagementPolicy: Unsupported value: "Random": '
            'supported values: "OrderedReady", "Parallel"'), out.stderr
    finally:
        await client.close()
