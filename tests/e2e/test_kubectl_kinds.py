"""The real kubectl and the official Python client against the kinds beyond core Kubernetes.

PyTorchJob, PodGroup, the Kueue kinds, and the built-in policy kinds (HorizontalPodAutoscaler,
ResourceQuota, LimitRange, PriorityClass, PodDisruptionBudget, RBAC) used the way a user of a
real cluster uses them: discovery, server-side tables, `explain` from the OpenAPI schemas,
client-side and server-side apply of the shipped examples, the scale subresource, admission
errors worded as Kubernetes words them, and typed creates that kubectl 1.32+ sends as protobuf.

One shared `gpufleet up` without a node agent: pods stay Pending, so every table is
deterministic.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from e2e_helpers import Cluster, Kubectl, columns, kubectl_binary, table, wait_for, write

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "training"

KUEUE = """apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata:
  name: h100
spec:
  nodeLabels:
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata:
  name: research
spec:
  namespaceSelector: {}
  cohort: lab
  queueingStrategy: BestEffortFIFO
  resourceGroups:
  - coveredResources: ["cpu", "memory", "nvidia.com/gpu"]
    flavors:
    - name: h100
      resources:
      - name: cpu
        nominalQuota: "64"
      - name: memory
        nominalQuota: 256Gi
      - name: nvidia.com/gpu
        nominalQuota: "8"
        borrowingLimit: "4"
  preemption:
    reclaimWithinCohort: Any
    withinClusterQueue: LowerPriority
---
apiVersion: v1
kind: Namespace
metadata:
  name: ml
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata:
  namespace: ml
  name: main
spec:
  clusterQueue: research
"""


def row(text: str, name: str, key: str = "NAME") -> dict[str, str]:
    for r in table(text):
        if r.get(key) == name:
            return r
    raise AssertionError(f"no row {key}={name} in:\n{text}")


def header(text: str) -> list[str]:
    return columns(text.splitlines()[0])


@pytest.fixture(scope="module")
def kubectl_at(kubectl_factory: Callable[[str], Kubectl]) -> Callable[[str], Kubectl]:
    """A versioned kubectl ("1.27", "1.33") against the module's server."""
    return lambda version: kubectl_factory(kubectl_binary(version))


@pytest.fixture(scope="module")
def training(kubectl: Kubectl) -> dict[str, str]:
    """The two shipped PyTorchJob examples, one applied client-side and one server-side."""
    return {
        "client": kubectl("apply", "-f", str(EXAMPLES / "pytorchjob.yaml")).ok().stdout,
        "server": kubectl("apply", "--server-side", "-f", str(EXAMPLES / "pytorchjob-elastic.yaml")).ok().stdout,
    }


