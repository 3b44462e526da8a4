"""A small real training job: an MLP learns a fixed synthetic regression task with
DistributedDataParallel, checkpointing as it goes and resuming from the last checkpoint.

It runs the same way under every launcher a PyTorchJob uses:
- plain environment (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK), one process per pod;
- torchrun, fixed or elastic (PET_NNODES="2:4", c10d rendezvous): torchrun sets RANK,
  WORLD_SIZE and LOCAL_RANK for the processes it starts and restarts them when the group
  changes; each restart resumes from the checkpoint;
- alone (no environment at all): a world of one.

Backend: nccl when CUDA is available, gloo otherwise. The data set is generated from a seed,
so every rank of every attempt sees the same task; each step takes a batch per rank from a
stream indexed by (step, rank), so the work is split whatever the world size.

Checkpoints go to $GPUFLEET_CHECKPOINT_DIR (else ./checkpoints): rank 0 writes
``checkpoint.pt`` every --checkpoint-every steps through a temporary file and a rename, so
a crash never leaves a torn file behind. The directory must be the same for every member:
on several servers, a shared filesystem (NFS) mounted at the same path everywhere.

Output: one line per --log-every steps, e.g. ``step=120 loss=0.0312 world_size=4 rank=0``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FEATURES = 16
SAMPLES = 8192
CHECKPOINT = "checkpoint.pt"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300, help="train until this step")
    p.add_argument("--batch-size", type=int, default=64, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="pause after each step (stands in for a larger model's compute)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--init-process-group", action="store_true",
                   help="join a process group (and train under DDP) even in a world of one: checks "
                        "the backend, nccl on a GPU, where a server has a single GPU")
    return p.parse_args(argv)


def dataset(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    y = torch.tanh(x @ w) + 0.01 * torch.randn(SAMPLES, 1, generator=g)
    return x, y


def model() -> nn.Module:
    torch.manual_seed(0)  # every rank starts from the same weights
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def batch_indices(step: int, rank: int, world: int, size: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    return torch.randint(0, SAMPLES, (size,), generator=g)


def save(path: str, state: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(state, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    use_cuda = torch.cuda.is_available()
    device = torch.device("cpu")
    if use_cuda:
        local = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    distributed = world > 1 or args.init_process_group
    if distributed:
        backend = "nccl" if use_cuda else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60),
                                device_id=device if use_cuda else None)
        world, rank = dist.get_world_size(), dist.get_rank()
        # One all-reduce before training: every rank must see the sum of all ranks' values.
        probe = torch.full((1,), float(rank + 1), device=device)
        dist.all_reduce(probe)
        want = world * (world + 1) / 2
        name = torch.cuda.get_device_name(device) if use_cuda else "cpu"
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if use_cuda else "-"
        print(f"backend={backend} nccl={nccl} device={device} ({name}) all_reduce={probe.item():g} "
              f"want={want:g} world_size={world} rank={rank}", flush=True)
        if probe.item() != want:
            print("all_reduce returned the wrong sum", flush=True)
            return 1

    ckpt_dir = os.environ.get("GPUFLEET_CHECKPOINT_DIR") or "checkpoints"
    os.makedirs(ckpt_dir, exist_ok=True)
    ckpt_path = os.path.join(ckpt_dir, CHECKPOINT)

    net = model().to(device)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    step = 0
    if os.path.exists(ckpt_path):
        state = torch.load(ckpt_path, map_location=device)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
        print(f"resumed from step={step} checkpoint={ckpt_path} world_size={world} rank={rank}", flush=True)
    ddp = DistributedDataParallel(net) if distributed else net

    x, y = dataset(args.seed)
    x, y = x.to(device), y.to(device)
    loss_fn = nn.MSELoss()
    while step < args.steps:
        idx = batch_indices(step, rank, world, args.batch_size, args.seed).to(device)
        opt.zero_grad()
        loss = loss_fn(ddp(x[idx]), y[idx])
        loss.backward()
        opt.step()
        step += 1
        if step % args.log_every == 0 or step == args.steps:
            with torch.no_grad():
                full = loss_fn(net(x), y).item()
            print(f"step={step} loss={full:.4f} world_size={world} rank={rank}", flush=True)
        if rank == 0 and (step % args.checkpoint_every == 0 or step == args.steps):
            save(ckpt_path, {"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step})
        if args.step_sleep:
            time.sleep(args.step_sleep)

    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    print(f"done step={step} world_size={world} rank={rank}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
