"""Helpers for the end-to-end tests: running kubectl, reading its tables, writing manifests,
and running a fleet (a server and node agents) as real processes.

A module of its own (not conftest.py) so test modules can import it by a name no other test
package uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


# --- A whole fleet as separate processes: one API server and N node agents ---------------

GPUFLEET = [sys.executable, "-m", "gpufleet.cli.main"]
FLEET_START_TIMEOUT = 60.0
_LISTENING = re.compile(r"API server listening on (http\S+)")


def kill_group(pid: int) -> None:
    """SIGKILL a process's group and the process itself. A pod of the process runtime leads
    a session of its own, so its group is its pid and this also takes anything it forked."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def _kill_proc(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        kill_group(proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def podman_owner(state_dir: Path) -> str:
    """The gpufleet.io/owner label the podman runtime of the agent with this state dir puts on
    its containers: it tells them from other agents' on the same machine (a node name does
    not, as two fleets may both have a node-a)."""
    import hashlib

    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]


def remove_node_pods(state_dir: Path) -> None:
    """Stop and remove whatever an agent with this state dir left running: the process
    runtime's monitored containers, and podman's containers of that agent."""
    import asyncio
    import concurrent.futures

    from gpufleet.agent.runtime.process import ProcessRuntime

    if (state_dir / "containers").is_dir():
        async def stop() -> None:
            runtime = ProcessRuntime(state_dir, cgroup_root=None)
            await runtime.recover("")
            await runtime.stop_all(1)
            await runtime.close()

        # Maybe called from a test's own event loop: the clean-up gets a loop of its own.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, stop()).result(timeout=60)
    owner = podman_owner(state_dir)
    for _ in range(3):
        ids = subprocess.run(["podman", "ps", "-a", "-q", "--filter", f"label=gpufleet.io/owner={owner}"],
                             capture_output=True, text=True, check=False).stdout.split()
        if not ids:
            return
        subprocess.run(["podman", "rm", "-f", "-t", "0", *ids], capture_output=True, check=False)


def process_pids(pods: Iterable[dict]) -> set[int]:
    """Host pids of the containers of these pods (process runtime: containerID process://<pid>)."""
    pids = set()
    for p in pods:
        for cs in (p.get("status") or {}).get("containerStatuses") or []:
            cid = cs.get("containerID") or ""
            if cid.startswith("process://"):
                pids.add(int(cid.removeprefix("process://")))
    return pids


def wait_for_url(proc: subprocess.Popen, log: Path, timeout: float = FLEET_START_TIMEOUT) -> str:
    """The URL a starting API server prints; fails the test with its log if none comes."""
    what = " ".join(str(a) for a in proc.args[len(GPUFLEET) : len(GPUFLEET) + 1]) or "server"
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        # Keeps draining for the server's whole life so a full pipe never stalls it.
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"gpufleet {what} printed no URL in {timeout}s\n{log.read_text()}", pytrace=False)
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            continue
        if line is None:
            proc.wait()
            pytest.fail(f"gpufleet {what} exited with {proc.returncode}\n{log.read_text()}", pytrace=False)
        m = _LISTENING.search(line)
        if m:
            return m.group(1)