@pytest.fixture(scope="module")
def kueue(kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = write(tmp_path_factory.mktemp("kueue"), "kueue.yaml", KUEUE)
    return kubectl("apply", "-f", path).ok().stdout


# --- discovery ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [None, "1.27"], ids=["kubectl-1.32", "kubectl-1.27"])
def test_api_resources_lists_the_kinds_with_short_names(kubectl_at, kubectl: Kubectl,
                                                        version: str | None) -> None:
    kc = kubectl if version is None else kubectl_at(version)
    out = kc("api-resources", "-o", "wide").ok().stdout
    want = {
        "pytorchjobs": ("", "kubeflow.org/v1", "true", "PyTorchJob"),
        "podgroups": ("pg,pgs", "scheduling.x-k8s.io/v1alpha1", "true", "PodGroup"),
        "clusterqueues": ("cq", "kueue.x-k8s.io/v1beta1", "false", "ClusterQueue"),
        "localqueues": ("queue,queues,lq", "kueue.x-k8s.io/v1beta1", "true", "LocalQueue"),
        "resourceflavors": ("flavor,flavors,rf", "kueue.x-k8s.io/v1beta1", "false", "ResourceFlavor"),
        "workloads": ("wl", "kueue.x-k8s.io/v1beta1", "true", "Workload"),
        "horizontalpodautoscalers": ("hpa", "autoscaling/v2", "true", "HorizontalPodAutoscaler"),
        "resourcequotas": ("quota", "v1", "true", "ResourceQuota"),
        "limitranges": ("limits", "v1", "true", "LimitRange"),
        "priorityclasses": ("pc", "scheduling.k8s.io/v1", "false", "PriorityClass"),
        "poddisruptionbudgets": ("pdb", "policy/v1", "true", "PodDisruptionBudget"),
        "roles": ("", "rbac.authorization.k8s.io/v1", "true", "Role"),
        "statefulsets": ("sts", "apps/v1", "true", "StatefulSet"),
        "daemonsets": ("ds", "apps/v1", "true", "DaemonSet"),
        "controllerrevisions": ("", "apps/v1", "true", "ControllerRevision"),
        "clusterrolebindings": ("", "rbac.authorization.k8s.io/v1", "false", "ClusterRoleBinding"),
        # Volcano's (a second "podgroups", "jobs" and the "queues" that LocalQueue's short name also is).
        "jobs.batch.volcano.sh": ("vcjob,vj", "batch.volcano.sh/v1alpha1", "true", "Job"),
        "podgroups.scheduling.volcano.sh": ("podgroup-v1beta1", "scheduling.volcano.sh/v1beta1", "true", "PodGroup"),
        "queues.scheduling.volcano.sh": ("q,queue-v1beta1", "scheduling.volcano.sh/v1beta1", "false", "Queue"),
    }
    rows = table(out)
    for key, cells in want.items():
        name = key.split(".", 1)[0]
        (r,) = [r for r in rows if r["NAME"] == name and r["APIVERSION"] == cells[1]]
        assert (r["SHORTNAMES"], r["APIVERSION"], r["NAMESPACED"], r["KIND"]) == cells, r
    assert row(out, "pytorchjobs")["VERBS"] == "create,delete,deletecollection,get,list,patch,update,watch"
    # `kubectl get all` includes HPAs, as on Kubernetes; the queue kinds stay out of it.
    assert row(out, "horizontalpodautoscalers")["CATEGORIES"] == "all"
    assert row(out, "clusterqueues")["CATEGORIES"] == ""


# --- PyTorchJob and PodGroup ------------------------------------------------------------------


def test_apply_the_training_examples(kubectl: Kubectl, training: dict[str, str]) -> None:
    assert training["client"] == "pytorchjob.kubeflow.org/mlp created\n"
    assert training["server"] == "pytorchjob.kubeflow.org/mlp-elastic serverside-applied\n"
    again = kubectl("apply", "--server-side", "-f", str(EXAMPLES / "pytorchjob-elastic.yaml")).ok()
    assert again.stdout == "pytorchjob.kubeflow.org/mlp-elastic serverside-applied\n"
    live = json.loads(kubectl("get", "pytorchjob", "mlp", "-o", "json").ok().stdout)
    last = json.loads(live["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
    assert last["spec"]["runPolicy"] == {"backoffLimit": 3, "cleanPodPolicy": "None"}
    elastic = yaml.safe_load(kubectl("get", "pytorchjob", "mlp-elastic", "-o", "yaml",
                                         "--show-managed-fields").ok().stdout)
    assert (elastic["apiVersion"], elastic["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert elastic["spec"]["elasticPolicy"]["rdzvConf"] == [{"key": "last_call_timeout", "value": "2"}]
    managers = {m["manager"] for m in elastic["metadata"]["managedFields"]}
    assert "kubectl" in managers


def test_get_pytorchjobs_and_podgroups(kubectl: Kubectl, training: dict[str, str]) -> None:
    wait_for(lambda: row(kubectl("get", "pytorchjobs").ok().stdout, "mlp")["STATE"] == "Created",
             what="the controller to mark mlp Created")
    jobs = kubectl("get", "pytorchjobs").ok().stdout
    assert header(jobs) == ["NAME", "STATE", "WORKERS", "AGE"]
    assert row(jobs, "mlp")["WORKERS"] == "0/2"
    assert header(kubectl("get", "pytorchjobs", "-o", "wide").ok().stdout)[:2] == ["NAME", "STATE"]
    assert {"pytorchjob.kubeflow.org/mlp", "pytorchjob.kubeflow.org/mlp-elastic"} <= set(
        kubectl("get", "pytorchjobs", "-o", "name").ok().stdout.split())

    # The controller's gang: one PodGroup per job, minMember = every replica.
    wait_for(lambda: "mlp-elastic" in kubectl("get", "pg", "-o", "name").ok().stdout, what="the PodGroups")
    groups = kubectl("get", "pg").ok().stdout
    assert header(groups) == ["NAME", "PHASE", "MINMEMBER", "SCHEDULED", "RUNNING", "AGE"]
    assert row(groups, "mlp")["MINMEMBER"] == "3"
    assert row(groups, "mlp-elastic")["MINMEMBER"] == "2"
    pg = json.loads(kubectl("get", "podgroup", "mlp", "-o", "json").ok().stdout)
    assert pg["apiVersion"] == "scheduling.x-k8s.io/v1alpha1" and pg["spec"]["minMember"] == 3
    assert pg["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob"


def test_scale_a_pytorchjob(kubectl: Kubectl, training: dict[str, str]) -> None:
    scaled = kubectl("scale", "pytorchjob/mlp-elastic", "--replicas", "3").ok()
    assert scaled.stdout == "pytorchjob.kubeflow.org/mlp-elastic scaled\n"
    path = "jsonpath={.spec.pytorchReplicaSpecs.Worker.replicas}"
    assert kubectl("get", "pytorchjob", "mlp-elastic", "-o", path).ok().stdout == "3"
    wait_for(lambda: row(kubectl("get", "pytorchjobs").ok().stdout, "mlp-elastic")["WORKERS"] == "0/3",
             what="the WORKERS column to follow the scale")

    refused = kubectl("scale", "pytorchjob/mlp-elastic", "--replicas", "9").failed()
    assert refused.stderr == (
        'The PyTorchJob "mlp-elastic" is invalid: spec.pytorchReplicaSpecs[Worker].replicas: Invalid value: 9: '
        "must be between elasticPolicy.minReplicas (2) and maxReplicas (4); change the bounds or choose a "
        "count within them\n")
    assert kubectl("get", "pytorchjob", "mlp-elastic", "-o", path).ok().stdout == "3"


def test_describe_a_pytorchjob(kubectl: Kubectl, training: dict[str, str]) -> None:
    wait_for(lambda: "Created pod: mlp-worker-1" in kubectl("describe", "pytorchjob", "mlp").ok().stdout,
             what="the controller's pod events")
    out = kubectl("describe", "pytorchjob", "mlp").ok()
    assert out.stderr == ""
    assert re.search(r"^Name:\s+mlp$", out.stdout, re.M)
    assert re.search(r"^Kind:\s+PyTorchJob$", out.stdout, re.M)
    assert re.search(r"^API Version:\s+kubeflow.org/v1$", out.stdout, re.M)
    assert re.search(r"^\s+Clean Pod Policy:\s+None$", out.stdout, re.M)
    assert re.search(r"^\s+Type:\s+Created$", out.stdout, re.M)
    events = out.stdout[out.stdout.rindex("Events:"):]
    assert re.search(r"Normal\s+SuccessfulCreatePod\s+.*pytorchjob-controller\s+Created pod: mlp-master-0", events)


def test_delete_a_pytorchjob_takes_its_pods_and_podgroup(kubectl: Kubectl, training: dict[str, str]) -> None:
    selector = "training.kubeflow.org/job-name=mlp-elastic"
    wait_for(lambda: kubectl("get", "pods", "-l", selector, "-o", "name").ok().stdout, what="the job's pods")
    deleted = kubectl("delete", "pytorchjob", "mlp-elastic").ok()
    assert deleted.stdout == 'pytorchjob.kubeflow.org "mlp-elastic" deleted\n'
    wait_for(lambda: kubectl("get", "pods", "-l", selector, "-o", "name").ok().stdout == "",
             timeout=20, what="garbage collection of the job's pods")
    gone = kubectl("get", "podgroup", "mlp-elastic").failed()
    assert gone.stderr == 'Error from server (NotFound): podgroups.scheduling.x-k8s.io "mlp-elastic" not found\n'


# --- explain ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [None, "1.27"], ids=["kubectl-1.32", "kubectl-1.27"])
def test_explain_the_new_kinds(kubectl_at, kubectl: Kubectl, version: str | None) -> None:
    kc = kubectl if version is None else kubectl_at(version)
    elastic = kc("explain", "pytorchjob.spec.elasticPolicy").ok().stdout
    assert re.search(r"^GROUP:\s+kubeflow.org$", elastic, re.M) and re.search(r"^KIND:\s+PyTorchJob$", elastic, re.M)
    assert "FIELD: elasticPolicy <ElasticPolicy>" in elastic
    for field in ("minReplicas\t<integer>", "maxReplicas\t<integer>", "rdzvBackend\t<string>",
                  "rdzvConf\t<[]RDZVConf>", "metrics\t<[]MetricSpec>"):
        assert field in elastic, elastic
    assert "The fewest Workers the job may shrink to" in elastic

    groups = kc("explain", "clusterqueue.spec.resourceGroups").ok().stdout
    assert re.search(r"^GROUP:\s+kueue.x-k8s.io$", groups, re.M)
    assert "coveredResources\t<[]string> -required-" in groups
    assert "flavors\t<[]FlavorQuotas> -required-" in groups
    quotas = kc("explain", "clusterqueue.spec.resourceGroups.flavors.resources").ok().stdout
    assert "nominalQuota\t<string> -required-" in quotas and "borrowingLimit\t<string>" in quotas
    # Kueue's ResourceQuota is its own type, not core/v1's that happens to share the name.
    assert "ResourceQuota sets aggregate quota restrictions" not in quotas

    status = kc("explain", "pytorchjob.status").ok().stdout
    assert "replicaStatuses\t<map[string]ReplicaStatus>" in status or "replicaStatuses\t<Object>" in status, status
    assert "JobStatus represents the current state of a Job" not in status
    # batch/v1 keeps Kubernetes' own text.
    assert "JobStatus represents the current state of a Job" in kc("explain", "job.status").ok().stdout


# --- Kueue ------------------------------------------------------------------------------------


def test_apply_a_kueue_setup_and_read_its_tables(kubectl: Kubectl, kueue: str, tmp_path: Path) -> None:
    assert kueue.splitlines() == [
        "resourceflavor.kueue.x-k8s.io/h100 created",
        "clusterqueue.kueue.x-k8s.io/research created",
        "namespace/ml created",
        "localqueue.kueue.x-k8s.io/main created",
    ]
    path = write(tmp_path, "kueue.yaml", KUEUE)
    assert kubectl("apply", "-f", path).ok().stdout.splitlines() == [
        "resourceflavor.kueue.x-k8s.io/h100 unchanged",
        "clusterqueue.kueue.x-k8s.io/research unchanged",
        "namespace/ml unchanged",
        "localqueue.kueue.x-k8s.io/main unchanged",
    ]
    assert kubectl("apply", "--server-side", "-f", path).ok().stdout.count("serverside-applied") == 4

    cq = kubectl("get", "cq").ok().stdout
    assert header(cq)[:4] == ["NAME", "COHORT", "PENDING WORKLOADS", "ADMITTED WORKLOADS"]
    assert row(cq, "research")["COHORT"] == "lab"
    assert row(kubectl("get", "cq", "-o", "wide").ok().stdout, "research")["STRATEGY"] == "BestEffortFIFO"
    rf = kubectl("get", "rf").ok().stdout
    assert row(rf, "h100")["NODE LABELS"] == "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
    # `queues` is Volcano's Queue for kubectl (an exact resource name beats LocalQueue's short
    # name, as on a cluster with both installed): LocalQueues go by `lq` or `localqueues`.
    queues = kubectl("get", "lq", "-A").ok().stdout
    assert header(queues)[:3] == ["NAMESPACE", "NAME", "CLUSTERQUEUE"]
    assert row(queues, "main")["CLUSTERQUEUE"] == "research"

    # A job that names the queue becomes a Workload, and waits: no node has the GPUs.
    job = (EXAMPLES / "pytorchjob.yaml").read_text().replace(
        "  name: mlp\n", "  name: queued\n  namespace: ml\n  labels:\n    kueue.x-k8s.io/queue-name: main\n", 1)
    kubectl("apply", "-f", write(tmp_path, "queued.yaml", job)).ok()
    wait_for(lambda: "workload" in kubectl("get", "wl", "-n", "ml", "-o", "name").ok().stdout,
             what="the Workload of the queued PyTorchJob")
    wl = kubectl("get", "wl", "-n", "ml").ok().stdout
    assert header(wl)[:2] == ["NAME", "QUEUE"]
    (only,) = table(wl)
    assert only["NAME"].startswith("pytorchjob-queued-") and only["QUEUE"] == "main"
    wait_for(lambda: row(kubectl("get", "pytorchjob", "-n", "ml").ok().stdout, "queued")["STATE"] == "Suspended",
             what="the unadmitted job to stay suspended")
    wait_for(lambda: row(kubectl("get", "cq").ok().stdout, "research")["PENDING WORKLOADS"] == "1",
             what="the ClusterQueue to count the pending Workload")


# --- quota, limits, priority, disruption budgets, autoscaling ----------------------------------


def test_quota_turns_away_a_pod_over_it(kubectl: Kubectl, tmp_path: Path) -> None:
    kubectl("create", "namespace", "capped").ok()
    made = kubectl("create", "quota", "q", "--hard=requests.nvidia.com/gpu=4", "-n", "capped").ok()
    assert made.stdout == "resourcequota/q created\n"
    wait_for(lambda: "0/4" in kubectl("get", "quota", "-n", "capped").ok().stdout, what="the quota's usage")
    quota = kubectl("get", "quota", "-n", "capped").ok().stdout
    assert header(quota) == ["NAME", "REQUEST", "LIMIT", "AGE"]
    assert row(quota, "q")["REQUEST"] == "requests.nvidia.com/gpu: 0/4"

    pod = """apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: capped
spec:
  containers:
  - name: main
    image: busybox:1.36
    resources:
      limits:
        nvidia.com/gpu: {gpus}
"""
    over = kubectl("create", "-f", (path := write(tmp_path, "big.yaml", pod.format(name="big", gpus=8)))).failed()
    assert over.stderr == (
        f'Error from server (Forbidden): error when creating "{path}": pods "big" is forbidden: exceeded quota: q, '
        "requested: requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=4\n")
    kubectl("create", "-f", write(tmp_path, "fits.yaml", pod.format(name="fits", gpus=3))).ok()
    wait_for(lambda: row(kubectl("get", "quota", "-n", "capped").ok().stdout, "q")["REQUEST"]
             == "requests.nvidia.com/gpu: 3/4", what="the quota to count the admitted pod")
    described = kubectl("describe", "quota", "q", "-n", "capped").ok().stdout
    assert re.search(r"^requests.nvidia.com/gpu\s+3\s+4$", described, re.M), described


def test_limit_range_priority_class_and_pdb(kubectl: Kubectl, tmp_path: Path) -> None:
    limits = """apiVersion: v1
kind: LimitRange
metadata:
  name: defaults
spec:
  limits:
  - type: Container
    default: {cpu: 500m, memory: 1Gi}
    defaultRequest: {cpu: 250m, memory: 512Mi}
"""
    assert kubectl("apply", "-f", write(tmp_path, "lr.yaml", limits)).ok().stdout == "limitrange/defaults created\n"
    assert header(kubectl("get", "limits").ok().stdout) == ["NAME", "CREATED AT"]

    made = kubectl("create", "priorityclass", "high", "--value", "1000", "--description", "training that may preempt")
    assert made.ok().stdout == "priorityclass.scheduling.k8s.io/high created\n"
    pcs = kubectl("get", "pc").ok().stdout
    assert header(pcs) == ["NAME", "VALUE", "GLOBAL-DEFAULT", "AGE", "PREEMPTIONPOLICY"]
    r = row(pcs, "high")
    assert (r["VALUE"], r["GLOBAL-DEFAULT"], r["PREEMPTIONPOLICY"]) == ("1000", "false", "PreemptLowerPriority")
    assert row(pcs, "system-node-critical")["VALUE"] == "2000001000"

    # 1.32 sends this typed create as protobuf.
    made = kubectl("create", "pdb", "keep-one", "--selector=app=web", "--min-available=1")
    assert made.ok().stdout == "poddisruptionbudget.policy/keep-one created\n"
    pdbs = kubectl("get", "pdb").ok().stdout
    assert header(pdbs) == ["NAME", "MIN AVAILABLE", "MAX UNAVAILABLE", "ALLOWED DISRUPTIONS", "AGE"]
    r = row(pdbs, "keep-one")
    assert (r["MIN AVAILABLE"], r["MAX UNAVAILABLE"], r["ALLOWED DISRUPTIONS"]) == ("1", "N/A", "0")


HPA = """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: web
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 1
  maxReplicas: 3
  metrics:
  - type: Resource
    resource:
      name: cpu
      target: {type: Utilization, averageUtilization: 50}
"""


def test_hpa_from_a_manifest(kubectl: Kubectl, tmp_path: Path) -> None:
    kubectl("create", "deployment", "web", "--image=nginx:1.25").ok()
    assert kubectl("apply", "-f", write(tmp_path, "hpa.yaml", HPA)).ok().stdout == (
        "horizontalpodautoscaler.autoscaling/web created\n")
    hpas = kubectl("get", "hpa").ok().stdout
    assert header(hpas) == ["NAME", "REFERENCE", "TARGETS", "MINPODS", "MAXPODS", "REPLICAS", "AGE"]
    r = row(hpas, "web")
    assert (r["REFERENCE"], r["MINPODS"], r["MAXPODS"]) == ("Deployment/web", "1", "3")
    assert r["TARGETS"].endswith("/50%"), r


def test_kubectl_autoscale_creates_an_hpa(kubectl: Kubectl, kubectl_at) -> None:
    # kubectl 1.33 posts an autoscaling/v2 HPA as protobuf.
    kc = kubectl_at("1.33")
    kubectl("create", "deployment", "auto", "--image=nginx:1.25").ok()
    made = kc("autoscale", "deployment", "auto", "--min", "1", "--max", "3", "--cpu-percent", "50").ok()
    assert made.stdout == "horizontalpodautoscaler.autoscaling/auto autoscaled\n"
    r = row(kubectl("get", "hpa").ok().stdout, "auto")
    assert (r["REFERENCE"], r["MINPODS"], r["MAXPODS"]) == ("Deployment/auto", "1", "3")
    spec = json.loads(kubectl("get", "hpa", "auto", "-o", "json").ok().stdout)["spec"]
    assert spec["metrics"] == [
        {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}]


HPA_V1 = """apiVersion: autoscaling/v1
kind: HorizontalPodAutoscaler
metadata:
  name: web-v1
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 1
  maxReplicas: 3
  targetCPUUtilizationPercentage: percent
"""


def test_kubectl_autoscale_with_kubectl_1_32_and_1_27(kubectl: Kubectl, kubectl_at) -> None:
    # kubectl 1.27-1.32 post an autoscaling/v1 HPA (1.32 as protobuf, 1.27 as JSON), stored as v2.
    for kc, cpu in ((kubectl, 50), (kubectl_at("1.27"), 60)):
        name = f"auto-v1-{kc.minor}"
        kubectl("create", "deployment", name, "--image=nginx:1.25").ok()
        made = kc("autoscale", "deployment", name, "--min", "1", "--max", "3", "--cpu-percent", str(cpu)).ok()
        assert made.stdout == f"horizontalpodautoscaler.autoscaling/{name} autoscaled\n"
        hpas = kc("get", "hpa").ok().stdout
        assert header(hpas) == ["NAME", "REFERENCE", "TARGETS", "MINPODS", "MAXPODS", "REPLICAS", "AGE"]
        r = row(hpas, name)
        assert (r["REFERENCE"], r["MINPODS"], r["MAXPODS"]) == (f"Deployment/{name}", "1", "3")
        assert r["REPLICAS"] in ("0", "1"), r  # 1 once the hpa controller has seen the deployment
        assert r["TARGETS"].endswith(f"/{cpu}%"), r
        spec = json.loads(kubectl("get", "hpa", name, "-o", "json").ok().stdout)["spec"]
        assert spec["metrics"] == [{"type": "Resource", "resource": {
            "name": "cpu", "target": {"type": "Utilization", "averageUtilization": cpu}}}]
        v1 = json.loads(kc("get", "horizontalpodautoscalers.v1.autoscaling", name, "-o", "json").ok().stdout)
        assert (v1["apiVersion"], v1["spec"]["targetCPUUtilizationPercentage"]) == ("autoscaling/v1", cpu)
    # A v1 manifest, applied client-side (create, then a strategic merge patch of the v1 fields).
    kc = kubectl_at("1.27")
    manifest = HPA_V1.replace("percent", "70")
    assert kc("apply", "-f", "-", input=manifest).ok().stdout == "horizontalpodautoscaler.autoscaling/web-v1 created\n"
    assert kc("apply", "-f", "-", input=HPA_V1.replace("percent", "40")).ok().stdout == (
        "horizontalpodautoscaler.autoscaling/web-v1 configured\n")
    spec = json.loads(kubectl("get", "hpa", "web-v1", "-o", "json").ok().stdout)["spec"]
    assert spec["metrics"][0]["resource"]["target"]["averageUtilization"] == 40
    explained = kubectl("explain", "hpa.spec.targetCPUUtilizationPercentage", "--api-version=autoscaling/v1").ok()
    assert "VERSION:    v1" in explained.stdout and "FIELD: targetCPUUtilizationPercentage" in explained.stdout


# --- RBAC -------------------------------------------------------------------------------------


def test_create_roles_and_bindings_then_can_i(cluster: Cluster, kubectl: Kubectl, kubectl_at,
                                                tmp_path: Path) -> None:
    kubectl("create", "namespace", "rbac").ok()
    # 1.32 and 1.33 send these typed creates as protobuf; 1.27 as JSON.
    for kc in (kubectl_at("1.27"), kubectl, kubectl_at("1.33")):
        m = kc.minor
        made = kc("create", "role", f"trainer-{m}", "--verb=get,list,create",
                  "--resource=pytorchjobs.kubeflow.org,pods", "-n", "rbac").ok()
        assert made.stdout == f"role.rbac.authorization.k8s.io/trainer-{m} created\n"
        made = kc("create", "rolebinding", f"trainer-{m}", f"--role=trainer-{m}", "--user=bob", "-n", "rbac").ok()
        assert made.stdout == f"rolebinding.rbac.authorization.k8s.io/trainer-{m} created\n"
        made = kc("create", "clusterrole", f"queues-{m}", "--verb=get,list", "--resource=clusterqueues").ok()
        assert made.stdout == f"clusterrole.rbac.authorization.k8s.io/queues-{m} created\n"
        made = kc("create", "clusterrolebinding", f"queues-{m}", f"--clusterrole=queues-{m}", "--user=bob").ok()
        assert made.stdout == f"clusterrolebinding.rbac.authorization.k8s.io/queues-{m} created\n"

    role = json.loads(kubectl("get", "role", "trainer-33", "-n", "rbac", "-o", "json").ok().stdout)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "create"]},
        {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["get", "list", "create"]},
    ]
    binding = json.loads(kubectl("get", "rolebinding", "trainer-32", "-n", "rbac", "-o", "json").ok().stdout)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "trainer-32"}
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}]
    bindings = kubectl("get", "rolebindings", "-n", "rbac", "-o", "wide").ok().stdout
    assert header(bindings) == ["NAME", "ROLE", "AGE", "USERS", "GROUPS", "SERVICEACCOUNTS"]
    r = row(bindings, "trainer-27")
    assert (r["ROLE"], r["USERS"], r["GROUPS"]) == ("Role/trainer-27", "bob", "")
    assert header(kubectl("get", "roles", "-n", "rbac").ok().stdout) == ["NAME", "CREATED AT"]
    assert row(kubectl("get", "clusterrolebindings").ok().stdout, "queues-33")["ROLE"] == "ClusterRole/queues-33"
    assert kubectl("auth", "can-i", "create", "pytorchjobs.kubeflow.org", "-n", "rbac").ok().stdout == "yes\n"

    # bob, with a token of his own: what the bindings above grant and nothing more.
    kubeconfig = tmp_path / "bob.kubeconfig"
    made = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", "token", "create", "--namespace", "rbac",
                           "--role", "view", "--user", "bob", "--write-kubeconfig", str(kubeconfig),
                           "--kubeconfig", cluster.kubeconfig], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    bob = Kubectl(kubectl.binary, str(kubeconfig), tempfile.mkdtemp(prefix="kubectl-home-"))
    assert bob("auth", "can-i", "create", "pytorchjobs.kubeflow.org").ok().stdout == "yes\n"
    assert bob("auth", "can-i", "list", "clusterqueues.kueue.x-k8s.io").ok().stdout == "yes\n"
    no = bob("auth", "can-i", "delete", "pytorchjobs.kubeflow.org")
    assert (no.returncode, no.stdout) == (1, "no\n")
    denied = bob("delete", "pytorchjob", "anything").failed()
    assert denied.stderr == (
        'Error from server (Forbidden): pytorchjobs.kubeflow.org "anything" is forbidden: User "bob" cannot '
        'delete resource "pytorchjobs" in API group "kubeflow.org" in the namespace "rbac"\n')


