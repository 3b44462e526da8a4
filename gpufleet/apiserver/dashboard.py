"""The dashboard at ``/ui/``: the files of the single-page application (its watches, carried
on one stream at ``/ui/watch``, are dashboardwatch.py's).

They load without a token (as the Kubernetes Dashboard's do): the page holds no data. Every
read the page makes is an API call with the user's own bearer token, so authentication,
RBAC and flow control treat it as they treat kubectl. A path under ``/ui/`` that names no
file is a view of the application (``/ui/nodes/gpu-0``, a deep link): it gets index.html
and the page routes it.
"""

from __future__ import annotations

import functools
import mimetypes
from pathlib import Path

from gpufleet.ui import STATIC
from gpufleet.utils.http import RawResponse

PREFIX = "/ui"
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".html": "text/html; charset=utf-8", ".map": "application/json", ".svg": "image/svg+xml"}


def is_dashboard(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


@functools.lru_cache(maxsize=64)
def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def serve(method: str, path: str, root: Path = STATIC) -> RawResponse:
    if method.upper() not in ("GET", "HEAD"):
        return RawResponse(405, {"content-type": "text/plain", "allow": "GET, HEAD"}, b"method not allowed")
    if path == PREFIX:  # relative asset URLs resolve against /ui/
        return RawResponse(301, {"location": PREFIX + "/"}, b"")
    rel = path[len(PREFIX) + 1:]
    name = rel if rel and "/" not in rel and not rel.startswith(".") else "index.html"
    body = _read(root / name) if name != "index.html" else None
    if body is None:  # a view of the application, not a file
        name = "index.html"
        body = _read(root / name)
    if body is None:
        return RawResponse(404, {"content-type": "text/plain"},
                           b"the dashboard is not built: run scripts/build-ui.sh")
    ctype = _TYPES.get(Path(name).suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"
    # The file names are fixed: the browser asks again (cheaply) instead of keeping an old build.
    return RawResponse(200, {"content-type": ctype, "cache-control": "no-cache",
                             "x-content-type-options": "nosniff"}, body)
