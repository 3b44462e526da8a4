"""The client commands as users run them: the real `gpufleet` console command in a
subprocess, against a control plane started with `gpufleet up` in another one."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

NS = "cli-e2e"


def _gpufleet() -> list[str]:
    script = Path(sys.executable).parent / "gpufleet"
    if script.exists():
        return [str(script)]
    found = shutil.which("gpufleet")
    return [found] if found else [sys.executable, "-m", "gpufleet.cli.main"]


class Cluster:
    def __init__(self, home: Path, url: str) -> None:
        self.home = home
        self.url = url
        self.env = {**os.environ, "HOME": str(home), "KUBECONFIG": str(home / "state" / "kubeconfig")}

    def run(self, *args: str, input: str | None = None, ok: bool | None = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([*_gpufleet(), *args], input=input, capture_output=True, text=True,
                              env=env or self.env, timeout=120, cwd=self.home)
        assert "Traceback" not in proc.stderr, proc.stderr
        if ok is True:
            assert proc.returncode == 0, f"{args}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        elif ok is False:
            assert proc.returncode != 0, f"{args}: expected a failure\n{proc.stdout}\n{proc.stderr}"
        return proc

    def write(self, name: str, text: str) -> Path:
        path = self.home / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    home = tmp_path_factory.mktemp("cli-e2e")
    state = home / "state"
    out_path, err_path = home / "up.out", home / "up.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        server = subprocess.Popen([*_gpufleet(), "up", "--state-dir", str(state), "--port", "0", "--gateway-port", "0"],
                                  stdout=out, stderr=err, env={**os.environ, "HOME": str(home)})
    try:
        url = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and url is None:
            m = re.search(r"API server listening on (https?://\S+)", out_path.read_text())
            if m:
                url = m.group(1)
                break
            if server.poll() is not None:
                pytest.fail(f"gpufleet up exited with {server.returncode}:\n{err_path.read_text()}")
            time.sleep(0.2)
        if url is None:
            pytest.fail(f"gpufleet up did not start in time:\n{err_path.read_text()}")
        c = Cluster(home, url)
        c.write("ns.yaml", f"""\
            apiVersion: v1
            kind: Namespace
            metadata: {{name: {NS}}}
            """)
        c.run("apply", "-f", "ns.yaml")
        yield c
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _deployment(name: str, replicas: int = 1, labels: str = "{app: web}", namespace: str = NS) -> str:
    return textwrap.dedent(f"""\
        apiVersion: apps/v1
        kind: Deployment
        metadata:
          name: {name}
          namespace: {namespace}
          labels: {labels}
        spec:
          replicas: {replicas}
          selector: {{matchLabels: {{app: {name}}}}}
          template:
            metadata: {{labels: {{app: {name}}}}}
            spec:
              containers:
              - name: main
                image: python:3.11-slim
                ports: [{{containerPort: 8080}}]
                resources: {{requests: {{cpu: 100m}}}}
        """)


def _get_json(cluster: Cluster, *args: str) -> dict:
    return json.loads(cluster.run("get", *args, "-o", "json").stdout)


def test_version(cluster):
    out = cluster.run("version").stdout
    assert "Client Version: v" in out
    assert re.search(r"Server Version: v\d+\.\d+", out)


def test_apply_creates_then_configures_then_reports_unchanged(cluster):
    # Files in a directory, namespace last by name: apply still creates the namespace first.
    cluster.write("app/a-deploy.yaml", _deployment("web", labels="{app: web, tier: fe}", namespace="cli-e2e-app"))
    cluster.write("app/b-svc.json", json.dumps({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "cli-e2e-app"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}))
    cluster.write("app/z-ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: cli-e2e-app}\n")
    cluster.write("app/README.md", "not a manifest")
    first = cluster.run("apply", "-f", "app").stdout.splitlines()
    assert first == ["namespace/cli-e2e-app created", "service/web created", "deployment.apps/web created"]

    again = cluster.run("apply", "-f", "app").stdout.splitlines()
    assert again == ["namespace/cli-e2e-app unchanged", "service/web unchanged", "deployment.apps/web unchanged"]

    cluster.write("app/a-deploy.yaml", _deployment("web", replicas=3, labels="{app: web}", namespace="cli-e2e-app"))
    changed = cluster.run("apply", "-f", "app").stdout.splitlines()
    assert changed == ["namespace/cli-e2e-app unchanged", "service/web unchanged", "deployment.apps/web configured"]
    live = _get_json(cluster, "deploy", "web", "-n", "cli-e2e-app")
    assert live["spec"]["replicas"] == 3
    # The label dropped from the manifest is dropped from the object.
    assert live["metadata"]["labels"] == {"app": "web"}
    assert "kubectl.kubernetes.io/last-applied-configuration" in live["metadata"]["annotations"]


def test_apply_from_stdin(cluster):
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: from-stdin}\ndata: {k: v}\n"
    out = cluster.run("apply", "-f", "-", "-n", NS, input=manifest).stdout
    assert out.strip() == "configmap/from-stdin created"
    assert _get_json(cluster, "cm", "from-stdin", "-n", NS)["data"] == {"k": "v"}


def test_bad_manifest_names_file_document_and_field(cluster):
    documents = [
        f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: good-one, namespace: {NS}}}\ndata: {{a: b}}\n",
        _deployment("bad", replicas=-1),
        "apiVersion: example.com/v1\nkind: Gizmo\nmetadata: {name: g}\n",
        "kind: ConfigMap\nmetadata: {name: no-version}\n",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: [broken\n",
    ]
    (cluster.home / "bad.yaml").write_text("---\n".join(documents))
    proc = cluster.run("apply", "-f", "bad.yaml", ok=False)
    assert proc.stdout.strip() == "configmap/good-one created"
    err = proc.stderr
    assert ('error: bad.yaml (document 2): Deployment "bad": spec.replicas: Invalid value: -1: '
            "must be greater than or equal to 0") in err
    assert 'error: bad.yaml (document 3): Gizmo "g": no matches for kind "Gizmo" in version "example.com/v1"' in err
    assert "error: bad.yaml (document 4): apiVersion not set" in err
    assert "error: bad.yaml (document 5): YAML syntax error at line" in err

    cluster.write("typo.yaml", _deployment("typo").replace("replicas:", "replicaz:"))
    typo = cluster.run("apply", "-f", "typo.yaml", ok=False)
    assert 'typo.yaml (document 1): Deployment "typo": spec.replicaz' in typo.stderr


def test_get_table_yaml_selectors_and_all_namespaces(cluster):
    cluster.write("get/web.yaml", _deployment("getweb", labels="{app: getweb, team: a}"))
    cluster.write("get/other.yaml", _deployment("getother", labels="{app: getother, team: b}"))
    cluster.run("apply", "-f", "get")

    lines = cluster.run("get", "deployments", "-n", NS).stdout.splitlines()
    assert lines[0].split()[:2] == ["NAME", "READY"]
    names = {line.split()[0] for line in lines[1:]}
    assert {"getweb", "getother"} <= names

    one = yaml.safe_load(cluster.run("get", "deploy", "getweb", "-n", NS, "-o", "yaml").stdout)
    assert one["kind"] == "Deployment" and one["metadata"]["name"] == "getweb"

    listing = yaml.safe_load(cluster.run("get", "deploy", "-n", NS, "-l", "team=a", "-o", "yaml").stdout)
    assert listing["kind"] == "List"
    assert [i["metadata"]["name"] for i in listing["items"]] == ["getweb"]
    assert listing["items"][0]["kind"] == "Deployment"

    assert cluster.run("get", "deploy", "-n", NS, "-l", "team=b", "-o", "name").stdout.split() == [
        "deployment.apps/getother"]

    empty = cluster.run("get", "deploy", "-n", NS, "-l", "team=nobody")
    assert empty.stdout == ""
    assert empty.stderr.strip() == f"No resources found in {NS} namespace."

    wide = cluster.run("get", "deploy", "-A", "-l", "team", "-o", "wide", "--show-labels").stdout.splitlines()
    header = wide[0].split()
    assert header[0] == "NAMESPACE" and header[1] == "NAME" and header[-1] == "LABELS"
    assert len(header) > len(lines[0].split()) + 2  # the wide columns are there
    rows = {tuple(line.split()[:2]) for line in wide[1:]}
    assert {(NS, "getweb"), (NS, "getother")} <= rows

    several = cluster.run("get", "deploy,svc", "-n", "cli-e2e-app").stdout
    assert "deployment.apps/web" in several and "service/web" in several

    missing = cluster.run("get", "deploy", "nope", "-n", NS, ok=False)
    assert missing.stderr.strip() == 'Error from server (NotFound): deployments.apps "nope" not found'
    unknown = cluster.run("get", "gizmos", ok=False)
    assert unknown.stderr.strip() == 'error: the server doesn\'t have a resource type "gizmos"'


def test_describe_shows_details_and_events(cluster):
    cluster.write("describe/pod.yaml", f"""\
        apiVersion: v1
        kind: Pod
        metadata: {{name: trainer, namespace: {NS}, labels: {{job: t}}}}
        spec:
          containers:
          - name: main
            image: pytorch:2
            ports: [{{containerPort: 29500}}]
            resources:
              requests: {{cpu: "2", nvidia.com/gpu: 8}}
              limits: {{nvidia.com/gpu: 8}}
        """)
    cluster.run("apply", "-f", "describe/pod.yaml")
    uid = _get_json(cluster, "pod", "trainer", "-n", NS)["metadata"]["uid"]
    cluster.write("describe/event.yaml", f"""\
        apiVersion: v1
        kind: Event
        metadata: {{name: trainer.1, namespace: {NS}}}
        involvedObject: {{apiVersion: v1, kind: Pod, name: trainer, namespace: {NS}, uid: {uid}}}
        type: Warning
        reason: FailedScheduling
        message: "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
        source: {{component: gpufleet-scheduler}}
        """)
    cluster.run("apply", "-f", "describe/event.yaml")

    text = cluster.run("describe", "pod", "trainer", "-n", NS).stdout
    assert re.search(r"^Name:\s+trainer$", text, re.M)
    assert re.search(rf"^Namespace:\s+{NS}$", text, re.M)
    assert re.search(r"^Labels:\s+job=t$", text, re.M)
    assert re.search(r"^Status:\s+\w+", text, re.M)
    assert re.search(r"^\s+Image:\s+pytorch:2$", text, re.M)
    assert re.search(r"^\s+nvidia.com/gpu:\s+8$", text, re.M)
    assert "Events:" in text
    events = text[text.index("Events:"):]
    assert re.search(r"Type\s+Reason\s+Age\s+From\s+Message", events)
    assert re.search(r"Warning\s+FailedScheduling\s+\S+\s+gpufleet-scheduler\s+0/4 nodes are available", events)

    cluster.run("apply", "-f", "get")
    deploy = cluster.run("describe", "deployment", "getweb", "-n", NS).stdout
    assert re.search(r"^Replicas:\s+1 desired \|", deploy, re.M)
    assert re.search(r"^Events:", deploy, re.M)

    missing = cluster.run("describe", "pod", "nope", "-n", NS, ok=False)
    assert 'pods "nope" not found' in missing.stderr


def test_scale_through_the_scale_subresource(cluster):
    cluster.write("scale.yaml", _deployment("scaled", replicas=1))
    cluster.run("apply", "-f", "scale.yaml")
    assert cluster.run("scale", "deployment/scaled", "--replicas", "4", "-n", NS).stdout.strip() == \
        "deployment.apps/scaled scaled"
    assert _get_json(cluster, "deploy", "scaled", "-n", NS)["spec"]["replicas"] == 4
    assert cluster.run("scale", "deploy", "scaled", "--replicas=2", "-n", NS).stdout.strip() == \
        "deployment.apps/scaled scaled"
    assert _get_json(cluster, "deploy", "scaled", "-n", NS)["spec"]["replicas"] == 2
    # An apply that does not mention replicas again would not undo this; one that does, does.
    missing = cluster.run("scale", "deploy/ghost", "--replicas", "1", "-n", NS, ok=False)
    assert 'deployments.apps "ghost" not found' in missing.stderr


def test_delete_by_name_file_and_label(cluster):
    cluster.write("del/a.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: del-a, labels: {grp: x}}\n")
    cluster.write("del/b.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: del-b, labels: {grp: x}}\n")
    cluster.write("del/c.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: del-c}\n")
    cluster.run("apply", "-f", "del", "-n", NS)

    assert cluster.run("delete", "configmap", "del-c", "-n", NS).stdout.strip() == 'configmap "del-c" deleted'
    gone = cluster.run("get", "cm", "del-c", "-n", NS, ok=False)
    assert gone.stderr.strip() == 'Error from server (NotFound): configmaps "del-c" not found'

    out = cluster.run("delete", "cm", "-l", "grp=x", "-n", NS).stdout.splitlines()
    assert sorted(out) == ['configmap "del-a" deleted', 'configmap "del-b" deleted']

    cluster.run("apply", "-f", "del/a.yaml", "-n", NS)
    assert cluster.run("delete", "-f", "del/a.yaml", "-n", NS, "--cascade=background").stdout.strip() == \
        'configmap "del-a" deleted'

    again = cluster.run("delete", "cm", "del-a", "-n", NS, ok=False)
    assert 'configmaps "del-a" not found' in again.stderr
    cluster.run("delete", "cm", "del-a", "-n", NS, "--ignore-not-found")


def test_delete_waits_for_finalizers(cluster):
    cluster.write("held.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: held, finalizers: [example.com/x]}\n")
    cluster.run("apply", "-f", "held.yaml", "-n", NS)
    timed_out = cluster.run("delete", "cm", "held", "-n", NS, "--timeout", "2s", ok=False)
    assert timed_out.stdout.strip() == 'configmap "held" deleted'
    assert "timed out waiting for the condition on configmaps/held" in timed_out.stderr

    waiter = subprocess.Popen([*_gpufleet(), "delete", "cm", "held", "-n", NS, "--timeout", "60s"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env)
    time.sleep(3)
    assert waiter.poll() is None  # still waiting: the finalizer holds the object
    cluster.write("held.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: held, finalizers: []}\n")
    cluster.run("apply", "-f", "held.yaml", "-n", NS)
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, err
    assert out.strip() == 'configmap "held" deleted'


def test_get_watch_prints_changes(cluster):
    watcher = subprocess.Popen([*_gpufleet(), "get", "configmaps", "-n", NS, "-w", "-l", "watched=yes"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env)
    try:
        time.sleep(3)
        cluster.write("watched.yaml",
                      "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: watched, labels: {watched: 'yes'}}\n")
        cluster.run("apply", "-f", "watched.yaml", "-n", NS)
        line = ""
        deadline = time.monotonic() + 30
        while "watched" not in line and time.monotonic() < deadline:
            line = watcher.stdout.readline()
        assert line.split()[0] == "watched"
    finally:
        watcher.send_signal(signal.SIGINT)
        _, err = watcher.communicate(timeout=15)
    assert "Traceback" not in err


def test_connection_refused_is_one_clear_line(cluster, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "x", "user": {}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
    }))
    proc = cluster.run("get", "pods", "--kubeconfig", str(kubeconfig), ok=False)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "http://127.0.0.1:9" in lines[0] and "gpufleet up" in lines[0]


_CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
              colors: {type: array, items: {type: string}}
"""


