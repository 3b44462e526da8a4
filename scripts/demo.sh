#!/usr/bin/env bash
# Sets up a fresh machine if needed, starts a local gpufleet cluster, runs the quickstart
# example, the distributed training examples and the model server on it, each in containers
# of locally built images (podman; the process runtime where podman cannot run), shows what
# happened, and stops the cluster (pass --keep to leave it running).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
# The images the examples name (localhost/gpufleet/*), before the cluster starts; skipped
# in seconds when they are up to date.
bash scripts/build-images.sh

STATE_DIR=${GPUFLEET_STATE_DIR:-$(mktemp -d /tmp/gpufleet-demo.XXXXXX)}
mkdir -p "$STATE_DIR"
LOG="$STATE_DIR/gpufleet-up.log"
echo "== starting gpufleet (state in $STATE_DIR)"
gpufleet up --state-dir "$STATE_DIR" --port 0 --gateway-port 0 --gpus 4 --gpu-model H100-SXM-80GB >"$LOG" 2>&1 &
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

# Distributed training: examples/training/train.py (a real torch model, DDP on gloo) as a
# PyTorchJob, in containers of the examples image (scripts/build-images.sh).
job_state() { gpufleet get pytorchjob "$1" -o json | python3 -c 'import json,sys; c=[x["type"] for x in json.load(sys.stdin).get("status",{}).get("conditions",[]) if x["status"]=="True"]; print(c[-1] if c else "")'; }
world_size() { gpufleet logs "$1" 2>/dev/null | grep -o "world_size=[0-9]*" | tail -1 | cut -d= -f2; }

echo "== gpufleet apply -f examples/training/pytorchjob.yaml (1 Master + 2 Workers, 1 GPU each)"
gpufleet apply -f examples/training/pytorchjob.yaml
for _ in $(seq 1 120); do
  state=$(job_state mlp)
  [ "$state" = "Succeeded" ] || [ "$state" = "Failed" ] && break
  sleep 1
done
gpufleet get pytorchjobs
gpufleet logs mlp-master-0 | grep "^step=" | sed -n '1p;$p'

echo "== elastic: gpufleet apply -f examples/training/pytorchjob-elastic.yaml (2..4 Workers)"
gpufleet apply -f examples/training/pytorchjob-elastic.yaml
# maxReplicas > minReplicas: the controller grows the job into the idle GPUs by itself.
for _ in $(seq 1 90); do [ "$(world_size mlp-elastic-worker-0)" = "3" ] && break; sleep 1; done
gpufleet get pytorchjobs
echo "== gpufleet scale pytorchjob/mlp-elastic --replicas 4"
gpufleet scale pytorchjob/mlp-elastic --replicas 4
for _ in $(seq 1 60); do [ "$(world_size mlp-elastic-worker-0)" = "4" ] && break; sleep 1; done
gpufleet get pytorchjobs
gpufleet logs mlp-elastic-worker-0 | grep "^resumed\|^step=" | tail -3
gpufleet describe pytorchjob mlp-elastic | grep -E "ElasticGrow|Resizing" || true
gpufleet delete pytorchjob mlp-elastic

# Serving: a PyTorch model server behind a Service, scaled by an HPA on the gateway's request
# rate, down to zero replicas and back: the first request wakes it up.
GATEWAY=$(cat "$STATE_DIR/gateway-url")
echo "== gpufleet apply -f examples/serving/model.yaml (scales on requests per second, to zero when idle)"
gpufleet apply -f examples/serving/model.yaml
echo "== POST $GATEWAY/services/serving/classifier/predict (held by the gateway until a replica is Ready)"
python3 -c "import urllib.request; r=urllib.request.urlopen(urllib.request.Request('$GATEWAY/services/serving/classifier/predict', data=b'', method='POST'), timeout=120); print(r.status, r.read().decode()[:120])"
gpufleet get deployment,pods,hpa -n serving
POD=$(gpufleet get pods -n serving -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["items"][0]["metadata"]["name"])')
gpufleet logs -n serving "$POD" | tail -3

if [ "${KEEP:-0}" = 1 ]; then
  echo "cluster left running (pid $UP_PID): export KUBECONFIG=$KUBECONFIG"
fi
