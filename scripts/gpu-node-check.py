"""Checks one GPU server end to end: what the agent's NVML discovery finds, the GPU metrics it
reports, and a real training job on the GPU through a local cluster.

    python3 scripts/gpu-node-check.py [--out DIR] [--declared N]

On the server, from a checkout with gpufleet importable (pip install -e . or PYTHONPATH):
1. NVML discovery and health: the GPUs as the agent fingerprints them (model, memory, UUID,
   PCI bus, NVLink peers, MIG), their live stats and health signals, beside nvidia-smi's view.
2. The agent's own GPU validation (python -m gpufleet.agent.gpucheck) on GPU 0.
3. `gpufleet up` (SQLite, process runtime, GPUs from NVML): the node's GPU capacity and
   labels; a PyTorchJob of one GPU that joins an nccl process group, checks an all-reduce
   and trains examples/training/train.py under DDP; a second pod asking for a GPU while the
   job holds the only one stays Pending (describe says why) and runs once the GPU is free;
   while the job trains, the node's DCGM-named metrics (nodes/<name>/proxy/metrics), `gpufleet
   top nodes` and nvidia-smi's compute processes.
Prints what it sees and, last, one JSON line of the figures; exit 0 when every check passed.

--declared N runs the same flow on a machine without GPUs (N declared GPUs, gloo instead of
nccl): a dry run of the script itself.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "examples" / "training" / "train.py"
results: dict[str, object] = {}
failures: list[str] = []


def section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"[{'ok' if ok else 'FAIL'}] {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        failures.append(name)


def sh(cmd: list[str], *, timeout: float = 60, env: dict | None = None, quiet: bool = False) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        out = p.stdout + (p.stderr if p.returncode else "")
    except (OSError, subprocess.TimeoutExpired) as exc:
        out = f"{cmd[0]}: {exc}"
    if not quiet:
        print(f"$ {' '.join(cmd)}\n{out.rstrip()}", flush=True)
    return out


def plain(obj: object) -> object:
    if dataclasses.is_dataclass(obj):
        return {k: plain(v) for k, v in dataclasses.asdict(obj).items()}
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json", exclude_none=True)
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [plain(v) for v in obj]
    return obj


def nvml_discovery() -> None:
    section("1. NVML discovery (gpufleet.agent.devices.nvml)")
    from gpufleet.agent.devices.nvml import NvmlDevices

    t0 = time.monotonic()
    devices = NvmlDevices()
    gpus = devices.fingerprint()
    results["nvmlDiscoverySeconds"] = round(time.monotonic() - t0, 3)
    for g in gpus:
        print(json.dumps(plain(g), default=str), flush=True)
    results["gpus"] = [plain(g) for g in gpus]
    check("NVML finds at least one GPU", len(gpus) > 0, f"{len(gpus)} GPU(s)")
    stats = devices.stats()
    print("stats:", json.dumps(plain(stats), default=str), flush=True)
    results["idleStats"] = plain(stats)
    check("NVML reads every GPU's stats", set(stats) == {g.index for g in gpus}, f"indices {sorted(stats)}")
    signals = devices.health_signals()
    print("health signals:", json.dumps(plain(signals), default=str), flush=True)
    results["healthSignals"] = plain(signals)
    devices.close()
    if shutil.which("nvidia-smi"):
        smi = sh(["nvidia-smi", "--query-gpu=index,name,uuid,pci.bus_id,memory.total,driver_version,mig.mode.current",
                  "--format=csv,noheader"])
        uuids = set(re.findall(r"GPU-[0-9a-f-]+", smi))
        check("NVML and nvidia-smi agree on the UUIDs", uuids == {g.uuid for g in gpus},
              f"nvidia-smi {sorted(uuids)}")
        sh(["nvidia-smi", "topo", "-m"])


def validation(env: dict) -> None:
    section("2. The agent's GPU validation on GPU 0 (python -m gpufleet.agent.gpucheck)")
    out = sh([sys.executable, "-m", "gpufleet.agent.gpucheck"], env={**env, "CUDA_VISIBLE_DEVICES": "0"}, timeout=180)
    check("gpucheck passes", "passed" in out, out.strip().splitlines()[-1] if out.strip() else "")


class Cluster:
    def __init__(self, state: Path, env: dict, declared: int | None) -> None:
        self.state, self.env = state, env
        cmd = [sys.executable, "-m", "gpufleet.cli.main", "up", "--state-dir", str(state), "--port", "0",
               "--gateway-port", "0", "--runtime", "process"]
        if declared:
            cmd += ["--gpus", str(declared), "--gpu-model", "H100-SXM-80GB"]
        self.log = open(state / "up.log", "w")
        print("$", " ".join(cmd), flush=True)
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        while "API server listening on" not in (state / "up.log").read_text():
            if self.proc.poll() is not None or time.monotonic() - t0 > 120:
                print((state / "up.log").read_text())
                raise SystemExit("gpufleet up did not start")
            time.sleep(0.2)
        results["upSeconds"] = round(time.monotonic() - t0, 2)
        self.env = {**env, "KUBECONFIG": str(state / "kubeconfig")}

    def gf(self, *args: str, quiet: bool = False, timeout: float = 60) -> str:
        return sh([sys.executable, "-m", "gpufleet.cli.main", *args], env=self.env, quiet=quiet, timeout=timeout)

    def json(self, *args: str) -> dict:
        out = self.gf("get", *args, "-o", "json", quiet=True)
        try:
            return json.loads(out)
        except ValueError:
            return {}

    def raw(self, path: str) -> str:
        from gpufleet.client import Client, transport_from_kubeconfig

        async def get() -> str:
            async with Client(transport_from_kubeconfig(self.env["KUBECONFIG"])) as c:
                resp = await c.raw_request("GET", path, raise_for_status=False)
                return resp.body.decode(errors="replace") if isinstance(resp.body, bytes) else str(resp.body)

        return asyncio.run(get())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


# The second pod: what its sandbox shows (user, devices, processes, CUDA's view), then
# about 12 s of bf16 matrix products, so the metrics are read under load.
PROBE = r"""
import os, time
import torch
print("uid", os.getuid(), "gid", os.getgid(), "groups", os.getgroups())
print("/dev:", " ".join(sorted(os.listdir("/dev"))))
print("processes seen:", len([p for p in os.listdir("/proc") if p.isdigit()]))
print("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"), "NVIDIA_VISIBLE_DEVICES",
      os.environ.get("NVIDIA_VISIBLE_DEVICES"))
