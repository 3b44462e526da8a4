"""Fixtures shared by every test package.

``store_url`` is parametrized over both store backends, so a test that takes it runs once on
SQLite and once on PostgreSQL. The PostgreSQL server is real: started once per session (only
when some test needs it) in a temporary directory, with durability off for speed, and each
test gets a fresh database.

``oci_registry`` is a real local OCI registry (TLS, htpasswd) holding the test images; see
tests/oci_registry.py.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from oci_images import ensure_images
from oci_registry import LocalRegistry, local_registry

# Property tests check what is computed, never how fast: no per-example deadline and no
# too-slow health check, which a loaded 2-core machine trips at random.
settings.register_profile("gpufleet", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gpufleet")


_PG_BIN_GLOBS = ["/usr/lib/postgresql/*/bin", "/usr/local/pgsql/bin", "/usr/pgsql-*/bin"]


def _find_pg_bin() -> str | None:
    initdb = shutil.which("initdb")
    if initdb:
        return os.path.dirname(initdb)
    for pattern in _PG_BIN_GLOBS:
        for d in sorted(glob.glob(pattern), reverse=True):
            if os.path.exists(os.path.join(d, "initdb")) and os.path.exists(os.path.join(d, "postgres")):
                return d
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PostgresServer:
    host: str
    port: int
    user: str

    def url(self, dbname: str) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{dbname}"


def _os_user_for_postgres() -> str | None:
    """initdb refuses to run as root: as root, run the server as the `postgres` OS user."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "postgres"],
            check=True,
        )
    return "postgres"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bindir = _find_pg_bin()
    if bindir is None:
        pytest.fail(
            "PostgreSQL server binaries (initdb, postgres) not found: install them with "
            "`apt-get install postgresql` (the tests start a real server)",
            pytrace=False,
        )
    run_as = _os_user_for_postgres()
    tmp = tempfile.mkdtemp(prefix="gpufleet-pg-")
    data = os.path.join(tmp, "data")
    if run_as:
        shutil.chown(tmp, user=run_as)
    subprocess.run(
        [
            os.path.join(bindir, "initdb"),
            "-D",
            data,
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        user=run_as,
    )
    port = _free_port()
    log = open(os.path.join(tmp, "postgres.log"), "wb")
    proc = subprocess.Popen(
        [
            os.path.join(bindir, "postgres"),
            "-D",
            data,
            "-p",
            str(port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={tmp}",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=300",
            "-c",
            "shared_buffers=64MB",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        user=run_as,
        start_new_session=True,
    )
    server = PostgresServer(host="127.0.0.1", port=port, user="postgres")
    try:
        _wait_ready(server, proc, os.path.join(tmp, "postgres.log"))
        yield server
    finally:
        # SIGINT is PostgreSQL's "fast" shutdown.
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_ready(server: PostgresServer, proc: subprocess.Popen[bytes], logfile: str) -> None:
    import psycopg

    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            with open(logfile, errors="replace") as f:
                pytest.fail(f"PostgreSQL exited at start:\n{f.read()}", pytrace=False)
        try:
            psycopg.connect(server.url("postgres"), connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


_db_numbers = itertools.count()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database on the session's server."""
    import psycopg

    dbname = f"test_{os.getpid()}_{next(_db_numbers)}"
    with psycopg.connect(postgres_server.url("postgres"), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    yield postgres_server.url(dbname)
    with psycopg.connect(postgres_server.url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: os.PathLike[str]) -> str:
    return f"sqlite:///{os.path.join(os.fspath(tmp_path), 'store.db')}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest) -> str:
    """A URL of an empty store, once per backend. SQLite gets a file (not :memory:) so that
    several store instances and processes can open it."""
    if request.param == "postgres":
        return request.getfixturevalue("postgres_url")
    return request.getfixturevalue("sqlite_url")


@pytest.fixture(scope="session")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    """Debian's docker-registry on 127.0.0.1 (verified TLS, htpasswd auth) with the test
    images pushed: `oci_registry.images["busybox"]` is "127.0.0.1:<port>/gpufleet/busybox:1".
    Started once per session when a test asks for it; stopped, untrusted and its pulled
    names removed at the end."""
    images = ensure_images("busybox")
    with local_registry(tmp_path_factory.mktemp("oci-registry"), push=images) as registry:
        yield registry


@pytest.fixture(scope="session", autouse=True)
def _no_node_state_outlives_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Pods outlive their agents, as a kubelet's containers do: a test that kills an agent
    (or fails before its clean-up) leaves sandboxed processes, podman containers and volume
    mounts behind. At the end of the session whatever still lives under this session's
    temporary directory is taken down, so a long run never piles them up."""
    yield
    base = str(tmp_path_factory.getbasetemp())
    for pid in _pids_of_monitors_under(base):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    if shutil.which("podman"):
        out = subprocess.run(["podman", "ps", "-a", "--format", "{{.ID}} {{.Labels}}"], capture_output=True,
                             text=True, check=False).stdout
        ids = [line.split()[0] for line in out.splitlines()
               if f"gpufleet.io/log-path:{base}" in line or f"gpufleet.io/agent-dir:{base}" in line]
        for _ in range(2):  # the sandboxes go once their containers have
            if ids:
                subprocess.run(["podman", "rm", "-f", "-t", "0", *ids], capture_output=True, check=False)
    with open("/proc/self/mounts") as f:
        mounts = [line.split()[1] for line in f if line.split()[1].startswith(base)]
    for path in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", path], capture_output=True, check=False)


def _pids_of_monitors_under(base: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"gpufleet.agent.runtime.monitor" in args and any(a.startswith(base.encode()) for a in args):
            pids.append(int(entry))
    return pids