@dataclass
class Fleet:
    """A running fleet under `root`: server.log, server-state/, agent-<name>.log and
    agent-<name>/ per node. `pids` are pod processes to kill at teardown (they run in
    sessions of their own, so killing an agent's group misses them)."""

    root: Path
    env: dict[str, str]
    url: str = ""
    server: subprocess.Popen | None = None
    agents: dict[str, subprocess.Popen] = field(default_factory=dict)
    pids: set[int] = field(default_factory=set)
    poll_interval: float = 0.25
    # Arguments every agent of the fleet gets.
    agent_args: tuple[str, ...] = ()

    @property
    def state(self) -> Path:
        return self.root / "server-state"

    @property
    def kubeconfig(self) -> str:
        return str(self.state / "kubeconfig")

    def start_server(self, args: Sequence[str]) -> None:
        """`gpufleet <args> --port 0 --state-dir <root>/server-state`, e.g. ["server", ...] or
        ["up", "--no-agent"]; returns once it serves. The gateway gets a free port too unless
        `args` choose (its default, 8080, would be one fleet's at a time on this machine)."""
        log_path = self.root / "server.log"
        gateway = [] if "--gateway-port" in args else ["--gateway-port", "0"]
        with open(log_path, "w") as log:
            self.server = subprocess.Popen(
                [*GPUFLEET, *args, "--port", "0", *gateway, "--state-dir", str(self.state)],
                stdout=subprocess.PIPE, stderr=log, text=True, env=self.env, start_new_session=True,
            )
        self.url = wait_for_url(self.server, log_path)
        assert Path(self.kubeconfig).exists(), f"gpufleet {args[0]} did not write {self.kubeconfig}"

    def start_agent(
        self,
        name: str,
        *,
        gpus: int,
        runtime: str = "process",
        gpu_model: str | None = None,
        address: str | None = None,
        labels: dict[str, str] | None = None,
        join: bool = True,
        extra: Sequence[str] = (),
        gpu_inventory: Path | None = None,
    ) -> subprocess.Popen:
        """A `gpufleet agent` for node `name`. With `join` it joins as an agent on another
        machine would: the join token is traded for the node's own token and the server is
        verified with its CA; without, it uses the admin kubeconfig."""
        if join:
            reach = ["--server", self.url, "--token-file", str(self.state / "join-token"),
                     "--certificate-authority", str(self.state / "pki" / "ca.crt")]
        else:
            reach = ["--kubeconfig", self.kubeconfig]
        argv = [*GPUFLEET, "agent", *reach, "--name", name]
        argv += ["--gpu-inventory", str(gpu_inventory)] if gpu_inventory is not None else ["--gpus", str(gpus)]
        if gpu_model:
            argv += ["--gpu-model", gpu_model]
        argv += ["--state-dir", str(self.root / f"agent-{name}"), "--runtime", runtime]
        if address:
            argv += ["--address", address]
        if labels:
            argv += ["--labels", ",".join(f"{k}={v}" for k, v in labels.items())]
        argv += list(extra or self.agent_args)
        with open(self.root / f"agent-{name}.log", "w") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        self.agents[name] = proc
        return proc

    def kill_node(self, name: str, pod_pids: Iterable[int]) -> None:
        """The node dies the hard way: its agent and these pod processes SIGKILLed."""
        _kill_proc(self.agents[name])
        for pid in pod_pids:
            kill_group(pid)

    def close(self) -> None:
        procs = [*self.agents.values()][::-1] + ([self.server] if self.server else [])
        for proc in procs:
            _kill_proc(proc)
        for pid in self.pids:
            kill_group(pid)
        # Pods outlive their agents (a kubelet's containers do too): take them down.
        for name in self.agents:
            remove_node_pods(self.root / f"agent-{name}")

    def logs(self, n: int = 40) -> str:
        out = []
        for log in sorted(self.root.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-n:]
            out.append(f"--- {log.name} ---\n" + "\n".join(lines))
        return "\n".join(out)

    def run_cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The gpufleet command against this fleet, as a user runs it."""
        return subprocess.run(
            [*GPUFLEET, *args, "--kubeconfig", self.kubeconfig],
            capture_output=True, text=True, timeout=60, env=dict(os.environ, HOME=str(self.root)),
        )

    async def wait_until(self, check, limit: float, what: str, interval: float | None = None) -> Any:
        """Polls the coroutine function `check` until it returns something truthy, which is
        returned; fails with the fleet's logs after `limit` seconds."""
        deadline = time.monotonic() + limit
        while True:
            got = await check()
            if got:
                return got
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {limit}s waiting for {what}\n{self.logs()}", pytrace=False)
            await asyncio.sleep(interval or self.poll_interval)

    async def nodes_ready(self, client, limit: float = FLEET_START_TIMEOUT) -> None:
        """Waits until every agent's Node is Ready."""
        names = set(self.agents)

        async def check() -> bool:
            nodes = await client.list("Node", raw=True)
            ready = {
                n["metadata"]["name"]
                for n in nodes
                if any(c["type"] == "Ready" and c["status"] == "True"
                       for c in (n.get("status") or {}).get("conditions") or [])
            }
            return ready >= names

        await self.wait_until(check, limit, f"nodes {sorted(names)} Ready")


@contextlib.contextmanager
def running_fleet(
    root: Path,
    server: Sequence[str],
    nodes: Sequence[str],
    *,
    gpus: int,
    runtime: str = "process",
    gpu_model: str | None = None,
    addresses: Sequence[str] | None = None,
    join: bool = True,
    python_on_path: bool = False,
    poll_interval: float = 0.25,
    agent_args: Sequence[str] = (),
) -> Iterator[Fleet]:
    """A server started with `server` args and one agent per name in `nodes` (addresses[i]
    for node i when given), all SIGKILLed at the end with the pods in `Fleet.pids`.
    `python_on_path` puts this interpreter's directory first on PATH, so pods of the process
    runtime that run `python` get the one that has torch."""
    env = dict(os.environ, HOME=str(root), PYTHONUNBUFFERED="1")
    if python_on_path:
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env.pop("KUBECONFIG", None)
    fleet = Fleet(root, env, poll_interval=poll_interval, agent_args=tuple(agent_args))
    try:
        fleet.start_server(server)
        for i, name in enumerate(nodes):
            fleet.start_agent(name, gpus=gpus, runtime=runtime, gpu_model=gpu_model,
                              address=addresses[i] if addresses else None, join=join)
        yield fleet
    finally:
        fleet.close()
