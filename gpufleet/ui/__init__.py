"""The dashboard's built assets (static/), served by the API server at ``/ui/``.

The source is in ``ui/`` at the top of the repository; ``scripts/build-ui.sh`` bundles it
into ``static/``, which is committed so that installing gpufleet needs no Node.js.
"""

from __future__ import annotations

from pathlib import Path

STATIC = Path(__file__).parent / "static"
