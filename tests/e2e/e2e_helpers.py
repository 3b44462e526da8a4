"""Helpers for the end-to-end tests: running kubectl, reading its tables, writing manifests.

A module of its own (not conftest.py) so test modules can import it by a name no other test
package uses.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

KUBECTL = "/usr/bin/kubectl"
VERSIONED_DIR = "/usr/lib/google-cloud-sdk/bin"


def kubectl_binary(version: str | None = None) -> str:
    """Path of the default kubectl (the SDK dispatcher) or of `kubectl.1.<minor>`; fails the
    test when it is not installed."""
    path = KUBECTL if version is None else os.path.join(VERSIONED_DIR, f"kubectl.{version}")
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"{path} not found: the e2e tests run the real kubectl (install the Google Cloud SDK "
            f"kubectl component with its versioned binaries, as on the CI image)",
            pytrace=False,
        )
    return path


@dataclass
class Result:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return (
            f"$ kubectl {' '.join(self.args)}\nexit code {self.returncode}\n"
            f"--- stdout ---\n{self.stdout}--- stderr ---\n{self.stderr}"
        )

    def ok(self) -> Result:
        assert self.returncode == 0, str(self)
        return self

    def failed(self) -> Result:
        assert self.returncode != 0, str(self)
        return self


@dataclass
class Kubectl:
    """One kubectl binary with its own HOME: the discovery cache (~/.kube/cache) starts empty
    for every fixture instance and never leaks between runs or binaries."""

    binary: str
    kubeconfig: str
    home: str
    timeout: float = 30.0
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": self.home,
            "KUBECONFIG": self.kubeconfig,
            # Keep kubectl from probing a terminal or a pager.
            "TERM": "dumb",
            "KUBECTL_INTERACTIVE_DELETE": "false",
        }

    @property
    def minor(self) -> str:
        m = re.search(r"kubectl\.1\.(\d+)$", self.binary)
        return m.group(1) if m else "32"

    def __call__(self, *args: str, input: str | None = None, timeout: float | None = None) -> Result:
        argv = [self.binary, *args]
        try:
            proc = subprocess.run(
                argv,
                input=input,
                capture_output=True,
                text=True,
                env=self.env,
                timeout=timeout or self.timeout,
            )
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            pytest.fail(f"kubectl {' '.join(args)} timed out after {e.timeout}s\n{out}\n{err}", pytrace=False)
        return Result(list(args), proc.returncode, proc.stdout, proc.stderr)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [self.binary, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )


@dataclass
class Cluster:
    url: str
    kubeconfig: str
    state_dir: Path
    log_path: Path
    proc: subprocess.Popen[str]

    @property
    def token(self) -> str:
        """The admin's bearer token, from the kubeconfig `gpufleet up` wrote."""
        import yaml

        doc = yaml.safe_load(Path(self.kubeconfig).read_text())
        return doc["users"][0]["user"]["token"]

    def log_tail(self, n: int = 60) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""


def columns(header: str) -> list[str]:
    """A kubectl table header split into column names (names like NOMINATED NODE hold one
    space; columns are separated by at least two)."""
    return re.split(r"\s{2,}", header.strip())


def table(text: str) -> list[dict[str, str]]:
    """Rows of a single kubectl table, keyed by header, cut at the header's column offsets."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    header = lines[0]
    names = columns(header)
    starts = []
    pos = 0
    for name in names:
        pos = header.index(name, pos)
        starts.append(pos)
        pos += len(name)
    rows = []
    for ln in lines[1:]:
        cells = {}
        for i, name in enumerate(names):
            end = starts[i + 1] if i + 1 < len(names) else None
            cells[name] = ln[starts[i] : end].strip()
        rows.append(cells)
    return rows


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def deployment_yaml(
    name: str,
    *,
    image: str = "nginx:1.25",
    replicas: int = 2,
    namespace: str | None = None,
    extra_spec: str = "",
) -> str:
    ns = f"\n  namespace: {namespace}" if namespace else ""
    return f"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}{ns}
  labels:
    app: {name}
spec:
  replicas: {replicas}{extra_spec}
  selector:
    matchLabels:
      app: {name}
  template:
    metadata:
      labels:
        app: {name}
    spec:
      containers:
      - name: main
        image: {image}
        ports:
        - containerPort: 8080
          name: http
"""


def pod_yaml(name: str, *, namespace: str | None = None, labels: dict[str, str] | None = None) -> str:
    ns = f"\n  namespace: {namespace}" if namespace else ""
    lab = "".join(f"\n    {k}: {v}" for k, v in (labels or {"app": name}).items())
    return f"""apiVersion: v1
kind: Pod
metadata:
  name: {name}{ns}
  labels:{lab}
spec:
  containers:
  - name: main
    image: busybox:1.36
    command: ["sleep", "3600"]
    ports:
    - containerPort: 80
"""


def service_yaml(name: str, selector: str) -> str:
    return f"""apiVersion: v1
kind: Service
metadata:
  name: {name}
spec:
  selector:
    app: {selector}
  ports:
  - port: 80
    targetPort: 8080
"""


def namespace_yaml(name: str) -> str:
    return f"""apiVersion: v1
kind: Namespace
metadata:
  name: {name}
"""


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.2, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if last:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
