"""End-to-end fixtures: a real `gpufleet up` process and the real clients pointed at it.

The server runs as a subprocess, exactly as a user starts it, so these tests see what kubectl
and the official Python client see: HTTP, discovery, OpenAPI, content negotiation and watch
streams, with nothing in-process to hide a difference.

kubectl is not optional here. A CI image without it would silently test nothing, so a
missing binary fails the run with a message instead of skipping.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator

import pytest
from e2e_helpers import Cluster, Kubectl, kubectl_binary, wait_for_url

START_TIMEOUT = 60.0


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """`gpufleet up` on a free port with a fresh SQLite state dir, for one test module."""
    root = tmp_path_factory.mktemp("gpufleet-e2e")
    state_dir = root / "state"
    log_path = root / "server.log"
    env = dict(os.environ, HOME=str(root), PYTHONUNBUFFERED="1")
    env.pop("KUBECONFIG", None)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.cli.main", "up", "--state-dir", str(state_dir), "--port", "0",
             # No local node: the objects these tests make must stay as created (pods Pending),
             # so what kubectl prints is deterministic.
             "--no-agent",
             # Any free port: tests running side by side must not fight over the default 8080.
             "--gateway-port", "0"],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
            start_new_session=True,
        )
    try:
        url = wait_for_url(proc, log_path, START_TIMEOUT)
        kubeconfig = state_dir / "kubeconfig"
        assert kubeconfig.exists(), f"gpufleet up did not write {kubeconfig}"
        yield Cluster(url, str(kubeconfig), state_dir, log_path, proc)
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def kubectl_factory(cluster: Cluster) -> Iterator[Callable[[str], Kubectl]]:
    """Builds a Kubectl for a binary; one HOME per binary per module."""
    homes: list[str] = []
    made: dict[str, Kubectl] = {}

    def make(binary: str) -> Kubectl:
        if binary not in made:
            home = tempfile.mkdtemp(prefix="kubectl-home-")
            homes.append(home)
            made[binary] = Kubectl(binary, cluster.kubeconfig, home)
        return made[binary]

    yield make
    for home in homes:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def kubectl(request: pytest.FixtureRequest) -> Kubectl:
    """The machine's default kubectl (the dispatcher, which picks 1.32 from /version)."""
    binary = kubectl_binary()  # before the server starts: a missing kubectl fails at once
    return request.getfixturevalue("kubectl_factory")(binary)
