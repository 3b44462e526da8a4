#!/usr/bin/env bash
# Sets up a fresh machine if needed, then runs the whole test suite (lint, layer contracts, tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ruff"
.venv/bin/ruff check gpufleet tests bench
echo "== import-linter (layer contracts)"
.venv/bin/lint-imports
echo "== pytest"
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "$@"
