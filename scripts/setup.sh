#!/usr/bin/env bash
# Installs everything gpufleet and its tests need on a fresh machine (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
need_apt=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
command -v podman >/dev/null 2>&1 || need_apt+=(podman)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
[ -x /bin/busybox ] || need_apt+=(busybox-static)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
# Container images (scripts/build-images.sh) and the tests' local OCI registry.
command -v mmdebstrap >/dev/null 2>&1 || need_apt+=(mmdebstrap)
[ -x /usr/bin/docker-registry ] || need_apt+=(docker-registry)
command -v htpasswd >/dev/null 2>&1 || need_apt+=(apache2-utils)
# The process runtime's sandbox: bwrap, and util-linux's setpriv, nsenter and unshare.
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
command -v setpriv >/dev/null 2>&1 || need_apt+=(util-linux)
# The test that Prometheus scrapes the API server's /metrics (tests/integration/test_prometheus_scrape.py).
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
# The dashboard's browser tests (tests/e2e/test_dashboard.py) drive Debian's chromium.
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} with apt-get"
  if [ "$(id -u)" -eq 0 ]; then apt-get update -qq && apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null; fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
echo "setup: installing gpufleet and test dependencies into .venv"
if ! .venv/bin/python -m pip install -q -e ".[test,gpu,ray]" >.venv/pip-install.log 2>&1; then
  cat .venv/pip-install.log >&2
  echo "setup: pip install failed (log above)" >&2
  exit 1
fi
# The training examples and their tests run real PyTorch (CPU wheel, gloo backend).
if ! .venv/bin/python -c "import torch, numpy" >/dev/null 2>&1; then
  echo "setup: installing torch==2.13.0 (CPU)"
  .venv/bin/python -m pip install -q torch==2.13.0 numpy >>.venv/pip-install.log 2>&1 \
    || { tail -20 .venv/pip-install.log >&2; echo "setup: torch install failed" >&2; exit 1; }
fi
.venv/bin/python -c "import gpufleet, fastapi, psycopg, kubernetes, hypothesis, torch, ray" \
  || { echo "setup: the install did not complete" >&2; exit 1; }

# The images the examples and the container tests run in; a no-op (well under a second)
# when their recipes have not changed. GPUFLEET_SKIP_IMAGES=1 leaves them out.
if [ "${GPUFLEET_SKIP_IMAGES:-0}" != 1 ]; then
  echo "setup: container images (scripts/build-images.sh)"
  PYTHON=.venv/bin/python bash scripts/build-images.sh
fi
