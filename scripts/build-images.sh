#!/usr/bin/env bash
# Builds the container images the examples and tests run in (localhost/gpufleet/*) from
# Debian packages and pinned wheels; an image whose recipe has not changed is skipped.
# See tools/build_images.py (--help) for the images and options.
set -euo pipefail
cd "$(dirname "$0")/.."
# The builder needs pip (to download the pinned wheels): the project's virtualenv has it.
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
exec "$PY" tools/build_images.py "$@"
