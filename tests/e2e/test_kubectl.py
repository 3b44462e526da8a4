"""The real kubectl against a real `gpufleet up`.

What each command must print is what it prints against a real cluster. The core flow runs
with the default kubectl (the SDK dispatcher, which picks 1.32 from the server's /version)
and again with the oldest and newest versioned binaries, because they differ in what they
send: 1.27 negotiates only v2beta1 aggregated discovery and validates through the protobuf
OpenAPI v2; 1.32 and later send typed-client bodies as protobuf.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest
import yaml
from e2e_helpers import (
    Kubectl,
    columns,
    deployment_yaml,
    kubectl_binary,
    namespace_yaml,
    pod_yaml,
    service_yaml,
    table,
    wait_for,
    write,
)

pytestmark = pytest.mark.e2e

POD_COLUMNS = ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
POD_WIDE_COLUMNS = POD_COLUMNS + ["IP", "NODE", "NOMINATED NODE", "READINESS GATES"]
DEPLOYMENT_COLUMNS = ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
DEPLOYMENT_WIDE_COLUMNS = DEPLOYMENT_COLUMNS + ["CONTAINERS", "IMAGES", "SELECTOR"]
NAMESPACE_COLUMNS = ["NAME", "STATUS", "AGE"]
SERVICE_COLUMNS = ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"]
NODE_COLUMNS = ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
NODE_WIDE_COLUMNS = NODE_COLUMNS + [
    "INTERNAL-IP",
    "EXTERNAL-IP",
    "OS-IMAGE",
    "KERNEL-VERSION",
    "CONTAINER-RUNTIME",
]


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(None, id="kubectl-1.32"),
        pytest.param("1.27", id="kubectl-1.27"),
        pytest.param("1.33", id="kubectl-1.33"),
    ],
)
def kc(request: pytest.FixtureRequest) -> Kubectl:
    binary = kubectl_binary(request.param)
    return request.getfixturevalue("kubectl_factory")(binary)


def prefix(kc: Kubectl) -> str:
    # Every binary works on its own objects in the one shared server.
    return f"k{kc.minor}"


def row(text: str, name: str, key: str = "NAME") -> dict[str, str]:
    for r in table(text):
        if r.get(key) == name:
            return r
    raise AssertionError(f"no row {key}={name} in:\n{text}")


def header(text: str) -> list[str]:
    return columns(text.splitlines()[0])


def node_yaml(name: str) -> str:
    return f"""apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels:
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
spec:
  # A Node object with no agent behind it: keep the scheduler from placing pods on it.
  taints:
  - {{key: gpufleet.io/e2e, value: paper-node, effect: NoSchedule}}
status:
  capacity: {{cpu: "16", memory: 64Gi, nvidia.com/gpu: "8"}}
  allocatable: {{cpu: "16", memory: 64Gi, nvidia.com/gpu: "8"}}
  addresses:
  - {{type: InternalIP, address: 10.0.0.7}}
