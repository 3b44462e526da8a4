"""The debug loop against a real node, on both runtimes that run real programs (podman and
the sandboxed process runtime), with the real kubectl 1.27 (SPDY/3.1), 1.32 and 1.33
(WebSocket v5 exec, port-forward tunnelled as SPDY/3.1+portforward.k8s.io in a WebSocket)
and the official Python client (WebSocket v4):

- exec: output on stdout and stderr, the exit code, stdin, and a terminal (-it) with its size;
- attach to the main process's output; cp both ways (tar over exec);
- port-forward to the pod and to its Service, HTTP both ways;
- a user without pods/exec (the view role) gets Kubernetes' 403.

One cluster and one pod per runtime.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import Kubectl, kubectl_binary
from test_pod_contract import Plane, running_plane

pytestmark = pytest.mark.e2e

NS = "debug"
POD = "box"
PYTHON = "localhost/gpufleet/python:3.11"
# An HTTP server answering GET with "hello from <pod>" and POST with the body reversed.
SERVER = r"""
import http.server, socketserver, sys
class H(http.server.BaseHTTPRequestHandler):
    def _send(self, body):
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def do_GET(self): self._send(b"hello from box")
    def do_POST(self): self._send(self.rfile.read(int(self.headers["Content-Length"]))[::-1])
    def log_message(self, *a): pass
socketserver.TCPServer.allow_reuse_address = True
http.server.ThreadingHTTPServer(("", int(sys.argv[1])), H).serve_forever()
"""
VERSIONS = ("1.27", "1.32", "1.33")


def _manifests() -> str:
    # $PORT: the container's port (podman), or the host port the agent gave it (process runtime).
    script = ('(i=0; while true; do i=$((i+1)); echo tick-$i; sleep 0.2; done) & '
              'exec python3 -c "$SERVER" "${PORT:-8080}"')
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": NS, "labels": {"app": POD}},
           "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
               "name": "main", "image": PYTHON, "imagePullPolicy": "IfNotPresent",
               "command": ["sh", "-c", script], "env": [{"name": "SERVER", "value": SERVER}],
               "ports": [{"containerPort": 8080}]}]}}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": NS},
           "spec": {"selector": {"app": POD}, "ports": [{"port": 80, "targetPort": 8080}]}}
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [ns, pod, svc]})


@pytest.fixture(scope="module", params=["podman", "process"])
def plane(request, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with running_plane(tmp_path_factory.mktemp(f"streams-{request.param}"), "--runtime", request.param) as p:
        p.runtime = request.param  # type: ignore[attr-defined]
        out = p.kubectl("apply", "-f", "-", input=_manifests())
        assert out.returncode == 0, out.stderr
        out = p.kubectl("wait", "-n", NS, "--for=condition=Ready", f"pod/{POD}", "--timeout=90s")
        assert out.returncode == 0, out.stderr + p.log.read_text()[-3000:]
        yield p


@pytest.fixture(scope="module")
def kubectls(plane: Plane, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Kubectl]:
    return {v: Kubectl(kubectl_binary(v), str(plane.kubeconfig), str(tmp_path_factory.mktemp(f"home-{v}")))
            for v in VERSIONS}


@pytest.mark.parametrize("version", VERSIONS)
def test_exec_gives_output_exit_code_and_stdin(kubectls: dict[str, Kubectl], version: str):
    k = kubectls[version]
    out = k("exec", "-n", NS, POD, "--", "sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3")
    assert out.returncode == 3, str(out)
    assert out.stdout == "to-stdout\n", str(out)
    assert "to-stderr" in out.stderr and "command terminated with exit code 3" in out.stderr, str(out)
    out = k("exec", "-i", "-n", NS, POD, "--", "sh", "-c", "tr a-z A-Z; echo end", input="piped in\n").ok()
    assert out.stdout == "PIPED IN\nend\n", str(out)


def _under_pty(argv: list[str], env: dict[str, str], typed: bytes, rows: int = 33, cols: int = 111,
               timeout: float = 30) -> tuple[int, bytes]:
    """``argv`` on a terminal of ``rows`` x ``cols``; ``typed`` is typed once it prints."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        os.execve(argv[0], argv, env)
    out, sent, deadline = b"", False, time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            try:
                data = os.read(fd, 4096)
            except OSError:
                break
            if not data:
                break
            out += data
            if not sent and b"ready" in out:
                os.write(fd, typed)
                sent = True
    finally:
        if time.monotonic() >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), out


@pytest.mark.parametrize("version", ["1.27", "1.33"])
def test_exec_with_a_terminal(kubectls: dict[str, Kubectl], version: str):
    k = kubectls[version]
    code, out = _under_pty([k.binary, "exec", "-it", "-n", NS, POD, "--", "sh", "-c",
                            "stty size; echo ready; read answer; echo got-$answer; exit 5"],
                           {**k.env, "TERM": "xterm"}, b"yes\n")
    text = out.decode(errors="replace")
    assert "33 111" in text, text  # the terminal's size reached the container
    assert "got-yes" in text, text  # typed input, echoed back by the container's terminal
    assert code == 5, text


@pytest.mark.parametrize("version", ["1.27", "1.33"])
def test_attach_streams_the_main_process_output(kubectls: dict[str, Kubectl], version: str):
    k = kubectls[version]
    proc = k.popen("attach", "-n", NS, POD)
    try:
        assert proc.stdout is not None
        seen = [proc.stdout.readline() for _ in range(3)]
    finally:
        proc.terminate()
        proc.wait(10)
    assert all(re.fullmatch(r"tick-\d+\n", line) for line in seen), seen


