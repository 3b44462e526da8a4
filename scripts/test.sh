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
# Two workers, each test file on one (its module-scoped clusters are started once); much of
# the suite waits on real servers, agents and pods. `-n 0` runs it in one process.
.venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=25 "$@"
