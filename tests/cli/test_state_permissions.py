"""The control plane's state dir holds the database (every Secret), the tokens, the
kubeconfig and the keys: only its owner may read it, also when an earlier run (or a loose
umask) left it open."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

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