def test_can_i_as_another_user(kubectl: Kubectl) -> None:
    kubectl("create", "namespace", "impersonated").ok()
    kubectl("create", "role", "reader", "--verb=get", "--resource=pytorchjobs.kubeflow.org", "-n", "impersonated").ok()
    kubectl("create", "rolebinding", "reader", "--role=reader", "--user=carol", "-n", "impersonated").ok()
    as_carol = ("-n", "impersonated", "--as", "carol")
    assert kubectl("auth", "can-i", "get", "pytorchjobs.kubeflow.org", *as_carol).ok().stdout == "yes\n"
    no = kubectl("auth", "can-i", "delete", "pytorchjobs.kubeflow.org", *as_carol)
    assert (no.returncode, no.stdout) == (1, "no\n")


# --- the official Python client ---------------------------------------------------------------


def test_python_client_custom_objects_hpa_and_rbac(cluster: Cluster, kueue: str) -> None:
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    configuration = client.Configuration()
    config.load_kube_config(config_file=cluster.kubeconfig, client_configuration=configuration)
    with client.ApiClient(configuration) as api:
        custom = client.CustomObjectsApi(api)
        job = yaml.safe_load((EXAMPLES / "pytorchjob.yaml").read_text())
        job["metadata"]["name"] = "py-job"
        made = custom.create_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs", job)
        assert made["metadata"]["uid"] and made["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
        got = custom.get_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs", "py-job")
        assert got["metadata"]["uid"] == made["metadata"]["uid"]
        names = [j["metadata"]["name"] for j in
                 custom.list_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs")["items"]]
        assert "py-job" in names
        patched = custom.patch_namespaced_custom_object(
            "kubeflow.org", "v1", "default", "pytorchjobs", "py-job", {"metadata": {"labels": {"team": "vision"}}})
        assert patched["metadata"]["labels"] == {"team": "vision"}
        scale = custom.get_namespaced_custom_object_scale("kubeflow.org", "v1", "default", "pytorchjobs", "py-job")
        assert (scale["kind"], scale["spec"]["replicas"]) == ("Scale", 2)
        with pytest.raises(ApiException) as missing:
            custom.get_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs", "nope")
        assert missing.value.status == 404

        cq = custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta1", "clusterqueues", "research")
        assert cq["spec"]["cohort"] == "lab"
        patched = custom.patch_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta1", "clusterqueues", "research", {"spec": {"cohort": "lab-2"}})
        assert patched["spec"]["cohort"] == "lab-2"
        made = custom.create_cluster_custom_object("kueue.x-k8s.io", "v1beta1", "clusterqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": "py-cq"},
            "spec": {"cohort": "lab", "resourceGroups": cq["spec"]["resourceGroups"]}})
        assert made["metadata"]["name"] == "py-cq"
        listed = custom.list_cluster_custom_object("kueue.x-k8s.io", "v1beta1", "clusterqueues")["items"]
        assert {"research", "py-cq"} <= {q["metadata"]["name"] for q in listed}

        autoscaling = client.AutoscalingV2Api(api)
        hpa = autoscaling.create_namespaced_horizontal_pod_autoscaler("default", yaml.safe_load(
            HPA.replace("name: web\n", "name: py-hpa\n", 1)))
        assert isinstance(hpa, client.V2HorizontalPodAutoscaler)
        assert hpa.spec.metrics[0].resource.target.average_utilization == 50
        read = autoscaling.read_namespaced_horizontal_pod_autoscaler("py-hpa", "default")
        assert read.spec.scale_target_ref.name == "web" and read.spec.max_replicas == 3

        autoscaling_v1 = client.AutoscalingV1Api(api)
        made_v1 = autoscaling_v1.create_namespaced_horizontal_pod_autoscaler("default", client.V1HorizontalPodAutoscaler(
            metadata=client.V1ObjectMeta(name="py-hpa-v1"),
            spec=client.V1HorizontalPodAutoscalerSpec(
                scale_target_ref=client.V1CrossVersionObjectReference(api_version="apps/v1", kind="Deployment",
                                                                      name="web"),
                min_replicas=1, max_replicas=4, target_cpu_utilization_percentage=65)))
        assert isinstance(made_v1, client.V1HorizontalPodAutoscaler)
        assert made_v1.spec.target_cpu_utilization_percentage == 65
        read_v1 = autoscaling_v1.read_namespaced_horizontal_pod_autoscaler("py-hpa-v1", "default")
        assert (read_v1.spec.max_replicas, read_v1.spec.target_cpu_utilization_percentage) == (4, 65)
        listed_v1 = autoscaling_v1.list_namespaced_horizontal_pod_autoscaler("default").items
        assert {"py-hpa", "py-hpa-v1"} <= {h.metadata.name for h in listed_v1}
        assert next(h for h in listed_v1 if h.metadata.name == "py-hpa").spec.target_cpu_utilization_percentage == 50
        as_v2 = autoscaling.read_namespaced_horizontal_pod_autoscaler("py-hpa-v1", "default")
        assert as_v2.spec.metrics[0].resource.name == "cpu"
        assert as_v2.spec.metrics[0].resource.target.average_utilization == 65

        rbac = client.RbacAuthorizationV1Api(api)
        role = rbac.create_namespaced_role("default", client.V1Role(
            metadata=client.V1ObjectMeta(name="py-role"),
            rules=[client.V1PolicyRule(api_groups=["kubeflow.org"], resources=["pytorchjobs"], verbs=["get"])]))
        assert isinstance(role, client.V1Role) and role.rules[0].resources == ["pytorchjobs"]
        assert "py-role" in [r.metadata.name for r in rbac.list_namespaced_role("default").items]


