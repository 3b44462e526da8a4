"""The default GPU validation on real GPUs: ``python -m gpufleet.agent.gpucheck``.

Run by the agent with exactly the GPU to validate visible (CUDA_VISIBLE_DEVICES). With torch:
allocate on the device, multiply, synchronize and compare with the CPU's answer. Without it:
``nvidia-smi`` must read the device (its UUID in GPUFLEET_GPU_UUID). Exit 0 passes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def _torch_check() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        print("torch sees no CUDA device")
        return 1
    a = torch.arange(256 * 256, dtype=torch.float32).reshape(256, 256) / 65536.0
    got = (a.cuda() @ a.cuda()).cpu()
    torch.cuda.synchronize()
    want = a @ a
    if not torch.allclose(got, want, rtol=1e-3, atol=1e-3):
        print("a matrix product on the GPU differs from the CPU's")
        return 1
    print(f"CUDA check passed on {torch.cuda.get_device_name(0)}")
    return 0


def _smi_check() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        print("neither torch nor nvidia-smi is installed")
        return 1
    target = os.environ.get("GPUFLEET_GPU_UUID") or os.environ.get("NVIDIA_VISIBLE_DEVICES") or "0"
    proc = subprocess.run([smi, "-i", target, "--query-gpu=uuid,name,ecc.errors.uncorrected.volatile.total",
                           "--format=csv,noheader"], capture_output=True, text=True, timeout=60, check=False)
    print((proc.stdout or proc.stderr).strip())
    return proc.returncode


def main() -> int:
    code = _torch_check()
    return _smi_check() if code is None else code


if __name__ == "__main__":
    sys.exit(main())
