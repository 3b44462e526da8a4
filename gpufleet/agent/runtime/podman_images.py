"""Image pulls of the podman runtime: per imagePullPolicy, with the pod's pull secrets."""

import asyncio
import contextlib
import json
import logging
import os
import tempfile
import time

from gpufleet.agent.runtime.base import (
    ImagePullError,
    PulledImage,
    RegistryAuth,
)
from gpufleet.agent.runtime.podman_args import _podman_error, auth_file_content, normalize_image

log = logging.getLogger(__name__)

class ImagesMixin:
    """PodmanRuntime's images (see podman.py)."""

    # --- images -------------------------------------------------------------------------

    async def image_exists(self, image: str) -> bool:
        rc, _, _ = await self._run("image", "exists", image)
        return rc == 0

    async def _image_id(self, image: str) -> tuple[str, int | None]:
        rc, out, _ = await self._run("image", "inspect", "--format", "json", image)
        if rc != 0:
            return "", None
        try:
            info = (json.loads(out) or [{}])[0]
        except ValueError:
            return "", None
        digests = info.get("RepoDigests") or []
        ident = digests[0] if digests else f"sha256:{info.get('Id', '')}"
        size = info.get("Size")
        return ident, int(size) if isinstance(size, int) else None

    async def ensure_image(self, image: str, pull_policy: str, auth: list[RegistryAuth]) -> PulledImage:
        ref = normalize_image(image)
        if not ref or any(c.isspace() for c in ref) or ref != ref.strip() or ref.startswith("/"):
            raise ImagePullError(f'Failed to apply default image tag "{image}": couldn\'t parse image '
                                 "name: invalid reference format", "InvalidImageName")
        policy = pull_policy or ("Always" if ref.endswith(":latest") and "@" not in ref else "IfNotPresent")
        lock = self._pull_locks.setdefault(ref, asyncio.Lock())
        async with lock:
            present = await self.image_exists(ref)
            if policy == "Never" or (policy == "IfNotPresent" and present):
                if not present:
                    raise ImagePullError(f'Container image "{image}" is not present with pull policy of Never',
                                         "ErrImageNeverPull")
                ident, size = await self._image_id(ref)
                return PulledImage(image=ref, image_id=ident, pulled=False, size_bytes=size)
            t0 = time.monotonic()
            args = ["pull", "--quiet"]
            authfile: str | None = None
            if auth:
                fd, authfile = tempfile.mkstemp(prefix="auth-", suffix=".json", dir=self._private_dir())
                with os.fdopen(fd, "w") as f:
                    json.dump(auth_file_content(auth), f)
                args += ["--authfile", authfile]
            try:
                rc, _, err = await self._run(*args, ref)
            finally:
                if authfile is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(authfile)
            if rc != 0:
                why = (_podman_error(err) or err.strip()).removeprefix("Error: ")
                raise ImagePullError(f'failed to pull image "{image}": {why}')
            ident, size = await self._image_id(ref)
            return PulledImage(image=ref, image_id=ident, pulled=True, size_bytes=size,
                               seconds=time.monotonic() - t0)

    def _private_dir(self) -> str:
        d = self.state_dir / "private"
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        return str(d)