n = torch.cuda.device_count()
print("second pod sees", n, "GPU(s):", [torch.cuda.get_device_name(i) for i in range(n)], flush=True)
if n:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0, k = time.time(), 0
    while time.time() - t0 < 12:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        k += 20
    dt = time.time() - t0
    print(f"matmul bf16 8192^3 x{k}: {2 * 8192**3 * k / dt / 1e12:.0f} TFLOP/s", flush=True)
"""


def manifests(declared: int | None) -> tuple[str, str]:
    # The pod runs as the unprivileged default user, who may not read the checkout: it gets
    # its own copy of train.py in a directory everyone can read.
    public = Path(tempfile.mkdtemp(prefix="gpufleet-gpucheck-", dir="/var/tmp"))
    public.chmod(0o755)
    train = public / "train.py"
    shutil.copy(TRAIN, train)
    train.chmod(0o644)
    gpu = {"limits": {"nvidia.com/gpu": 1}}
    job = {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "nccl-check", "namespace": "default"},
        "spec": {"runPolicy": {"backoffLimit": 1}, "pytorchReplicaSpecs": {"Master": {
            "replicas": 1, "restartPolicy": "OnFailure",
            "template": {"spec": {"terminationGracePeriodSeconds": 5, "containers": [{
                "name": "pytorch", "image": "host",
                "command": [sys.executable, str(train), "--init-process-group", "--steps", "1500",
                            "--batch-size", "4096", "--log-every", "250", "--step-sleep", "0.01"],
                "resources": gpu}]}}}}},
    }
    probe = public / "gpu_probe.py"
    probe.write_text(PROBE)
    probe.chmod(0o644)
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-second", "namespace": "default"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "probe", "image": "host", "command": [sys.executable, str(probe)], "resources": gpu}]},
    }
    del declared
    return json.dumps(job), json.dumps(pod)


def phase(c: Cluster, name: str) -> str:
    return c.json("pod", name).get("status", {}).get("phase", "")


def out_so_far(c: Cluster) -> str:
    return c.gf("logs", "gpu-second", quiet=True)


def job_condition(c: Cluster) -> str:
    conds = [x["type"] for x in c.json("pytorchjob", "nccl-check").get("status", {}).get("conditions", [])
             if x.get("status") == "True"]
    return conds[-1] if conds else ""


def training(c: Cluster, declared: int | None) -> None:
    section("3. The node as the cluster sees it")
    c.gf("get", "nodes", "-o", "wide")
    nodes = c.json("nodes").get("items", [])
    node = nodes[0] if nodes else {}
    name = node.get("metadata", {}).get("name", "")
    cap = node.get("status", {}).get("capacity", {})
    labels = {k: v for k, v in node.get("metadata", {}).get("labels", {}).items() if "gpu" in k or "nvidia" in k}
    print("capacity:", json.dumps(cap), "\nGPU labels:", json.dumps(labels, indent=1), flush=True)
    want = declared or len(results.get("gpus") or [])
    results["nodeGpuCapacity"] = cap.get("nvidia.com/gpu")
    check("the node's nvidia.com/gpu capacity is what discovery found", str(cap.get("nvidia.com/gpu")) == str(want),
          f"{cap.get('nvidia.com/gpu')} vs {want}")

    section("4. A PyTorchJob on one GPU (nccl) and a second GPU pod")
    job, pod = manifests(declared)
    (c.state / "job.yaml").write_text(job)
    (c.state / "pod.yaml").write_text(pod)
    t0 = time.monotonic()
    c.gf("apply", "-f", str(c.state / "job.yaml"))
    master = "nccl-check-master-0"
    while phase(c, master) != "Running" and time.monotonic() - t0 < 180:
        time.sleep(0.5)
    results["jobRunningSeconds"] = round(time.monotonic() - t0, 2)
    check("the job's pod runs", phase(c, master) == "Running", f"after {results['jobRunningSeconds']} s")
    c.gf("apply", "-f", str(c.state / "pod.yaml"))
    time.sleep(8)
    second = phase(c, "gpu-second")
    check("a second GPU pod waits while the only GPU is held", declared not in (None, 1) or second == "Pending",
          f"phase {second!r}")
    c.gf("describe", "pod", "gpu-second")

    section("5. GPU metrics while the job trains")
    metrics = c.raw(f"/api/v1/nodes/{name}/proxy/metrics")
    dcgm = [line for line in metrics.splitlines() if line.startswith(("DCGM_", "gpufleet_gpu"))]
    print("\n".join(dcgm[:60]), flush=True)
    util = [float(x) for x in re.findall(r"^DCGM_FI_DEV_GPU_UTIL\{[^}]*\} ([0-9.e+]+)$", metrics, re.M)]
    used = [float(x) for x in re.findall(r"^DCGM_FI_DEV_FB_USED\{[^}]*\} ([0-9.e+]+)$", metrics, re.M)]
    results["trainingGpuUtil"], results["trainingFbUsedMiB"] = util, used
    check("the node reports DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_FB_USED per GPU", bool(util) and bool(used),
          f"util {util} fb {used}")
    if not declared:
        check("the job's GPU memory shows in DCGM_FI_DEV_FB_USED", any(u > 0 for u in used), f"{used} MiB")
    c.gf("top", "nodes")
    c.gf("top", "pods")
    if shutil.which("nvidia-smi"):
        sh(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv"])
        sh(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used,power.draw,temperature.gpu,clocks.sm",
            "--format=csv"])

    while job_condition(c) not in ("Succeeded", "Failed") and time.monotonic() - t0 < 420:
        time.sleep(1)
    results["jobSeconds"] = round(time.monotonic() - t0, 2)
    logs = c.gf("logs", master)
    backend = re.search(r"backend=(\w+) nccl=(\S+) device=(\S+) \(([^)]*)\) all_reduce=(\S+) want=(\S+)", logs)
    losses = [float(x) for x in re.findall(r"^step=\d+ loss=([0-9.]+)", logs, re.M)]
    results["jobCondition"] = job_condition(c)
    results["backendLine"] = backend.group(0) if backend else None
    results["losses"] = losses
    check("the PyTorchJob succeeded", results["jobCondition"] == "Succeeded", f"after {results['jobSeconds']} s")
    check("it ran on the expected backend" + ("" if declared else " (nccl on the GPU)"),
          bool(backend) and backend.group(1) == ("gloo" if declared else "nccl") and backend.group(5) == backend.group(6),
          backend.group(0) if backend else "no backend line")
    check("the loss fell", len(losses) >= 2 and losses[-1] < losses[0], f"{losses[:1]} -> {losses[-1:]}")

    t1 = time.monotonic()
    loaded: list[float] = []
    while phase(c, "gpu-second") not in ("Succeeded", "Failed") and time.monotonic() - t1 < 120:
        if "matmul" not in out_so_far(c) and "sees" in out_so_far(c):
            m = c.raw(f"/api/v1/nodes/{name}/proxy/metrics")
            loaded += [float(x) for x in re.findall(r"^DCGM_FI_DEV_GPU_UTIL\{[^}]*\} ([0-9.e+]+)$", m, re.M)]
        time.sleep(1)
    print("GPU utilization read under load:", loaded, flush=True)
    out = c.gf("logs", "gpu-second")
    check("the second pod got the GPU once it was free", phase(c, "gpu-second") == "Succeeded"
          and (declared is not None or "sees 1 GPU" in out), phase(c, "gpu-second"))
    uid = re.search(r"^uid (\d+)", out, re.M)
    check("the pod runs as the unprivileged default user, not root", bool(uid) and uid.group(1) == "65534",
          uid.group(0) if uid else "no uid line")
    devs = re.search(r"^/dev: (.*)$", out, re.M)
    nvidia = sorted(d for d in (devs.group(1).split() if devs else []) if d.startswith("nvidia"))
    results["podDevNvidia"] = nvidia
    if not declared:
        check("its /dev holds its one GPU's device node and no other", "nvidia0" in nvidia
              and not any(re.fullmatch(r"nvidia[1-9]\d*", d) for d in nvidia), " ".join(nvidia))
    results["loadGpuUtil"] = loaded
    if not declared:
        check("DCGM_FI_DEV_GPU_UTIL shows the load of the matrix products", bool(loaded) and max(loaded) >= 50,
              f"{loaded} %")
    c.gf("get", "events")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="also write the report's JSON here")
    ap.add_argument("--declared", type=int, default=None, help="declare N GPUs instead of NVML (dry run)")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    t0 = time.monotonic()
    bwrap = shutil.which("bwrap")
    print("bubblewrap:", sh([bwrap, "--version"], quiet=True).strip() if bwrap else "not installed (pods run "
          "as plain host processes)", flush=True)
    results["bwrap"] = bool(bwrap)
    if args.declared is None:
        nvml_discovery()
        validation(env)
    state = Path(tempfile.mkdtemp(prefix="gpufleet-gpucheck-"))
    c = Cluster(state, env, args.declared)
    try:
        training(c, args.declared)
    finally:
        c.stop()
        tail = (state / "up.log").read_text().splitlines()
        print("\n== gpufleet up log (warnings and errors)\n" + "\n".join(
            line for line in tail if " WARNING " in line or " ERROR " in line)[-6000:], flush=True)
    results["seconds"] = round(time.monotonic() - t0, 1)
    results["failures"] = failures
    line = json.dumps(results, default=str)
    if args.out:
        args.out.write_text(line + "\n")
    print("\n" + line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