@pytest.mark.parametrize("version", ["1.27", "1.33"])
def test_cp_both_ways(kubectls: dict[str, Kubectl], version: str, tmp_path: Path):
    k = kubectls[version]
    payload = os.urandom(200_000)  # past SPDY's 64 KiB window and the WebSocket's frames
    src = tmp_path / "data.bin"
    src.write_bytes(payload)
    k("cp", str(src), f"{NS}/{POD}:/tmp/data-{version}.bin").ok()
    out = k("exec", "-n", NS, POD, "--", "sh", "-c", f"wc -c < /tmp/data-{version}.bin").ok()
    assert out.stdout.strip() == str(len(payload))
    back = tmp_path / "back.bin"
    k("cp", f"{NS}/{POD}:/tmp/data-{version}.bin", str(back)).ok()
    assert back.read_bytes() == payload


@contextlib.contextmanager
def _forwarding(k: Kubectl, target: str, remote: int) -> Iterator[int]:
    proc = k.popen("port-forward", "-n", NS, target, f":{remote}")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"Forwarding from 127\.0\.0\.1:(\d+)", line)
        assert m, line + (proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        yield int(m.group(1))
    finally:
        proc.terminate()
        proc.wait(10)


def _http(port: int, body: bytes | None = None) -> bytes:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/", data=body, method="POST" if body else "GET")
    with urllib.request.urlopen(req, timeout=15) as resp:
        return resp.read()


@pytest.mark.parametrize("version", VERSIONS)
def test_port_forward_to_the_pod_and_to_its_service(kubectls: dict[str, Kubectl], version: str):
    k = kubectls[version]
    body = os.urandom(100_000)
    with _forwarding(k, f"pod/{POD}", 8080) as port:
        assert _http(port) == b"hello from box"
        assert _http(port, body) == body[::-1]
        assert _http(port) == b"hello from box"  # a second connection over the same stream
    # kubectl resolves the Service to a pod and its target port itself.
    with _forwarding(k, "svc/web", 80) as port:
        assert _http(port, b"through the service") == b"ecivres eht hguorht"


def test_the_python_client_execs_and_port_forwards(plane: Plane):
    script = r"""
import json, socket, sys
from kubernetes import client, config
from kubernetes.stream import portforward, stream
api = client.CoreV1Api(config.new_client_from_config(config_file=sys.argv[1]))
r = stream(api.connect_get_namespaced_pod_exec, "box", "debug", command=["sh", "-c", "echo o; echo e >&2; exit 7"],
           stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False)
r.run_forever(timeout=20)
out = {"stdout": r.read_stdout(), "stderr": r.read_stderr(), "code": r.returncode}
r = stream(api.connect_get_namespaced_pod_exec, "box", "debug", command=["sh", "-c", "read x; echo got-$x; stty size"],
           stderr=True, stdin=True, stdout=True, tty=True, _preload_content=False)
r.write_channel(4, json.dumps({"Width": 91, "Height": 21}))
r.write_stdin("abc\n")
r.run_forever(timeout=20)
out["tty"], out["tty_code"] = r.read_stdout(), r.returncode
pf = portforward(api.connect_get_namespaced_pod_portforward, "box", "debug", ports="8080")
s = pf.socket(8080)
s.setblocking(True)
s.sendall(b"POST / HTTP/1.0\r\nContent-Length: 5\r\n\r\nabcde")
data = b""
while chunk := s.recv(65536):
    data += chunk
s.close()
out["pf"], out["pf_error"] = data.decode(), pf.error(8080)
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", script, str(plane.kubeconfig)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert (out["stdout"], out["stderr"], out["code"]) == ("o\n", "e\n", 7), out
    assert "got-abc" in out["tty"] and "21 91" in out["tty"] and out["tty_code"] == 0, out
    assert out["pf"].startswith("HTTP/1.0 200") and out["pf"].endswith("edcba"), out
    assert out["pf_error"] is None, out


def test_a_viewer_cannot_exec(plane: Plane, tmp_path: Path):
    path = tmp_path / "viewer.kubeconfig"
    made = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", "token", "create", "--namespace", NS,
                           "--role", "view", "--user", "viewer", "--write-kubeconfig", str(path),
                           "--kubeconfig", str(plane.kubeconfig)], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    for version in ("1.27", "1.33"):
        k = Kubectl(kubectl_binary(version), str(path), str(tmp_path / f"home-{version}"))
        out = k("exec", "-n", NS, POD, "--", "true").failed()
        assert re.search(r'pods "box" is forbidden: User "viewer" cannot (create|get) resource "pods/exec" '
                         r'in API group "" in the namespace "debug"', out.stderr), str(out)
        out = k("port-forward", "-n", NS, f"pod/{POD}", ":8080").failed()
        assert 'cannot create resource "pods/portforward"' in out.stderr or \
            'cannot get resource "pods/portforward"' in out.stderr, str(out)
    # The default roles, as Kubernetes': edit and admin open streams, view does not.
    roles = json.loads(plane.kubectl("get", "clusterroles", "view", "edit", "admin", "-o", "json").stdout)["items"]
    granted = {r["metadata"]["name"]: {(res, verb) for rule in r.get("rules") or [] if "" in rule.get("apiGroups", [])
                                       for res in rule.get("resources") or [] for verb in rule.get("verbs") or []}
               for r in roles}
    for sub in ("pods/exec", "pods/attach", "pods/portforward"):
        assert {(sub, "create"), (sub, "get")} <= granted["edit"] and {(sub, "create")} <= granted["admin"]
        assert not any(res == sub for res, _ in granted["view"])
