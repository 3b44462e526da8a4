#!/usr/bin/env bash
# Sets up a fresh machine if needed, starts a local gpufleet cluster, runs the quickstart
# example on it, shows what happened, and stops the cluster (pass --keep to leave it running).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

STATE_DIR=${GPUFLEET_STATE_DIR:-$(mktemp -d /tmp/gpufleet-demo.XXXXXX)}
LOG="$STATE_DIR/gpufleet-up.log"
echo "== starting gpufleet (state in $STATE_DIR)"
gpufleet up --state-dir "$STATE_DIR" --port 0 --gpus 4 --gpu-model H100-SXM-80GB >"$LOG" 2>&1 &
UP_PID=$!
cleanup() { if [ "${KEEP:-0}" != 1 ]; then kill -TERM "$UP_PID" 2>/dev/null || true; wait "$UP_PID" 2>/dev/null || true; fi; }
trap cleanup EXIT
[ "${1:-}" = "--keep" ] && KEEP=1

for _ in $(seq 1 100); do
  grep -q "API server listening on" "$LOG" 2>/dev/null && break
  kill -0 "$UP_PID" 2>/dev/null || { echo "gpufleet up exited:"; cat "$LOG"; exit 1; }
  sleep 0.2
done
export KUBECONFIG="$STATE_DIR/kubeconfig"
grep "API server listening on" "$LOG"

echo "== gpufleet apply -f examples/quickstart/web.yaml"
gpufleet apply -f examples/quickstart/web.yaml

echo "== waiting for the web replicas to be ready"
for _ in $(seq 1 60); do
  ready=$(gpufleet get deployment web -n demo -o json | python3 -c 'import json,sys; print(json.load(sys.stdin).get("status",{}).get("readyReplicas",0))')
  [ "$ready" = "2" ] && break
  sleep 1
done
gpufleet get nodes
gpufleet get deployments,pods -n demo -o wide
gpufleet get endpoints web -n demo
addr=$(gpufleet get endpoints web -n demo -o json | python3 -c 'import json,sys; s=json.load(sys.stdin)["subsets"][0]; print(s["addresses"][0]["ip"] + ":" + str(s["ports"][0]["port"]))')
echo "== GET http://$addr/ (one replica, through its endpoint)"
python3 -c "import urllib.request,sys; r=urllib.request.urlopen('http://$addr/'); print(r.status, r.headers['Server'])"

echo "== scaling to 3"
gpufleet scale deployment/web --replicas 3 -n demo
sleep 3
gpufleet get pods -n demo

echo "== the same cluster through kubectl"
if command -v kubectl >/dev/null; then kubectl get deploy,pods -n demo; fi

if [ "${KEEP:-0}" = 1 ]; then
  echo "cluster left running (pid $UP_PID): export KUBECONFIG=$KUBECONFIG"
fi
