"""`gpufleet export`: from a control plane running its controllers (so Deployments have
ReplicaSets and Pods, the PyTorchJob its pods, Service and PodGroup, the queued job its
Kueue Workload), the export holds exactly the objects the user applied, each a valid
Kubernetes object by the official `kubernetes` client's models, and applying it to a fresh
cluster gives back the same objects."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient
from typer.testing import CliRunner, Result

from gpufleet.api.registry import REGISTRY
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.cli.main import app
from gpufleet.export import build, clean, exported

NS = "ml"
MANIFESTS = textwrap.dedent(f"""\
    apiVersion: v1
    kind: Namespace
    metadata: {{name: {NS}}}
    ---
    apiVersion: v1
    kind: ResourceQuota
    metadata: {{name: gpus, namespace: {NS}}}
    spec:
      hard: {{requests.nvidia.com/gpu: "8"}}
    ---
    apiVersion: rbac.authorization.k8s.io/v1
    kind: Role
    metadata: {{name: trainer, namespace: {NS}}}
    rules:
      - apiGroups: [kubeflow.org]
        resources: [pytorchjobs]
        verbs: [get, list, create]
    ---
    apiVersion: rbac.authorization.k8s.io/v1
    kind: RoleBinding
    metadata: {{name: trainer, namespace: {NS}}}
    roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: trainer}}
    subjects:
      - {{kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}}
    ---
    apiVersion: kueue.x-k8s.io/v1beta1
    kind: ResourceFlavor
    metadata: {{name: h100}}
    spec:
      nodeLabels: {{nvidia.com/gpu.product: H100-SXM-80GB}}
    ---
    apiVersion: kueue.x-k8s.io/v1beta1
    kind: ClusterQueue
    metadata: {{name: research}}
    spec:
      namespaceSelector: {{}}
      resourceGroups:
        - coveredResources: [nvidia.com/gpu]
          flavors:
            - name: h100
              resources: [{{name: nvidia.com/gpu, nominalQuota: 4}}]
    ---
    apiVersion: kueue.x-k8s.io/v1beta1
    kind: LocalQueue
    metadata: {{name: gpus, namespace: {NS}}}
    spec: {{clusterQueue: research}}
    ---
    apiVersion: apps/v1
    kind: Deployment
    metadata: {{name: web, namespace: {NS}, labels: {{app: web}}}}
    spec:
      replicas: 2
      selector: {{matchLabels: {{app: web}}}}
      template:
        metadata: {{labels: {{app: web}}}}
        spec:
          containers:
            - name: server
              image: python:3.11
              command: [python, -m, http.server, "$(PORT)"]
              ports: [{{name: http, containerPort: 8000}}]
              resources: {{requests: {{cpu: 100m}}}}
    ---
    apiVersion: v1
    kind: Service
    metadata: {{name: web, namespace: {NS}}}
    spec:
      selector: {{app: web}}
      ports: [{{name: http, port: 80, targetPort: http}}]
    ---
    apiVersion: autoscaling/v2
    kind: HorizontalPodAutoscaler
    metadata: {{name: web, namespace: {NS}}}
    spec:
      scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: web}}
      minReplicas: 1
      maxReplicas: 4
      metrics:
        - type: Pods
          pods:
            metric: {{name: requests_per_second}}
            target: {{type: AverageValue, averageValue: "5"}}
    ---
    apiVersion: batch/v1
    kind: Job
    metadata:
      name: prep
      namespace: {NS}
      labels: {{kueue.x-k8s.io/queue-name: gpus}}
    spec:
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: prep
              image: python:3.11
              command: [python, -c, "print(1)"]
              resources: {{limits: {{nvidia.com/gpu: 1}}}}
    ---
    apiVersion: batch/v1
    kind: CronJob
    metadata:
      name: nightly
      namespace: {NS}
    spec:
      schedule: "0 3 * * *"
      timeZone: Europe/Berlin
      jobTemplate:
        spec:
          template:
            spec:
              restartPolicy: OnFailure
              containers:
                - name: report
                  image: python:3.11
                  command: [python, -c, "print(2)"]
    ---
    apiVersion: kubeflow.org/v1
    kind: PyTorchJob
    metadata:
      name: mlp
      namespace: {NS}
      annotations: {{gpufleet.io/checkpoint-dir: /mnt/ckpt/mlp}}
    spec:
      runPolicy: {{backoffLimit: 3}}
      pytorchReplicaSpecs:
        Master:
          replicas: 1
          restartPolicy: OnFailure
          template:
            spec:
              containers:
                - name: pytorch
                  image: python:3.11
                  command: [python, train.py]
                  resources: {{limits: {{nvidia.com/gpu: 1}}}}
        Worker:
          replicas: 1
          restartPolicy: OnFailure
          template:
            spec:
              containers:
                - name: pytorch
                  image: python:3.11
                  command: [python, train.py]
                  resources: {{limits: {{nvidia.com/gpu: 1}}}}
    """)

EXPECTED = {
    ("Namespace", None, NS), ("ResourceQuota", NS, "gpus"), ("Role", NS, "trainer"), ("RoleBinding", NS, "trainer"),
    ("ResourceFlavor", None, "h100"), ("ClusterQueue", None, "research"), ("LocalQueue", NS, "gpus"),
    ("Deployment", NS, "web"), ("Service", NS, "web"), ("HorizontalPodAutoscaler", NS, "web"),
    ("Job", NS, "prep"), ("CronJob", NS, "nightly"), ("PyTorchJob", NS, "mlp"),
}
# Built-in kinds and their model in the official client.
K8S_MODELS = {"Namespace": "V1Namespace", "ResourceQuota": "V1ResourceQuota", "Role": "V1Role",
              "RoleBinding": "V1RoleBinding", "Deployment": "V1Deployment", "Service": "V1Service",
              "HorizontalPodAutoscaler": "V2HorizontalPodAutoscaler", "Job": "V1Job",
              "CronJob": "V1CronJob"}
SERVER_SET = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink",
              "ownerReferences")


class Cli:
    def __init__(self, kubeconfig: Path) -> None:
        self.env = {"KUBECONFIG": str(kubeconfig)}
        self.runner = CliRunner()

    async def __call__(self, *args: str, ok: bool = True) -> Result:
        # The commands run their own event loop, so they run beside this one.
        result = await asyncio.to_thread(self.runner.invoke, app, list(args), env=self.env)
        if ok:
            assert result.exit_code == 0, f"gpufleet {' '.join(args)}: {result.output}"
        return result


async def _plane(path: Path, controllers: bool) -> ControlPlane:
    cp = ControlPlane(store_url=f"sqlite:///{path / 'db'}", port=0, state_dir=path / "state",
                      run_controllers=controllers, leader_elect=False)
    await cp.start()
    return cp


@pytest.fixture
async def planes(tmp_path: Path) -> AsyncIterator[tuple[ControlPlane, ControlPlane]]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    source = await _plane(tmp_path / "a", controllers=True)
    target = await _plane(tmp_path / "b", controllers=False)
    try:
        yield source, target
    finally:
        await target.stop()
        await source.stop()


async def _everything(cp: ControlPlane) -> list[dict[str, Any]]:
    assert cp.client is not None
    objects: list[dict[str, Any]] = []
    for rt in REGISTRY.all():
        objects.extend((await cp.client.list(rt, raw=True)).items)
    return objects


async def _wait_for_children(cp: ControlPlane) -> None:
    """Until the controllers made what the export must leave out."""
    wanted = {"ReplicaSet", "Pod", "PodGroup", "Workload"}
    for _ in range(150):
        kinds = {o["kind"] for o in await _everything(cp) if o["metadata"].get("ownerReferences")}
        if wanted <= kinds:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the controllers made only {sorted(kinds)}")


def _key(doc: dict[str, Any]) -> tuple[str, str | None, str]:
    return doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"]


async def test_export_is_the_users_objects_valid_for_kubernetes_and_reapplies(planes, tmp_path: Path) -> None:
    source, target = planes
    manifest = tmp_path / "app.yaml"
    manifest.write_text(MANIFESTS)
    cli_a = Cli(tmp_path / "a" / "state" / "kubeconfig")
    cli_b = Cli(tmp_path / "b" / "state" / "kubeconfig")
    await cli_a("apply", "-f", str(manifest))
    await _wait_for_children(source)
    # A token's RoleBinding grants something that exists only here: not part of the export.
    limited = tmp_path / "alice.kubeconfig"
    await cli_a("token", "create", "--role", "view", "-n", NS, "--user", "alice",
                "--write-kubeconfig", str(limited))

    text = (await cli_a("export", "-A")).stdout
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    assert {_key(d) for d in docs} == EXPECTED
    assert len(docs) == len(EXPECTED)

    # One pass: namespaces first, RBAC and quotas and queues before the workloads.
    order = [d["kind"] for d in docs]
    assert order[0] == "Namespace"
    workloads = min(order.index(k) for k in ("Deployment", "Job", "PyTorchJob", "Service"))
    assert max(order.index(k) for k in ("Role", "RoleBinding", "ResourceQuota", "ClusterQueue", "LocalQueue")) \
        < workloads

    api = ApiClient()
    for d in docs:
        assert "status" not in d, _key(d)
        assert not set(d["metadata"]) & set(SERVER_SET), _key(d)
        assert "kubectl.kubernetes.io/last-applied-configuration" not in (d["metadata"].get("annotations") or {})
        if d["kind"] in K8S_MODELS:
            # Every field is one the official model knows: it survives a round trip through it.
            model = api._ApiClient__deserialize(d, K8S_MODELS[d["kind"]])
            assert api.sanitize_for_serialization(model) == d, _key(d)
        else:
            rt = REGISTRY.by_api_version_kind(d["apiVersion"], d["kind"])
            assert rt is not None
            rt.model.model_validate(d)

    by_key = {_key(d): d for d in docs}
    job_doc = by_key[("Job", NS, "prep")]
    job = job_doc["spec"]
    assert "selector" not in job
    assert "controller-uid" not in str(job_doc["metadata"])
    assert "controller-uid" not in str(job) and "job-name" not in str(job)
    cron = by_key[("CronJob", NS, "nightly")]["spec"]
    assert (cron["schedule"], cron["timeZone"], cron["concurrencyPolicy"]) == ("0 3 * * *", "Europe/Berlin", "Allow")
    assert "clusterIP" not in by_key[("Service", NS, "web")]["spec"]
    ptj = by_key[("PyTorchJob", NS, "mlp")]
    assert ptj["metadata"]["annotations"] == {"gpufleet.io/checkpoint-dir": "/mnt/ckpt/mlp"}
    assert "suspend" not in job
    # The comments name what the real cluster needs and what does not carry over.
    for needed in ("Kubeflow training operator", "Kueue", "GPUFLEET_CHECKPOINT_DIR", "custom metrics adapter",
                   "$PORT"):
        assert needed in text, needed

    # One namespace: its objects and its Namespace, no cluster-scoped ones; or named kinds only.
    ns_docs = [d for d in yaml.safe_load_all((await cli_a("export", "-n", NS)).stdout) if d]
    assert {_key(d) for d in ns_docs} == EXPECTED - {("ResourceFlavor", None, "h100"),
                                                     ("ClusterQueue", None, "research")}
    some = [d for d in yaml.safe_load_all((await cli_a("export", "-n", NS, "deploy,svc", "hpa")).stdout) if d]
    assert [_key(d) for d in some] == [("Service", NS, "web"), ("Deployment", NS, "web"),
                                       ("HorizontalPodAutoscaler", NS, "web")]
    # Someone who may list only some kinds gets those, and is told what was left out.
    viewer = Cli(limited)
    seen = await viewer("export")
    seen_keys = {_key(d) for d in yaml.safe_load_all(seen.stdout) if d}
    assert ("Deployment", NS, "web") in seen_keys and seen_keys < EXPECTED
    assert "Warning: left out" in seen.stderr
    refused = await cli_a("export", "nodes", ok=False)
    assert refused.exit_code == 1 and "not exported" in refused.output

    # Back to a fresh cluster through a directory of numbered files.
    out_dir = tmp_path / "export"
    await cli_a("export", "-A", "-o", str(out_dir))
    assert sorted(p.name for p in out_dir.iterdir())[0].startswith("01-namespace")
    applied = (await cli_b("apply", "-f", str(out_dir))).stdout
    assert len(applied.strip().splitlines()) == len(EXPECTED)
    source_objects = {_key(o): clean(o) for o in await _everything(source) if exported(o)}
    target_objects = {_key(o): clean(o) for o in await _everything(target) if exported(o)}
    assert set(target_objects) == EXPECTED
    for key in EXPECTED:
        assert target_objects[key] == source_objects[key], key
    # And the target exports the same manifests, comments and all.
    assert (await cli_b("export", "-A")).stdout == text


def test_children_and_system_objects_are_left_out() -> None:
    owner = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u", "controller": True}]
    objects = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": "ml"}},
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "system-node-critical"},
         "value": 2000001000},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "view", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "t", "namespace": "ml"},
         "type": "gpufleet.io/token"},
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web-1", "namespace": "ml",
                                                                       "ownerReferences": owner}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "solo", "namespace": "ml", "uid": "p", "resourceVersion": "9",
            "annotations": {"gpufleet.io/gpu-indices": "0", "gpufleet.io/scheduling-diagnosis": "x",
                            "gpufleet.io/gpu-memory-min": "40000"}},
         "spec": {"nodeName": "gpu-3", "containers": [{"name": "c", "image": "i"}]}, "status": {"phase": "Running"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {
            "name": "gpufleet-token-x", "namespace": "ml", "labels": {"gpufleet.io/token-id": "x"}},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"}},
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "high"},
         "value": 1000},
    ]
    export = build(objects)
    assert [(d.kind, d.obj["metadata"]["name"]) for d in export.documents] == [("PriorityClass", "high"),
                                                                               ("Pod", "solo")]
    pod = export.documents[1]
    assert pod.obj["metadata"] == {"name": "solo", "namespace": "ml",
                                   "annotations": {"gpufleet.io/gpu-memory-min": "40000"}}
    assert pod.obj["spec"] == {"containers": [{"name": "c", "image": "i"}]}
    assert any("gpufleet.io/gpu-memory-min" in n for n in pod.notes)


def test_what_service_account_admission_added_to_a_pod_is_left_out() -> None:
    access = {"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}
    mount = {"name": "kube-api-access-x7k2p", "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
    data = {"name": "data", "mountPath": "/data"}

    def pod(name: str, account: str) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml"},
                "spec": {"serviceAccountName": account, "serviceAccount": account,
                         "containers": [{"name": "c", "image": "i", "volumeMounts": [mount, data]}],
                         "initContainers": [{"name": "i", "image": "i", "volumeMounts": [mount]}],
                         "volumes": [access, {"name": "data", "emptyDir": {}}]}}

    export = build([pod("a", "default"), pod("b", "trainer")])
    specs = {d.obj["metadata"]["name"]: d.obj["spec"] for d in export.documents}
    assert specs["a"] == {"containers": [{"name": "c", "image": "i", "volumeMounts": [data]}],
                          "initContainers": [{"name": "i", "image": "i"}],
                          "volumes": [{"name": "data", "emptyDir": {}}]}
    assert specs["b"]["serviceAccountName"] == "trainer" and "serviceAccount" not in specs["b"]


def test_storage_exports_what_the_user_wrote_and_leaves_the_bookkeeping() -> None:
    bound = {"pv.kubernetes.io/bind-completed": "yes", "pv.kubernetes.io/bound-by-controller": "yes"}
    objects = [
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "gpufleet.io/local-path",
         "metadata": {"name": "local-path", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}},
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "gpufleet.io/local-path",
         "metadata": {"name": "scratch"}, "parameters": {"nodePath": "/nvme"}},
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {
            "name": "pvc-1", "annotations": {"pv.kubernetes.io/provisioned-by": "gpufleet.io/local-path"}},
         "spec": {"hostPath": {"path": "/x"}}},
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {
            "name": "datasets", "finalizers": ["kubernetes.io/pv-protection"],
            "annotations": {"pv.kubernetes.io/bound-by-controller": "yes"}},
         "spec": {"hostPath": {"path": "/srv"}, "claimRef": {"namespace": "ml", "name": "data", "uid": "u1"}},
         "status": {"phase": "Bound"}},
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "reserved"},
         "spec": {"hostPath": {"path": "/r"}, "claimRef": {"namespace": "ml", "name": "mine", "uid": "u2",
                                                            "resourceVersion": "7"}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {
            "name": "ckpt", "namespace": "ml", "finalizers": ["kubernetes.io/pvc-protection"],
            "annotations": {**bound, "volume.kubernetes.io/selected-node": "gpu-1"}},
         "spec": {"storageClassName": "local-path", "volumeName": "pvc-1"}, "status": {"phase": "Bound"}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {
            "name": "mine", "namespace": "ml", "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
         "spec": {"storageClassName": "", "volumeName": "reserved"}},
    ]
    export = build(objects)
    docs = {(d.kind, d.obj["metadata"]["name"]): d for d in export.documents}
    assert list(docs) == [("StorageClass", "scratch"), ("PersistentVolume", "datasets"),
                          ("PersistentVolume", "reserved"), ("PersistentVolumeClaim", "ckpt"),
                          ("PersistentVolumeClaim", "mine")]
    assert docs[("PersistentVolume", "datasets")].obj == {"apiVersion": "v1", "kind": "PersistentVolume",
                                                          "metadata": {"name": "datasets"},
                                                          "spec": {"hostPath": {"path": "/srv"}}}
    assert docs[("PersistentVolume", "reserved")].obj["spec"]["claimRef"] == {"namespace": "ml", "name": "mine"}
    ckpt = docs[("PersistentVolumeClaim", "ckpt")]
    assert ckpt.obj["metadata"] == {"name": "ckpt", "namespace": "ml"}
    assert ckpt.obj["spec"] == {"storageClassName": "local-path"}
    assert any("k3s has a class of that name" in n for n in ckpt.notes)
    assert docs[("PersistentVolumeClaim", "mine")].obj["spec"] == {"storageClassName": "", "volumeName": "reserved"}
    assert any("rancher.io/local-path" in n for n in docs[("StorageClass", "scratch")].notes)


def test_statefulsets_and_daemonsets_export_without_what_their_controllers_made() -> None:
    set_ref = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "s", "controller": True}]
    objects = [
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db", "namespace": "ml", "uid": "s"},
         "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                  "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "c",
                                                                                            "image": "i"}]}},
                  "volumeClaimTemplates": [{"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                            "metadata": {"name": "data"}, "spec": {"volumeMode": "Filesystem"},
                                            "status": {"phase": "Pending"}}]},
         "status": {"replicas": 2, "currentRevision": "db-abc"}},
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "logs", "namespace": "ml"},
         "spec": {"selector": {"matchLabels": {"app": "logs"}},
                  "template": {"metadata": {"labels": {"app": "logs"}}, "spec": {"containers": [{"name": "c",
                                                                                              "image": "i"}]}}},
         "status": {"desiredNumberScheduled": 3}},
        {"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": {"name": "db-abc", "namespace": "ml",
                                                                             "ownerReferences": set_ref},
         "data": {}, "revision": 1},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db-0", "namespace": "ml", "ownerReferences": set_ref},
         "spec": {"containers": [{"name": "c", "image": "i"}]}},
        # Claims of the set's replicas (Retain: no owner) are made again by the set there.
        *({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": ns},
           "spec": {"storageClassName": "local-path"}}
          for ns, name in (("ml", "data-db-0"), ("ml", "data-db-1"), ("ml", "data-other-0"), ("web", "data-db-0"))),
    ]
    export = build(objects)
    assert [(d.kind, d.obj["metadata"]["namespace"], d.obj["metadata"]["name"]) for d in export.documents] == [
        ("PersistentVolumeClaim", "ml", "data-other-0"), ("PersistentVolumeClaim", "web", "data-db-0"),
        ("StatefulSet", "ml", "db"), ("DaemonSet", "ml", "logs")]
    sts = export.documents[2].obj
    assert "status" not in sts and "status" not in sts["spec"]["volumeClaimTemplates"][0]


def test_volcano_jobs_and_queues_export_and_name_volcano() -> None:
    from gpufleet.export.render import notes_for

    queue = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "research"},
             "spec": {"capability": {"nvidia.com/gpu": 3}}}
    job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "a", "namespace": "ml"},
           "spec": {"tasks": []}}
    made = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "a-u1", "namespace": "ml", "ownerReferences": [
                {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "a", "uid": "u1",
                 "controller": True}]}}
    assert [exported(o) for o in (queue, job, made)] == [True, True, False]
    assert notes_for(job)[0] == notes_for(queue)[0] == "needs Volcano on the cluster"