def _value(text: str, key: str) -> str:
    m = re.search(rf"^{re.escape(key)}:\s+(.*)$", text, re.M)
    assert m, f"{key!r} not in\n{text}"
    return m.group(1).strip()


def test_get_and_describe_a_custom_resource(cluster):
    # The kind is not built in: the CLI finds it through the server's discovery.
    cluster.write("kinds/crd.yaml", _CRD)
    cluster.run("apply", "-f", "kinds/crd.yaml")
    cluster.write("kinds/widget.yaml", f"""\
        apiVersion: example.com/v1
        kind: Widget
        metadata: {{name: w1, namespace: {NS}, labels: {{team: a}}}}
        spec: {{size: 3, colors: [red, blue]}}
        """)
    cluster.run("apply", "-f", "kinds/widget.yaml")

    listed = cluster.run("get", "widgets", "-n", NS).stdout.splitlines()
    # The CRD's printer columns (no AGE: a CRD that lists columns gets only those, as in Kubernetes).
    assert listed[0].split() == ["NAME", "SIZE"] and listed[1].split()[:2] == ["w1", "3"], listed
    uid = _get_json(cluster, "widget", "w1", "-n", NS)["metadata"]["uid"]
    cluster.write("kinds/event.yaml", f"""\
        apiVersion: v1
        kind: Event
        metadata: {{name: w1.1, namespace: {NS}}}
        involvedObject: {{apiVersion: example.com/v1, kind: Widget, name: w1, namespace: {NS}, uid: {uid}}}
        type: Normal
        reason: Polished
        message: "widget polished"
        source: {{component: widget-operator}}
        """)
    cluster.run("apply", "-f", "kinds/event.yaml")
    widget = cluster.run("describe", "widget", "w1", "-n", NS).stdout
    assert (_value(widget, "API Version"), _value(widget, "Kind"), _value(widget, "Labels")) == (
        "example.com/v1", "Widget", "team=a")
    assert re.search(r"^Metadata:\n\s+Creation Timestamp:", widget, re.M) and re.search(r"^\s+UID:\s+" + uid, widget, re.M)
    assert re.search(r"^Spec:\n\s+Colors:\s+red, blue\n\s+Size:\s+3$", widget, re.M), widget
    assert re.search(r"Normal\s+Polished\s+\S+\s+widget-operator\s+widget polished", widget)
