"""The control plane's state dir holds the database (every Secret), the tokens, the
kubeconfig and the keys: only its owner may read it, also when an earlier run (or a loose
umask) left it open."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gpufleet.cli.controlplane import ControlPlane

NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def readable_by_another_user(path: Path) -> bool:
    """Whether uid 65534 (nobody) can read ``path``: a real attempt, by another local user."""
    done = subprocess.run(["cat", str(path)], user=NOBODY, group=NOBODY, extra_groups=[],
                          capture_output=True, timeout=30)
    return done.returncode == 0


@pytest.fixture
def open_parent() -> Iterator[Path]:
    """A directory everyone may enter (pytest's tmp_path is inside one only root may), so
    that what keeps another user out is the state dir's own mode."""
    base = Path(tempfile.mkdtemp(prefix="gpufleet-perms-"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


async def start(tmp_path: Path, state: Path) -> ControlPlane:
    plane = ControlPlane(store_url=f"sqlite:///{state / 'state.db'}", port=0, state_dir=state,
                         run_controllers=False)
    await plane.start()
    return plane


def secrets_of(state: Path) -> list[Path]:
    files = [state / n for n in ("state.db", "state.db-wal", "state.db-shm", "tokens.csv", "join-token",
                                 "kubeconfig")]
    return files + sorted((state / "pki").glob("*.key"))


async def test_state_dir_and_its_secrets_are_the_owners_only(open_parent: Path) -> None:
    tmp_path = open_parent
    state = tmp_path / "state"
    old_umask = os.umask(0o022)
    try:
        plane = await start(tmp_path, state)
        try:
            assert mode(state) == 0o700
            for f in secrets_of(state):
                assert f.exists(), f
                assert (mode(f), f.stat().st_uid) == (0o600, os.getuid()), f
        finally:
            await plane.stop()

        # An earlier run, an older version or a hand-made copy left them open: the next start
        # closes them again.
        os.chmod(state, 0o755)
        for f in secrets_of(state):
            f.touch()
            os.chmod(f, 0o644)
        os.chmod(state / "pki", 0o755)
        plane = await start(tmp_path, state)
        try:
            assert mode(state) == 0o700 and mode(state / "pki") == 0o700
            for f in secrets_of(state):
                assert mode(f) == 0o600, f
            if os.geteuid() != 0:
                pytest.skip("reading as another user needs root to switch users")
            # Even with the files themselves opened up again, the dir keeps others out...
            os.chmod(state / "tokens.csv", 0o644)
            assert not readable_by_another_user(state / "tokens.csv")
            # ...and with the dir opened, the files do.
            os.chmod(state / "tokens.csv", 0o600)
            os.chmod(state, 0o755)
            for f in secrets_of(state):
                assert not readable_by_another_user(f), f
            # The check itself can fail: a file others may read is read.
            open_file = state / "gateway-url"
            open_file.write_text("x\n")
            os.chmod(open_file, 0o644)
            assert readable_by_another_user(open_file)
        finally:
            await plane.stop()
    finally:
        os.umask(old_umask)


def test_a_running_gpufleet_up_keeps_every_state_file_to_its_owner(open_parent: Path) -> None:
    """A real `gpufleet up` (its agent too) under a loose umask, walked while it runs, with a
    Secret written so that the database has its -wal and -shm: no file there is readable, and
    no directory enterable, by group or others."""
    state = open_parent / "state"
    log = open_parent / "server.log"
    env = dict(os.environ, HOME=str(open_parent), PYTHONUNBUFFERED="1")
    env.pop("KUBECONFIG", None)
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.cli.main", "up", "--state-dir", str(state), "--port", "0",
             "--gateway-port", "0", "--runtime", "simulated"],
            stdout=subprocess.PIPE, stderr=err, text=True, env=env, start_new_session=True,
            umask=0o022)
    try:
        url = None
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("API server listening on "):
                url = line.split()[-1]
                break
        assert url, log.read_text()
        kubeconfig = yaml.safe_load((state / "kubeconfig").read_text())
        token = kubeconfig["users"][0]["user"]["token"]
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"k": "v"}}
        answer = httpx.post(f"{url}/api/v1/namespaces/default/secrets", json=secret, verify=False,
                            headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert answer.status_code == 201, answer.text
        # The agent has joined (its credentials are written) once its Node is registered.
        deadline = time.monotonic() + 60
        while not (state / "agent" / "node-token").exists():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.2)
        assert (state / "state.db-wal").exists() and (state / "state.db-shm").exists()
        walked = [state, *sorted(state.rglob("*"))]
        assert len(walked) > 10
        loose = [f"{oct(mode(p))} {p.relative_to(state)}" for p in walked
                 if not p.is_symlink() and mode(p) & 0o077]
        assert loose == [], loose
        assert mode(state) == 0o700 and mode(state / "agent") == 0o700
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
