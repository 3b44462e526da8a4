"""A throwaway PostgreSQL server for benchmarks: its own data directory under /tmp, a free
port on 127.0.0.1, trust authentication, removed on exit.

Unlike the test fixture (tests/conftest.py), durability stays at PostgreSQL's defaults
(fsync, synchronous_commit and full_page_writes on) unless the caller asks otherwise: a
benchmark of a shared store that skips the flush on commit would flatter it.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

_PG_BIN_GLOBS = ["/usr/lib/postgresql/*/bin", "/usr/local/pgsql/bin", "/usr/pgsql-*/bin"]


class PostgresUnavailable(RuntimeError):
    pass


def find_pg_bin() -> str | None:
    initdb = shutil.which("initdb")
    if initdb and os.path.exists(os.path.join(os.path.dirname(initdb), "postgres")):
        return os.path.dirname(initdb)
    for pattern in _PG_BIN_GLOBS:
        for d in sorted(glob.glob(pattern), reverse=True):
            if os.path.exists(os.path.join(d, "initdb")) and os.path.exists(os.path.join(d, "postgres")):
                return d
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_prctl():
    # Resolved here, in the parent: after dropping to the postgres user the child may not be
    # allowed to read this Python's files, so it must not import or load anything itself.
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """preexec_fn: have Linux signal the child when the benchmark dies, even by SIGKILL,
    which skips every finally block (a leftover postmaster would keep its port and data)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def _run_as(user: str | None):
    """preexec_fn that drops to `user` and only then asks for the parent-death signal: Linux
    forgets that request when the process's user changes, which Popen(user=...) would do
    after our preexec_fn has run."""
    ids = None
    if user:
        pw = pwd.getpwnam(user)
        ids = (pw.pw_uid, pw.pw_gid)

    def preexec() -> None:
        if ids:
            os.setgroups([])
            os.setgid(ids[1])
            os.setuid(ids[0])
        # SIGINT is PostgreSQL's fast shutdown; SIGTERM would wait for clients to leave.
        die_with_parent(signal.SIGINT)

    return preexec


def _os_user() -> str | None:
    # initdb and postgres refuse to run as root.
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


@dataclass
class PostgresServer:
    host: str
    port: int
    user: str
    pid: int = 0
    settings: dict[str, str] = field(default_factory=dict)

    def url(self, dbname: str) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{dbname}"

    def create_database(self, dbname: str) -> str:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{dbname}"')
        return self.url(dbname)

    def show(self, *names: str) -> dict[str, str]:
        """The server's live values of some settings (so a report states what was measured)."""
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            return {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}


@contextlib.contextmanager
def throwaway_postgres(durable: bool = True, extra: dict[str, str] | None = None) -> Iterator[PostgresServer]:
    bindir = find_pg_bin()
    if bindir is None:
        raise PostgresUnavailable(
            "PostgreSQL server binaries (initdb, postgres) not found; install them with "
            "`apt-get install postgresql`"
        )
    run_as = _os_user()
    tmp = tempfile.mkdtemp(prefix="gpufleet-bench-pg-")
    proc: subprocess.Popen[bytes] | None = None
    log = None
    try:
        if run_as:
            shutil.chown(tmp, user=run_as)
        data = os.path.join(tmp, "data")
        # --no-sync only skips flushing the fresh cluster files once; the running server's
        # durability is set below.
        subprocess.run(
            [os.path.join(bindir, "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
             "-E", "UTF8", "--no-locale", "--no-sync"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, user=run_as,
        )
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": tmp,
            "max_connections": "100",
        }
        if not durable:
            settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        settings.update(extra or {})
        port = free_port()
        log = open(os.path.join(tmp, "postgres.log"), "wb")
        args = [os.path.join(bindir, "postgres"), "-D", data, "-p", str(port)]
        for k, v in settings.items():
            args += ["-c", f"{k}={v}"]
        # A session of its own: Ctrl-C in the terminal reaches only the benchmark, which then
        # shuts this server down in order instead of racing it.
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_run_as(run_as))
        server = PostgresServer(host="127.0.0.1", port=port, user="postgres", pid=proc.pid, settings=settings)
        _wait_ready(server, proc, os.path.join(tmp, "postgres.log"))
        yield server
    finally:
        if proc is not None and proc.poll() is None:
            # SIGINT is PostgreSQL's "fast" shutdown: clients are disconnected, nothing waits.
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if log is not None:
            log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_ready(server: PostgresServer, proc: subprocess.Popen[bytes], logfile: str) -> None:
    import psycopg

    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            with open(logfile, errors="replace") as f:
                raise PostgresUnavailable(f"PostgreSQL exited at start:\n{f.read()}")
        try:
            psycopg.connect(server.url("postgres"), connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