# --- re-applying an unchanged manifest --------------------------------------------------------


def test_reapplying_the_training_and_queue_examples_changes_nothing(kubectl: Kubectl) -> None:
    # Custom resources keep quantities as sent (`nvidia.com/gpu: 1`, `nominalQuota: 2`), so
    # kubectl's JSON merge patch between the manifest and the live object comes out empty.
    kubectl("create", "namespace", "reapply").ok()
    training = ("-f", str(EXAMPLES / "pytorchjob.yaml"), "-n", "reapply")
    queues = ("-f", str(REPO / "examples" / "queues" / "teams.yaml"))
    assert kubectl("apply", *training).ok().stdout == "pytorchjob.kubeflow.org/mlp created\n"
    kubectl("apply", *queues).ok()
    live = json.loads(kubectl("get", "pytorchjob", "mlp", "-n", "reapply", "-o", "json").ok().stdout)
    worker = live["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"] == {"nvidia.com/gpu": 1}
    cq = json.loads(kubectl("get", "cq", "team-a", "-o", "json").ok().stdout)
    assert cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] == 2

    want_queues = [
        "namespace/team-a", "namespace/team-b", "resourceflavor.kueue.x-k8s.io/h100",
        "clusterqueue.kueue.x-k8s.io/team-a", "clusterqueue.kueue.x-k8s.io/team-b",
        "localqueue.kueue.x-k8s.io/gpus", "localqueue.kueue.x-k8s.io/gpus",
    ]
    for extra, suffix in (((), "unchanged"), (("--dry-run=server",), "unchanged (server dry run)")):
        assert kubectl("apply", *training, *extra).ok().stdout == f"pytorchjob.kubeflow.org/mlp {suffix}\n"
        assert kubectl("apply", *queues, *extra).ok().stdout.splitlines() == [f"{n} {suffix}" for n in want_queues]
