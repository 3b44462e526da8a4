"""kubectl's loop against real pods: `gpufleet up` with its local agent (process runtime, on
the node's network, so each pod's container port is bound on a host port the agent chose)
serves two pods, and

- `kubectl get --raw .../services/NAME:PORT/proxy/...` and `.../pods/NAME:PORT/proxy/...`
  return the pod's own answer, relayed by the agent over its authenticated port; a view
  token is refused (services/proxy), a Service without endpoints is kube-apiserver's 503;
- an Ingress applied with kubectl routes host and path through the gateway to the two
  Services (real HTTP), and kubectl shows its class and the gateway's address;
- `kubectl describe ingress` and `describe service` (1.32 and 1.33; the first reads the
  backends' EndpointSlices) show each backend's pod address;
- a NetworkPolicy is accepted with kubectl's `Warning:` line that it is not enforced;
- `kubectl events` and `kubectl get events.events.k8s.io` list what happened to the pods.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import Kubectl, kubectl_binary
from test_pod_contract import Plane, running_plane

pytestmark = pytest.mark.e2e

NS = "proxied"
# Answers "<name> <method> <path>" on $PORT (the host port the agent gave container port 8000).
SERVER = """
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode()
        text = f"{os.environ['NAME']} {self.command} {self.path} {body}".strip().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)
    do_GET = do_POST = answer
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("", int(os.environ["PORT"])), H).serve_forever()
"""


def manifests() -> str:
    docs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}]
    for app in ("front", "api"):
        docs.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{app}-0", "namespace": NS,
                                                                    "labels": {"app": app}},
                     "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                         "name": "web", "image": "python:3.12", "command": [sys.executable, "-u", "-c", SERVER],
                         "env": [{"name": "NAME", "value": app}],
                         "ports": [{"name": "http", "containerPort": 8000}],
                         "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}}]}})
        docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": app, "namespace": NS},
                     "spec": {"selector": {"app": app}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
    docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "empty", "namespace": NS},
                 "spec": {"selector": {"app": "nobody"}, "ports": [{"port": 80}]}})
    docs.append({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "site", "namespace": NS},
                 "spec": {"rules": [{"host": "shop.example.com", "http": {"paths": [
                     {"path": "/", "pathType": "Prefix",
                      "backend": {"service": {"name": "front", "port": {"number": 80}}}},
                     {"path": "/api", "pathType": "Prefix",
                      "backend": {"service": {"name": "api", "port": {"name": "http"}}}}]}}]}})
    return yaml.safe_dump_all(docs)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with running_plane(tmp_path_factory.mktemp("proxy"), "--runtime", "process") as p:
        yield p


@pytest.fixture(scope="module")
def kubectl(plane: Plane) -> Kubectl:
    return Kubectl(kubectl_binary(), str(plane.kubeconfig), tempfile.mkdtemp(prefix="kubectl-home-"))


def until(what: str, check: Callable[[], Any], plane: Plane, limit: float = 60.0) -> Any:
    deadline = time.monotonic() + limit
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {limit}s waiting for {what}\n{plane.log.read_text()[-3000:]}",
                        pytrace=False)
        time.sleep(0.3)


@pytest.fixture(scope="module")
def served(plane: Plane, kubectl: Kubectl) -> Plane:
    kubectl("apply", "-f", "-", input=manifests()).ok()
    kubectl("wait", "-n", NS, "--for=condition=Ready", "pod/front-0", "pod/api-0", "--timeout=60s").ok()
    until("the Services' endpoints", lambda: all(
        kubectl("get", "endpoints", app, "-n", NS, "-o", "jsonpath={.subsets[0].addresses[0].ip}").stdout
        for app in ("front", "api")), plane)
    return plane


def test_services_and_pods_proxy_return_the_pods_answer(served: Plane, kubectl: Kubectl, tmp_path: Path) -> None:
    base = f"/api/v1/namespaces/{NS}"
    assert kubectl("get", "--raw", f"{base}/services/front:80/proxy/hello?x=1").ok().stdout == \
        "front GET /hello?x=1"
    assert kubectl("get", "--raw", f"{base}/services/http:api:http/proxy/").ok().stdout == "api GET /"
    # The pod's container port 8000 is bound on another port of the host: the agent knows which.
    host_ports = kubectl("get", "pod", "api-0", "-n", NS, "-o",
                         "jsonpath={.metadata.annotations.gpufleet\\.io/host-ports}").ok().stdout
    assert json.loads(host_ports)["http"] != 8000
    assert kubectl("get", "--raw", f"{base}/pods/api-0:8000/proxy/x").ok().stdout == "api GET /x"
    assert kubectl("create", "--raw", f"{base}/pods/front-0/proxy/submit", "-f", "-",
                   input='{"a": 1}').ok().stdout == 'front POST /submit {"a": 1}'

    # kubectl proxy, as a browser uses it.
    proxy = kubectl.popen("proxy", "--port=0")
    try:
        assert proxy.stdout is not None
        line = proxy.stdout.readline()
        assert line.startswith("Starting to serve on "), line
        with urllib.request.urlopen(f"http://{line.split()[-1]}{base}/services/front:80/proxy/page.html",
                                    timeout=10) as r:
            assert (r.status, r.read().decode()) == (200, "front GET /page.html")
    finally:
        proxy.terminate()
        proxy.wait(10)

    empty = kubectl("get", "--raw", f"{base}/services/empty:80/proxy/").failed()
    assert empty.stderr.strip() == \
        'Error from server (ServiceUnavailable): no endpoints available for service "empty"', empty
    viewer_config = tmp_path / "viewer.kubeconfig"
    subprocess.run([sys.executable, "-m", "gpufleet.cli.main", "token", "create", "--namespace", NS, "--role", "view",
                    "--user", "vic", "--write-kubeconfig", str(viewer_config), "--kubeconfig", str(served.kubeconfig)],
                   check=True, capture_output=True, timeout=60)
    viewer = Kubectl(kubectl.binary, str(viewer_config), tempfile.mkdtemp(prefix="kubectl-home-"))
    assert "front-0" in viewer("get", "pods").ok().stdout
    denied = viewer("get", "--raw", f"{base}/services/front:80/proxy/").failed()
    assert 'User "vic" cannot get resource "services/proxy" in API group "" in the namespace "proxied"' in \
        denied.stderr, denied


def test_ingress_routes_host_and_path_through_the_gateway(served: Plane, kubectl: Kubectl) -> None:
    def fetch(path: str) -> str:
        return _fetch_as(served, "shop.example.com", path)

    assert until("the Ingress route", lambda: _quiet(fetch, "/api/items") == "api GET /api/items", served)
    assert fetch("/cart?id=3") == "front GET /cart?id=3"
    assert fetch("/apis") == "front GET /apis"  # Prefix matches whole path elements
    row = until("the Ingress address", lambda: (r := kubectl("get", "ingress", "site", "-n", NS, "--no-headers")
                                                .ok().stdout.split()) and r[3] != "80" and r, served)
    assert row[:5] == ["site", "gpufleet", "shop.example.com", "127.0.0.1", "80"]
    # `kubectl create ingress` sends protobuf.
    kubectl("create", "ingress", "made", "-n", NS, "--rule=made.example.com/x*=api:http,tls=cert").ok()
    spec = json.loads(kubectl("get", "ingress", "made", "-n", NS, "-o", "jsonpath={.spec}").ok().stdout)
    assert spec == {"ingressClassName": "gpufleet", "rules": [{"host": "made.example.com", "http": {"paths": [
        {"backend": {"service": {"name": "api", "port": {"name": "http"}}}, "path": "/x", "pathType": "Prefix"}]}}],
        "tls": [{"hosts": ["made.example.com"], "secretName": "cert"}]}
    assert until("the made Ingress route", lambda: _quiet(
        lambda p: _fetch_as(served, "made.example.com", p), "/x/y") == "api GET /x/y", served)


@pytest.mark.parametrize("version", ["1.32", "1.33"])
def test_describe_ingress_shows_the_backends_endpoints(served: Plane, version: str) -> None:
    kubectl = Kubectl(kubectl_binary(version), str(served.kubeconfig), tempfile.mkdtemp(prefix="kubectl-home-"))
    slices = json.loads(kubectl("get", "endpointslices", "-n", NS, "-l", "kubernetes.io/service-name=front",
                                "-o", "json").ok().stdout)["items"]
    (front,) = slices
    address = front["endpoints"][0]["addresses"][0]
    port = front["ports"][0]["port"]
    described = kubectl("describe", "ingress", "site", "-n", NS).ok().stdout
    assert "error" not in described, described
    rows = {line.split()[0]: line.split() for line in described.splitlines() if line.strip().startswith("/")}
    assert rows["/"][1:] == ["front:80", f"({address}:{port})"], described
    assert rows["/api"][1] == "api:http" and rows["/api"][2].startswith("("), described
    service = kubectl("describe", "service", "front", "-n", NS).ok().stdout
    assert re.search(rf"^Endpoints:\s+{re.escape(address)}:{port}$", service, re.M), service


def _fetch_as(plane: Plane, host: str, path: str) -> str:
    req = urllib.request.Request(f"{plane.gateway}{path}", headers={"Host": host})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode()


def _quiet(fn: Callable[[str], str], arg: str) -> str | None:
    try:
        return fn(arg)
    except OSError:
        return None


def test_network_policy_is_accepted_with_a_warning(served: Plane, kubectl: Kubectl) -> None:
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
              "metadata": {"name": "deny-all", "namespace": NS}, "spec": {"podSelector": {}}}
    made = kubectl("apply", "-f", "-", input=json.dumps(policy)).ok()
    assert "networkpolicy.networking.k8s.io/deny-all created" in made.stdout
    assert "Warning: NetworkPolicy is stored but not enforced by gpufleet:" in made.stderr, made
    assert kubectl("get", "netpol", "-n", NS, "--no-headers").ok().stdout.split()[:2] == ["deny-all", "<none>"]


def test_kubectl_events_lists_what_happened(served: Plane, kubectl: Kubectl) -> None:
    events = kubectl("events", "-n", NS, "--for", "pod/api-0").ok().stdout
    assert "Pod/api-0" in events and "Started container web" in events, events
    listed = kubectl("get", "events.events.k8s.io", "-n", NS, "-o", "json").ok().stdout
    items = json.loads(listed)["items"]
    assert items and all(i["apiVersion"] == "events.k8s.io/v1" and "regarding" in i and "note" in i for i in items)
    assert {i["regarding"]["name"] for i in items} >= {"front-0", "api-0"}