"""


class Objects:
    def __init__(self, kc: Kubectl, root: Path) -> None:
        p = prefix(kc)
        self.deployment = f"{p}-web"
        self.service = f"{p}-web"
        self.pod = f"{p}-pod"
        self.namespace = f"{p}-team"
        self.node = f"{p}-gpu-node"
        files = [
            write(root, "deploy.yaml", deployment_yaml(self.deployment)),
            write(root, "svc.yaml", service_yaml(self.service, self.deployment)),
            write(root, "pod.yaml", pod_yaml(self.pod, labels={"app": self.pod, "tier": "cache"})),
            write(root, "ns.yaml", namespace_yaml(self.namespace)),
        ]
        self.create = kc("create", *[a for f in files for a in ("-f", f)])
        self.create_node = kc("create", "-f", write(root, "node.yaml", node_yaml(self.node)))


@pytest.fixture(scope="module")
def objs(kc: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Objects:
    return Objects(kc, tmp_path_factory.mktemp(f"objs-{prefix(kc)}"))


# --- core flow, every binary -----------------------------------------------------------------


def test_create_from_files(kc: Kubectl, objs: Objects) -> None:
    objs.create.ok()
    assert objs.create.stdout.splitlines() == [
        f"deployment.apps/{objs.deployment} created",
        f"service/{objs.service} created",
        f"pod/{objs.pod} created",
        f"namespace/{objs.namespace} created",
    ]
    assert objs.create.stderr == ""
    assert objs.create_node.ok().stdout == f"node/{objs.node} created\n"


def test_get_tables(kc: Kubectl, objs: Objects) -> None:
    pods = kc("get", "pods").ok().stdout
    assert header(pods) == POD_COLUMNS
    r = row(pods, objs.pod)
    assert (r["READY"], r["STATUS"], r["RESTARTS"]) == ("0/1", "Pending", "0")

    deps = kc("get", "deployments").ok().stdout
    assert header(deps) == DEPLOYMENT_COLUMNS
    r = row(deps, objs.deployment)
    # The controllers create the ReplicaSet at once (UP-TO-DATE 2) but nothing runs the pods here.
    assert (r["READY"], r["AVAILABLE"]) == ("0/2", "0")
    assert r["UP-TO-DATE"] in ("0", "2")

    nss = kc("get", "namespaces").ok().stdout
    assert header(nss) == NAMESPACE_COLUMNS
    assert row(nss, objs.namespace)["STATUS"] == "Active"
    assert row(nss, "default")["STATUS"] == "Active"

    svcs = kc("get", "services").ok().stdout
    assert header(svcs) == SERVICE_COLUMNS
    r = row(svcs, objs.service)
    assert (r["TYPE"], r["PORT(S)"]) == ("ClusterIP", "80/TCP")

    # Extra GPU columns are allowed, after Kubernetes' own so positions stay the same.
    nodes = kc("get", "nodes").ok().stdout
    assert header(nodes)[: len(NODE_COLUMNS)] == NODE_COLUMNS
    r = row(nodes, objs.node)
    assert r["STATUS"] == "Unknown"  # no Ready condition, as kubectl prints on a real cluster
    assert r["ROLES"] == "<none>"


def test_get_wide(kc: Kubectl, objs: Objects) -> None:
    pods = kc("get", "pods", "-o", "wide").ok().stdout
    assert header(pods)[: len(POD_WIDE_COLUMNS)] == POD_WIDE_COLUMNS
    r = row(pods, objs.pod)
    assert (r["IP"], r["NODE"], r["NOMINATED NODE"], r["READINESS GATES"]) == ("<none>",) * 4

    deps = kc("get", "deployments", "-o", "wide").ok().stdout
    assert header(deps) == DEPLOYMENT_WIDE_COLUMNS
    r = row(deps, objs.deployment)
    assert (r["CONTAINERS"], r["IMAGES"], r["SELECTOR"]) == ("main", "nginx:1.25", f"app={objs.deployment}")

    nodes = kc("get", "nodes", "-o", "wide").ok().stdout
    assert header(nodes)[: len(NODE_WIDE_COLUMNS)] == NODE_WIDE_COLUMNS
    assert row(nodes, objs.node)["INTERNAL-IP"] == "10.0.0.7"


def test_get_yaml_and_json(kc: Kubectl, objs: Objects) -> None:
    dep = yaml.safe_load(kc("get", "deployment", objs.deployment, "-o", "yaml").ok().stdout)
    assert (dep["apiVersion"], dep["kind"]) == ("apps/v1", "Deployment")
    meta = dep["metadata"]
    assert meta["name"] == objs.deployment and meta["namespace"] == "default"
    assert meta["uid"] and int(meta["resourceVersion"]) > 0 and meta["creationTimestamp"].endswith("Z")
    assert dep["spec"]["selector"] == {"matchLabels": {"app": objs.deployment}}
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"] == [{"containerPort": 8080, "name": "http", "protocol": "TCP"}]

    pod = json.loads(kc("get", "pod", objs.pod, "-o", "json").ok().stdout)
    assert (pod["apiVersion"], pod["kind"], pod["metadata"]["name"]) == ("v1", "Pod", objs.pod)
    assert pod["status"]["phase"] == "Pending"
    assert pod["spec"]["containers"][0]["command"] == ["sleep", "3600"]

    pods = json.loads(kc("get", "pods", "-o", "json").ok().stdout)
    assert pods["kind"] == "List" and pods["apiVersion"] == "v1"
    assert objs.pod in {p["metadata"]["name"] for p in pods["items"]}
    assert all(p["kind"] == "Pod" for p in pods["items"])

    names = kc("get", "pods", "-o", "name").ok().stdout.split()
    assert f"pod/{objs.pod}" in names


def test_get_selectors_and_all_namespaces(kc: Kubectl, objs: Objects, tmp_path: Path) -> None:
    other = f"{prefix(kc)}-other"
    kc("create", "-f", write(tmp_path, "p.yaml", pod_yaml(other, namespace=objs.namespace))).ok()

    selected = kc("get", "pods", "-l", f"app={objs.pod}").ok().stdout
    assert [r["NAME"] for r in table(selected)] == [objs.pod]
    assert [
        r["NAME"] for r in table(kc("get", "pods", "-l", f"tier in (cache),app={objs.pod}").ok().stdout)
    ] == [objs.pod]
    assert (
        kc("get", "pods", "-l", "app=nothing-has-this").ok().stderr
        == "No resources found in default namespace.\n"
    )

    everywhere = kc("get", "pods", "-A").ok().stdout
    assert header(everywhere) == ["NAMESPACE"] + POD_COLUMNS
    spots = {(r["NAMESPACE"], r["NAME"]) for r in table(everywhere)}
    assert {("default", objs.pod), (objs.namespace, other)} <= spots

    in_ns = kc("get", "pods", "-n", objs.namespace).ok().stdout
    assert [r["NAME"] for r in table(in_ns)] == [other]


def test_scale(kc: Kubectl, objs: Objects) -> None:
    out = kc("scale", "deployment", objs.deployment, "--replicas=3").ok()
    assert out.stdout == f"deployment.apps/{objs.deployment} scaled\n"
    got = kc("get", "deployment", objs.deployment, "-o", "jsonpath={.spec.replicas}").ok()
    assert got.stdout == "3"


def test_apply_creates_then_configures_with_strategic_merge(kc: Kubectl, tmp_path: Path) -> None:
    name = f"{prefix(kc)}-app"
    path = write(tmp_path, "app.yaml", deployment_yaml(name, replicas=1))
    assert kc("apply", "-f", path).ok().stdout == f"deployment.apps/{name} created\n"
    assert kc("apply", "-f", path).ok().stdout == f"deployment.apps/{name} unchanged\n"

    write(tmp_path, "app.yaml", deployment_yaml(name, replicas=1, image="nginx:1.26"))
    changed = kc("apply", "-f", path).ok()
    assert changed.stdout == f"deployment.apps/{name} configured\n"
    assert changed.stderr == ""

    live = json.loads(kc("get", "deployment", name, "-o", "json").ok().stdout)
    (container,) = live["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "nginx:1.26"
    # A merge patch would have replaced the container list and lost the ports.
    assert container["ports"] == [{"containerPort": 8080, "name": "http", "protocol": "TCP"}]
    last = json.loads(live["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
    assert last["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.26"
    assert kc("apply", "-f", path).ok().stdout == f"deployment.apps/{name} unchanged\n"


def test_apply_server_side(kc: Kubectl, tmp_path: Path) -> None:
    name = f"{prefix(kc)}-ssa"
    path = write(tmp_path, "pod.yaml", pod_yaml(name))
    assert kc("apply", "--server-side", "-f", path).ok().stdout == f"pod/{name} serverside-applied\n"
    write(tmp_path, "pod.yaml", pod_yaml(name, labels={"app": name, "stage": "two"}))
    assert kc("apply", "--server-side", "-f", path).ok().stdout == f"pod/{name} serverside-applied\n"
    labels = json.loads(kc("get", "pod", name, "-o", "jsonpath={.metadata.labels}").ok().stdout)
    assert labels == {"app": name, "stage": "two"}


def test_label_and_annotate(kc: Kubectl, objs: Objects) -> None:
    pod = objs.pod
    assert kc("label", "pod", pod, "owner=ml").ok().stdout == f"pod/{pod} labeled\n"
    # kubectl 1.27 printed "annotate" here; later versions "annotated".
    annotated = "annotate" if kc.minor == "27" else "annotated"
    assert kc("annotate", "pod", pod, "note=hello").ok().stdout == f"pod/{pod} {annotated}\n"
    meta = json.loads(kc("get", "pod", pod, "-o", "json").ok().stdout)["metadata"]
    assert meta["labels"]["owner"] == "ml" and meta["annotations"]["note"] == "hello"

    refused = kc("label", "pod", pod, "owner=web").failed()
    assert "already has a value (ml)" in refused.stderr
    kc("label", "pod", pod, "owner=web", "--overwrite").ok()

    assert kc("label", "pod", pod, "owner-").ok().stdout == f"pod/{pod} unlabeled\n"
    assert kc("annotate", "pod", pod, "note-").ok().stdout == f"pod/{pod} {annotated}\n"
    meta = json.loads(kc("get", "pod", pod, "-o", "json").ok().stdout)["metadata"]
    assert "owner" not in meta["labels"]
    assert "note" not in (meta.get("annotations") or {})


def assert_events_section_last(text: str) -> None:
    """describe ends with its Events section: `Events: <none>` or a table of events."""
    lines = text.rstrip().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Events:")]
    assert starts, text
    tail = lines[starts[-1] + 1:]
    assert lines[starts[-1]].strip() == "Events: <none>" and not tail or all(
        line.startswith("  ") for line in tail), text


def test_describe(kc: Kubectl, objs: Objects) -> None:
    pod = kc("describe", "pod", objs.pod).ok()
    assert pod.stderr == ""
    assert re.search(rf"^Name:\s+{objs.pod}$", pod.stdout, re.M)
    assert re.search(r"^Status:\s+Pending$", pod.stdout, re.M)
    assert re.search(r"^\s+Image:\s+busybox:1.36$", pod.stdout, re.M)
    assert_events_section_last(pod.stdout)

    dep = kc("describe", "deployment", objs.deployment).ok()
    assert dep.stderr == ""
    assert re.search(rf"^Name:\s+{objs.deployment}$", dep.stdout, re.M)
    assert re.search(rf"^Selector:\s+app={objs.deployment}$", dep.stdout, re.M)
    assert re.search(r"^Replicas:\s+\d+ desired \|", dep.stdout, re.M)
    assert_events_section_last(dep.stdout)


def test_delete(kc: Kubectl, tmp_path: Path) -> None:
    dep, pod = f"{prefix(kc)}-gone", f"{prefix(kc)}-gone-pod"
    kc(
        "create",
        "-f",
        write(tmp_path, "d.yaml", deployment_yaml(dep)),
        "-f",
        write(tmp_path, "p.yaml", pod_yaml(pod)),
    ).ok()

    assert kc("delete", "deployment", dep).ok().stdout == f'deployment.apps "{dep}" deleted\n'
    gone = kc("get", "deployment", dep).failed()
    assert gone.stderr == f'Error from server (NotFound): deployments.apps "{dep}" not found\n'

    assert kc("delete", "pod", pod).ok().stdout == f'pod "{pod}" deleted\n'
    assert kc("get", "pod", pod).failed().stderr == f'Error from server (NotFound): pods "{pod}" not found\n'


def test_delete_namespace_empties_and_finalizes_it(kc: Kubectl, tmp_path: Path) -> None:
    ns, pod = f"{prefix(kc)}-doomed", f"{prefix(kc)}-inside"
    kc("create", "-f", write(tmp_path, "ns.yaml", namespace_yaml(ns))).ok()
    kc("create", "-f", write(tmp_path, "p.yaml", pod_yaml(pod, namespace=ns))).ok()
    # Kubernetes defaults this on create; it is what keeps the namespace until it is empty.
    finalizers = kc("get", "namespace", ns, "-o", "jsonpath={.spec.finalizers}").ok().stdout

    deleted = kc("delete", "namespace", ns, timeout=45).ok()
    assert deleted.stdout == f'namespace "{ns}" deleted\n'
    # kubectl waited for the namespace to disappear, which may only happen once it is empty.
    assert kc("get", "namespace", ns).failed().stderr == (
        f'Error from server (NotFound): namespaces "{ns}" not found\n'
    )
    orphan = kc("get", "pod", pod, "-n", ns)
    assert orphan.returncode != 0, (
        f"the pod outlived its namespace (spec.finalizers was {finalizers!r}):\n{orphan}"
    )
    # kubectl looks the namespace up itself after a 404 and reports that instead.
    assert orphan.stderr == f'Error from server (NotFound): namespaces "{ns}" not found\n'
    assert json.loads(finalizers or "null") == ["kubernetes"]


def test_get_missing_object(kc: Kubectl) -> None:
    missing = kc("get", "pod", "nope")
    assert missing.returncode == 1, str(missing)
    assert missing.stdout == ""
    assert missing.stderr == 'Error from server (NotFound): pods "nope" not found\n'


def test_imperative_create(kc: Kubectl) -> None:
    # kubectl 1.32+ sends these typed-client bodies as application/vnd.kubernetes.protobuf.
    name = f"{prefix(kc)}-imp"
    assert kc("create", "namespace", name).ok().stdout == f"namespace/{name} created\n"
    made = kc("create", "deployment", name, "--image=nginx:1.25", "--replicas=2").ok()
    assert made.stdout == f"deployment.apps/{name} created\n"
    assert kc("create", "configmap", name, "--from-literal=k=v").ok().stdout == f"configmap/{name} created\n"
    got = json.loads(kc("get", "deployment", name, "-o", "json").ok().stdout)
    assert got["spec"]["replicas"] == 2
    assert got["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.25"


# --- default kubectl only ---------------------------------------------------------------------


def test_version(kubectl: Kubectl) -> None:
    out = kubectl("version").ok().stdout
    assert re.search(r"^Server Version: v1\.32\.\d+$", out, re.M), out
    info = json.loads(kubectl("version", "-o", "json").ok().stdout)
    assert (info["serverVersion"]["major"], info["serverVersion"]["minor"]) == ("1", "32")
    # The dispatcher runs the kubectl.1.<minor> that matches the server's minor version.
    assert info["clientVersion"]["gitVersion"].startswith("v1.32."), info["clientVersion"]


def test_api_resources(kubectl: Kubectl) -> None:
    out = kubectl("api-resources").ok().stdout
    assert header(out) == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    want = {
        "pods": ("po", "v1", "true", "Pod"),
        "deployments": ("deploy", "apps/v1", "true", "Deployment"),
        "namespaces": ("ns", "v1", "false", "Namespace"),
        "nodes": ("no", "v1", "false", "Node"),
        "services": ("svc", "v1", "true", "Service"),
    }
    for name, cells in want.items():
        r = row(out, name)
        assert (r["SHORTNAMES"], r["APIVERSION"], r["NAMESPACED"], r["KIND"]) == cells, r
    assert kubectl("get", "deploy", "-o", "name").ok()


def test_explain(kubectl: Kubectl) -> None:
    out = kubectl("explain", "deployment.spec.replicas").ok().stdout
    assert re.search(r"^KIND:\s+Deployment$", out, re.M), out
    assert re.search(r"^VERSION:\s+v1$", out, re.M), out
    assert "FIELD: replicas <integer>" in out
    spec = kubectl("explain", "deployment.spec").ok().stdout
    for field in (
        "replicas\t<integer>",
        "selector\t<LabelSelector> -required-",
        "template\t<PodTemplateSpec> -required-",
    ):
        assert field in spec, spec


def test_explain_shows_field_descriptions(kubectl: Kubectl) -> None:
    out = kubectl("explain", "deployment.spec.replicas").ok().stdout
    assert "Number of desired pods" in out, out


def test_create_twice_already_exists(kubectl: Kubectl, tmp_path: Path) -> None:
    path = write(tmp_path, "dup.yaml", deployment_yaml("dup"))
    kubectl("create", "-f", path).ok()
    again = kubectl("create", "-f", path).failed()
    assert again.stderr == (
        f'Error from server (AlreadyExists): error when creating "{path}": deployments.apps "dup" already exists\n'
    )


def test_invalid_deployment(kubectl: Kubectl, tmp_path: Path) -> None:
    path = write(tmp_path, "bad.yaml", deployment_yaml("x", replicas=-1))
    bad = kubectl("create", "-f", path).failed()
    assert (
        bad.stderr
        == 'The Deployment "x" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0\n'
    )
    assert kubectl("get", "deployment", "x").failed()


def test_unknown_field_is_a_strict_decoding_error(kubectl: Kubectl, tmp_path: Path) -> None:
    path = write(tmp_path, "unk.yaml", deployment_yaml("unk", extra_spec="\n  bogus: 1"))
    bad = kubectl("create", "-f", path, "-v=6").failed()
    posts = [ln for ln in bad.stderr.splitlines() if "POST " in ln and "/deployments" in ln]
    assert posts and "fieldValidation=Strict" in posts[0], bad.stderr
    assert (
        f'Error from server (BadRequest): error when creating "{path}": Deployment in version "v1" cannot be '
        f'handled as a Deployment: strict decoding error: unknown field "spec.bogus"'
    ) in bad.stderr.splitlines()

    warned = kubectl("create", "-f", path, "--validate=warn").ok()
    assert warned.stderr == 'Warning: unknown field "spec.bogus"\n'
    assert warned.stdout == "deployment.apps/unk created\n"


def test_emptied_label_and_annotation_maps_are_omitted(kubectl: Kubectl, tmp_path: Path) -> None:
    # Kubernetes drops empty maps when it stores an object (Go's omitempty). A ConfigMap, so no
    # controller or scheduler writes to the object meanwhile.
    cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bare\n  labels: {only: one}\ndata: {k: v}\n"
    kubectl("create", "-f", write(tmp_path, "cm.yaml", cm)).ok()
    kubectl("annotate", "configmap", "bare", "note=x").ok()
    kubectl("label", "configmap", "bare", "only-").ok()
    kubectl("annotate", "configmap", "bare", "note-").ok()
    meta = json.loads(kubectl("get", "configmap", "bare", "-o", "json").ok().stdout)["metadata"]
    assert "labels" not in meta and "annotations" not in meta, meta


def test_service_gets_a_cluster_ip(kubectl: Kubectl, tmp_path: Path) -> None:
    kubectl("create", "-f", write(tmp_path, "svc.yaml", service_yaml("ip-svc", "whatever"))).ok()
    ip = kubectl("get", "service", "ip-svc", "-o", "jsonpath={.spec.clusterIP}").ok().stdout
    assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", ip), f"spec.clusterIP is {ip!r}"
    assert row(kubectl("get", "service", "ip-svc").ok().stdout, "ip-svc")["CLUSTER-IP"] == ip


def test_server_side_apply_conflicts_between_managers(kubectl: Kubectl, tmp_path: Path) -> None:
    cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owned\ndata:\n  a: {}\n"
    kubectl(
        "apply", "--server-side", "--field-manager=alice", "-f", write(tmp_path, "1.yaml", cm.format('"1"'))
    ).ok()
    path = write(tmp_path, "2.yaml", cm.format('"2"'))
    clash = kubectl("apply", "--server-side", "--field-manager=bob", "-f", path)
    assert clash.returncode != 0, f"bob took alice's field without --force-conflicts:\n{clash}"
    assert 'Apply failed with 1 conflict: conflict with "alice": .data.a' in clash.stderr
    kubectl("apply", "--server-side", "--field-manager=bob", "--force-conflicts", "-f", path).ok()
    assert kubectl("get", "configmap", "owned", "-o", "jsonpath={.data.a}").ok().stdout == "2"


def test_server_side_apply_removes_fields_the_manager_dropped(kubectl: Kubectl, tmp_path: Path) -> None:
    both = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shrink\ndata:\n  a: '1'\n  b: '2'\n"
    path = write(tmp_path, "cm.yaml", both)
    kubectl("apply", "--server-side", "-f", path).ok()
    write(tmp_path, "cm.yaml", both.replace("  b: '2'\n", ""))
    kubectl("apply", "--server-side", "-f", path).ok()
    data = json.loads(kubectl("get", "configmap", "shrink", "-o", "jsonpath={.data}").ok().stdout)
    assert data == {"a": "1"}


def test_get_watch_shows_a_scale(kubectl: Kubectl, tmp_path: Path) -> None:
    name = "watched"
    kubectl("create", "-f", write(tmp_path, "d.yaml", deployment_yaml(name, replicas=1))).ok()
    watcher = kubectl.popen("get", "deployments", "-w")
    lines: list[str] = []

    def read() -> None:
        for line in watcher.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: any(ln.split()[:2] == [name, "0/1"] for ln in list(lines)),
            timeout=15,
            what="the watch's initial list",
        )
        assert columns(lines[0]) == DEPLOYMENT_COLUMNS
        started = time.monotonic()
        kubectl("scale", "deployment", name, "--replicas=4").ok()
        wait_for(
            lambda: any(ln.split()[:2] == [name, "0/4"] for ln in list(lines)),
            timeout=5,
            what=f"a watch row for {name} at 0/4; got {lines}",
        )
        assert time.monotonic() - started < 5
        assert watcher.poll() is None, "kubectl get -w exited while the server should hold the stream open"
    finally:
        watcher.kill()
        watcher.wait()
        reader.join(timeout=5)
    assert watcher.stderr.read() == ""
