"""A torchrun-style program, shaped like pytorch/examples' DDP and FSDP2 examples, changed by one line.

``python program.py OUT CKPT``: run under ``torchrun`` it is torch's own program on gloo; with
``PROGRAM_MPICOMM=1`` it adds ``import mpicomm.torch`` (the one line) and runs under ``mpiexec``. It
reads ``LOCAL_RANK``, ``RANK`` and ``WORLD_SIZE`` before any process group exists (as
multigpu_torchrun.py does), makes a DeviceMesh with no process group started (as the tensor-parallel
examples do: the mesh starts the default group, with the device's default backend), trains a DDP model,
trains an FSDP2 model, saves it with DCP, resumes a fresh model from the checkpoint and trains on.
Rank 0 writes its results to ``OUT`` as JSON: the launch variables each rank saw, the backend, and the
final parameters of both models.
"""

from __future__ import annotations

import os

if os.environ.get("PROGRAM_MPICOMM") == "1":
    import mpicomm.torch  # noqa: F401 - the one line

import json
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

STEPS = 3


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)


def _train(model: nn.Module, rank: int, steps: range) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in steps:
        x, y = _batch(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _full(model: nn.Module) -> dict[str, list[float]]:
    state = get_model_state_dict(model)
    full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in state.items()}
    return {k: v.detach().flatten().tolist() for k, v in sorted(full.items())}


def main(out: str, ckpt: str) -> None:
    # read before any process group exists (multigpu_torchrun.py: torch.cuda.set_device(LOCAL_RANK))
    seen = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    local_rank = dist.get_node_local_rank()
    world = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh("cpu", (world,))  # no process group yet: the mesh starts one
    rank = dist.get_rank()
    backend = dist.group.WORLD.name()  # get_backend() answers "undefined" for a bare init

    ddp = DistributedDataParallel(_model(0))
    _train(ddp, rank, range(STEPS))

    model = _model(1)
    fully_shard(model, mesh=mesh)
    _train(model, rank, range(STEPS))
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=ckpt)
    resumed = _model(2)  # other weights: the checkpoint must replace them
    fully_shard(resumed, mesh=mesh)
    state = {"model": get_model_state_dict(resumed)}
    dcp.load(state, checkpoint_id=ckpt)
    resumed.load_state_dict(state["model"])
    _train(resumed, rank, range(STEPS, STEPS + 2))
    _train(model, rank, range(STEPS, STEPS + 2))

    seen_all: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(seen_all, {**seen, "node_local_rank": local_rank})
    result = {
        "backend": backend,
        "seen": seen_all,
        "ddp": _full(ddp.module),
        "fsdp": _full(model),
        "resumed": _full(resumed),
    }
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
