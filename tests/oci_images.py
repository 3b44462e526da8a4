"""The container images tests run (localhost/gpufleet/*), from scripts/build-images.sh.

`ensure_images("busybox")` returns {"busybox": "localhost/gpufleet/busybox:1"} once the image
is there: the builder skips an image whose recipe has not changed, so this costs a fraction
of a second after the first build (scripts/setup.sh builds them all on a fresh machine).
Like the podman runtime tests, a machine that cannot build them fails rather than skips."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "scripts" / "build-images.sh"
# A cold build of every image takes a minute or two on a quiet machine.
BUILD_TIMEOUT_S = 1200


def image_refs() -> dict[str, str]:
    """name -> reference, as the builder names them (no podman needed)."""
    proc = subprocess.run(
        ["bash", str(BUILD), "--refs"], capture_output=True, text=True, timeout=60, env=_env(), check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"scripts/build-images.sh --refs failed:\n{proc.stderr}", pytrace=False)
    return json.loads(proc.stdout)


def ensure_images(*names: str) -> dict[str, str]:
    missing = [t for t in ("podman", "runc") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"building images needs {', '.join(missing)}: run scripts/setup.sh", pytrace=False)
    proc = subprocess.run(
        ["bash", str(BUILD), *names],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        env=_env(),
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"scripts/build-images.sh {' '.join(names)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}",
            pytrace=False,
        )
    refs = image_refs()
    return {n: refs[n] for n in names}


def _env() -> dict[str, str]:
    # The builder downloads wheels with pip: the interpreter running the tests has it.
    return {**os.environ, "PYTHON": sys.executable}
