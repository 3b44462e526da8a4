"""The real kubectl, the gpufleet CLI and the official Python client against storage on a
running `gpufleet up` (no node agent, so pods stay Pending and nothing is provisioned):
discovery, Kubernetes' columns for pv, pvc and sc, binding to a volume made by hand, the
default class, validation errors as kubectl prints them, and `describe` of a claim and of a
pod that waits for one."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from e2e_helpers import Cluster, Kubectl, columns, kubectl_binary, table, wait_for, write

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]

MANIFESTS = """apiVersion: v1
kind: PersistentVolume
metadata:
  name: datasets
  labels: {tier: nfs}
spec:
  capacity: {storage: 100Gi}
  accessModes: [ReadOnlyMany]
  storageClassName: ""
  hostPath: {path: /srv/datasets, type: Directory}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: imagenet}
spec:
  accessModes: [ReadOnlyMany]
  storageClassName: ""
  selector: {matchLabels: {tier: nfs}}
  resources: {requests: {storage: 50Gi}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: checkpoints}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 20Gi}}
---
apiVersion: v1
kind: Pod
metadata: {name: trainer}
spec:
  containers:
  - name: main
    image: trainer
    volumeMounts: [{name: ckpt, mountPath: /ckpt}, {name: data, mountPath: /data}]
  volumes:
  - {name: ckpt, persistentVolumeClaim: {claimName: checkpoints}}
  - {name: data, persistentVolumeClaim: {claimName: imagenet, readOnly: true}}
---
apiVersion: v1
kind: Pod
metadata: {name: orphan}
spec:
  containers: [{name: main, image: trainer}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: missing}}]
"""


def row(text: str, name: str, key: str = "NAME") -> dict[str, str]:
    for r in table(text):
        if r.get(key) == name:
            return r
    raise AssertionError(f"no row {key}={name} in:\n{text}")


@pytest.fixture(scope="module")
def applied(kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = write(tmp_path_factory.mktemp("storage"), "storage.yaml", MANIFESTS)
    out = kubectl("apply", "-f", path).ok().stdout
    wait_for(lambda: row(kubectl("get", "pvc").ok().stdout, "imagenet")["STATUS"] == "Bound",
             what="the claim to bind to the volume made by hand")
    return out


def gpufleet(cluster: Cluster, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", *args, "--kubeconfig", cluster.kubeconfig],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, f"gpufleet {' '.join(args)}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.parametrize("version", [None, "1.27"], ids=["kubectl-1.32", "kubectl-1.27"])
def test_api_resources_lists_the_storage_kinds(kubectl_factory: Callable[[str], Kubectl], version: str | None) -> None:
    kc = kubectl_factory(kubectl_binary(version))
    out = kc("api-resources").ok().stdout
    assert [row(out, name)[k] for name in ("persistentvolumes", "persistentvolumeclaims", "storageclasses")
            for k in ("SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND")] == [
        "pv", "v1", "false", "PersistentVolume",
        "pvc", "v1", "true", "PersistentVolumeClaim",
        "sc", "storage.k8s.io/v1", "false", "StorageClass"]


def test_get_pv_pvc_sc_show_kubernetes_columns(kubectl: Kubectl, applied: str) -> None:
    assert applied.splitlines() == ["persistentvolume/datasets created", "persistentvolumeclaim/imagenet created",
                                    "persistentvolumeclaim/checkpoints created", "pod/trainer created",
                                    "pod/orphan created"]
    pv = kubectl("get", "pv").ok().stdout
    assert columns(pv.splitlines()[0]) == ["NAME", "CAPACITY", "ACCESS MODES", "RECLAIM POLICY", "STATUS", "CLAIM",
                                           "STORAGECLASS", "VOLUMEATTRIBUTESCLASS", "REASON", "AGE"]
    r = row(pv, "datasets")
    assert (r["CAPACITY"], r["ACCESS MODES"], r["RECLAIM POLICY"], r["STATUS"], r["CLAIM"]) == (
        "100Gi", "ROX", "Retain", "Bound", "default/imagenet")
    pvc = kubectl("get", "pvc").ok().stdout
    assert columns(pvc.splitlines()[0]) == ["NAME", "STATUS", "VOLUME", "CAPACITY", "ACCESS MODES", "STORAGECLASS",
                                            "VOLUMEATTRIBUTESCLASS", "AGE"]
    assert {k: row(pvc, "imagenet")[k] for k in ("STATUS", "VOLUME", "CAPACITY", "ACCESS MODES")} == {
        "STATUS": "Bound", "VOLUME": "datasets", "CAPACITY": "100Gi", "ACCESS MODES": "ROX"}
    pending = row(pvc, "checkpoints")
    assert (pending["STATUS"], pending["VOLUME"], pending["STORAGECLASS"]) == ("Pending", "", "local-path")
    assert columns(kubectl("get", "pvc", "-o", "wide").ok().stdout.splitlines()[0])[-1] == "VOLUMEMODE"
    sc = kubectl("get", "sc").ok().stdout
    assert columns(sc.splitlines()[0]) == ["NAME", "PROVISIONER", "RECLAIMPOLICY", "VOLUMEBINDINGMODE",
                                           "ALLOWVOLUMEEXPANSION", "AGE"]
    default = row(sc, "local-path (default)")
    assert (default["PROVISIONER"], default["RECLAIMPOLICY"], default["VOLUMEBINDINGMODE"]) == (
        "gpufleet.io/local-path", "Delete", "WaitForFirstConsumer")
    both = kubectl("get", "pv,pvc").ok().stdout
    assert "persistentvolume/datasets" in both and "persistentvolumeclaim/checkpoints" in both


def test_the_gpufleet_cli_prints_the_same_tables(cluster: Cluster, applied: str) -> None:
    out = gpufleet(cluster, "get", "pv,pvc,storageclass")
    blocks = [b for b in out.split("\n\n") if b.strip()]
    assert [columns(b.splitlines()[0])[:3] for b in blocks] == [
        ["NAME", "CAPACITY", "ACCESS MODES"], ["NAME", "STATUS", "VOLUME"], ["NAME", "PROVISIONER", "RECLAIMPOLICY"]]
    assert row(blocks[1], "persistentvolumeclaim/imagenet")["VOLUME"] == "datasets"
    assert row(blocks[2], "storageclass.storage.k8s.io/local-path (default)")["VOLUMEBINDINGMODE"] == \
        "WaitForFirstConsumer"


def test_describe_says_why_a_claim_and_its_pod_wait(kubectl: Kubectl, cluster: Cluster, applied: str) -> None:
    wait_for(lambda: "WaitForPodScheduled" in kubectl("describe", "pvc", "checkpoints").ok().stdout,
             what="the PV controller's event")
    for text in (kubectl("describe", "pvc", "checkpoints").ok().stdout,
                 gpufleet(cluster, "describe", "pvc", "checkpoints")):
        assert "StorageClass:  local-path" in text
        assert "Used By:       trainer" in text
        assert "Finalizers:    [kubernetes.io/pvc-protection]" in text
        assert "waiting for pod trainer to be scheduled" in text
    wait_for(lambda: "FailedScheduling" in kubectl("describe", "pod", "orphan").ok().stdout,
             what="the scheduler's event")
    for text in (kubectl("describe", "pod", "orphan").ok().stdout, gpufleet(cluster, "describe", "pod", "orphan")):
        assert 'persistentvolumeclaim "missing" not found' in text
        # Aligned with the volume's other fields (the service account's volume beside it may widen them).
        assert re.search(r"\n    ClaimName: +missing\n", text), text
    pv = gpufleet(cluster, "describe", "pv", "datasets")
    assert "Claim:           default/imagenet" in pv and "HostPathType:  Directory" in pv


def test_invalid_storage_objects_are_refused_with_kubernetes_messages(kubectl: Kubectl,
                                                                      tmp_path: Path) -> None:
    bad = write(tmp_path, "bad.yaml", """apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: bad}
spec: {accessModes: [ReadWriteOnce]}
""")
    result = kubectl("apply", "-f", bad).failed()
    assert 'The PersistentVolumeClaim "bad" is invalid: spec.resources[storage]: Required value' in result.stderr
    grow = kubectl("patch", "pvc", "imagenet", "--type=merge",
                   "-p", '{"spec":{"resources":{"requests":{"storage":"200Gi"}}}}').failed()
    assert ('persistentvolumeclaims "imagenet" is forbidden: only dynamically provisioned pvc can be resized and '
            "the storageclass that provisions the pvc must support resize") in grow.stderr
    moved = kubectl("patch", "pvc", "imagenet", "--type=merge", "-p", '{"spec":{"accessModes":["ReadWriteMany"]}}')
    assert "spec is immutable after creation except resources.requests" in moved.failed().stderr


def test_explain_describes_the_storage_fields(kubectl: Kubectl) -> None:
    out = kubectl("explain", "pvc.spec.storageClassName").ok().stdout
    assert "storageClassName" in out and "StorageClass" in out


def test_the_python_client_reads_claims_and_volumes(cluster: Cluster, applied: str) -> None:
    from kubernetes import client, config

    config.load_kube_config(config_file=cluster.kubeconfig)
    core = client.CoreV1Api()
    claims = {c.metadata.name: c for c in core.list_namespaced_persistent_volume_claim("default").items}
    assert claims["imagenet"].status.phase == "Bound"
    assert claims["imagenet"].spec.volume_name == "datasets"
    assert core.read_persistent_volume("datasets").spec.claim_ref.name == "imagenet"
    classes = client.StorageV1Api().list_storage_class().items
    assert [sc.metadata.name for sc in classes] == ["local-path"]
