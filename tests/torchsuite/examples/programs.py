"""Real torch.distributed programs, written again in our own words with the same calls in the same way.

* ``detectron2``: the helpers of detectron2's ``detectron2/utils/comm.py`` (``synchronize`` with its
  ``Backend.NCCL`` branch, a Gloo group for objects, ``all_gather``/``gather`` of objects,
  ``shared_random_seed``, ``reduce_dict``), started as detectron2's launcher does:
  ``init_process_group(backend="GLOO", init_method=..., world_size=..., rank=...)``.
* ``torchmetrics``: torchmetrics' ``gather_all_tensors`` (shapes first, then equal or padded
  ``all_gather``) and a synced metric (``all_reduce`` of running sums).
* ``tutorial``: the PyTorch tutorial "Writing Distributed Applications with PyTorch": blocking and
  non-blocking point-to-point, ``all_reduce`` with ``dist.reduce_op.SUM``, the hand-written ring
  all-reduce and the distributed synchronous SGD, started with ``init_process_group('gloo', ...)``
  or, in its MPI recipe, ``init_process_group('mpi', rank=0, world_size=0)``.
* ``c10d``: the group object's c10d methods (``pg.reduce``, ``pg.gather``, ``pg.scatter``,
  ``pg.allreduce_coalesced``, ``pg._allgather_base``) with c10d's list arguments and torch's own
  options objects (``ReduceOptions``, ...), as code below ``torch.distributed``'s functions calls them.

``run(dist, program, rank, size)`` runs one of them with ``dist`` being ``torch.distributed`` or
``mpicomm``, and returns what rank 0 would print, as plain JSON values.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

FLOAT = torch.float64


def _init(dist: Any, backend: str, rank: int, size: int, **kwargs: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mpicomm: "served by MPI"; the MPI recipe's rank=0, world_size=0
        dist.init_process_group(backend, rank=rank, world_size=size, **kwargs)


# ----------------------------------------------------------------------------- detectron2 comm.py


def detectron2(dist: Any, rank: int, size: int) -> dict[str, Any]:
    """detectron2's comm helpers, in order of a training script's use."""
    _init(dist, "GLOO", rank, size, init_method=os.environ["EXAMPLE_INIT"])
    out: dict[str, Any] = {"world_size": dist.get_world_size(), "rank": dist.get_rank()}
    # detectron2 makes one group per machine for get_local_rank; here one machine
    local = dist.new_group(list(range(size)))
    out["local_rank"] = dist.get_rank(group=local)

    def synchronize() -> None:
        if dist.get_world_size() == 1:
            return
        if dist.get_backend() == dist.Backend.NCCL:
            dist.barrier(device_ids=[0])
        else:
            dist.barrier()

    def gloo_group() -> Any:
        return dist.new_group(backend="gloo") if dist.get_backend() == "nccl" else dist.group.WORLD

    def all_gather(data: Any) -> list[Any]:
        output: list[Any] = [None for _ in range(dist.get_world_size(gloo_group()))]
        dist.all_gather_object(output, data, group=gloo_group())
        return output

    def gather(data: Any, dst: int = 0) -> list[Any]:
        group = gloo_group()
        if dist.get_rank(group=group) == dst:
            output: list[Any] = [None for _ in range(dist.get_world_size(group))]
            dist.gather_object(data, output, dst=dst, group=group)
            return output
        dist.gather_object(data, None, dst=dst, group=group)
        return []

    def shared_random_seed() -> int:
        ints = torch.randint(2**31, (1,), generator=torch.Generator().manual_seed(100 + rank)).item()
        return int(all_gather(ints)[0])

    def reduce_dict(input_dict: dict[str, torch.Tensor], average: bool = True) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            names = sorted(input_dict.keys())
            values = torch.stack([input_dict[k] for k in names], dim=0)
            dist.reduce(values, dst=0)
            if dist.get_rank() == 0 and average:
                values /= dist.get_world_size()
            return dict(zip(names, values, strict=True))

    synchronize()
    out["all_gather"] = all_gather({"rank": rank, "name": f"worker{rank}"})
    out["gather"] = gather([rank] * (rank + 1))
    out["seed"] = shared_random_seed()
    losses = {
        "loss_cls": torch.tensor(0.5 * (rank + 1), dtype=FLOAT),
        "loss_box": torch.tensor(float(rank), dtype=FLOAT),
    }
    reduced = reduce_dict(losses)
    out["reduce_dict"] = {k: v.item() for k, v in reduced.items()} if rank == 0 else None
    synchronize()
    dist.destroy_process_group()
    return out


# ----------------------------------------------------------------------------- torchmetrics


def torchmetrics(dist: Any, rank: int, size: int) -> dict[str, Any]:
    """torchmetrics' gather_all_tensors, even and uneven, and a synced accuracy."""
    _init(dist, "gloo", rank, size, init_method=os.environ["EXAMPLE_INIT"])

    def gather_all_tensors(result: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
        if group is None:
            group = dist.group.WORLD
        result = result.contiguous()
        world_size = dist.get_world_size(group)
        dist.barrier(group=group)
        if result.ndim == 0:
            gathered = [torch.zeros_like(result) for _ in range(world_size)]
            dist.all_gather(gathered, result, group)
            return gathered
        local_size = torch.tensor(result.shape, device=result.device)
        local_sizes = [torch.zeros_like(local_size) for _ in range(world_size)]
        dist.all_gather(local_sizes, local_size, group=group)
        max_size = torch.stack(local_sizes).max(dim=0).values
        if all(bool((ls == max_size).all()) for ls in local_sizes):
            gathered = [torch.zeros_like(result) for _ in range(world_size)]
            dist.all_gather(gathered, result, group)
            return gathered
        pad_dims = []
        pad_by = (max_size - local_size).detach().cpu()
        for val in reversed(pad_by):
            pad_dims.append(0)
            pad_dims.append(int(val.item()))
        result_padded = torch.nn.functional.pad(result, pad_dims)
        gathered = [torch.zeros_like(result_padded) for _ in range(world_size)]
        dist.all_gather(gathered, result_padded, group)
        for idx, item_size in enumerate(local_sizes):
            slice_param = [slice(dim_size) for dim_size in item_size]
            gathered[idx] = gathered[idx][tuple(slice_param)]
        return gathered

    g = torch.Generator().manual_seed(7 + rank)
    even = gather_all_tensors(torch.rand(3, 2, generator=g, dtype=FLOAT))
    uneven = gather_all_tensors(torch.arange(rank + 2, dtype=FLOAT).reshape(-1, 1) * (rank + 1))
    scalar = gather_all_tensors(torch.tensor(float(rank), dtype=FLOAT))
    preds = torch.randint(0, 3, (10 + rank,), generator=g)
    target = torch.randint(0, 3, (10 + rank,), generator=g)
    state = torch.stack([(preds == target).sum(), torch.tensor(preds.numel())]).to(torch.int64)
    dist.all_reduce(state, op=dist.ReduceOp.SUM)
    out = {
        "even": [t.tolist() for t in even],
        "uneven": [t.tolist() for t in uneven],
        "scalar": [t.item() for t in scalar],
        "accuracy": (state[0] / state[1]).item(),
    }
    dist.destroy_process_group()
    return out


# ----------------------------------------------------------------------------- the tutorial


def tutorial(dist: Any, rank: int, size: int, backend: str = "gloo") -> dict[str, Any]:
    """The tutorial's programs, in order; ``backend='mpi'`` takes its MPI recipe's start."""
    if backend == "mpi":
        _init(dist, "mpi", 0, 0)  # the recipe: the MPI launch decides rank and size
        rank, size = dist.get_rank(), dist.get_world_size()
    else:
        _init(dist, "gloo", rank, size)  # env:// from MASTER_ADDR and MASTER_PORT, as the tutorial sets
    out: dict[str, Any] = {}
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        for dst in range(1, size):
            dist.send(tensor=tensor, dst=dst)
    else:
        dist.recv(tensor=tensor, src=0)
    out["blocking"] = tensor.item()
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 2
        reqs = [dist.isend(tensor=tensor, dst=dst) for dst in range(1, size)]
    else:
        reqs = [dist.irecv(tensor=tensor, src=0)]
    for req in reqs:
        req.wait()
    out["non_blocking"] = tensor.item()
    group = dist.new_group(list(range(size)))
    tensor = torch.ones(1)
    dist.all_reduce(tensor, op=dist.reduce_op.SUM, group=group)
    out["all_reduce"] = tensor.item()
    out["ring"] = _ring_allreduce(dist, rank, size, torch.arange(size * 3, dtype=FLOAT) + rank)
    out["losses"] = _sgd(dist, rank, size)
    dist.destroy_process_group()
    return out


def _ring_allreduce(dist: Any, rank: int, size: int, send: torch.Tensor) -> list[float]:
    """The tutorial's allreduce: pass the accumulating buffer around the ring with isend/recv."""
    send = send.clone()
    recv_buff = send.clone()
    accum = send.clone()
    left, right = (rank - 1) % size, (rank + 1) % size
    for i in range(size - 1):
        if i % 2 == 0:
            send_req = dist.isend(send, right)
            dist.recv(recv_buff, left)
            accum[:] += recv_buff[:]
        else:
            send_req = dist.isend(recv_buff, right)
            dist.recv(send, left)
            accum[:] += send[:]
        send_req.wait()
    return [float(x) for x in accum]


def _sgd(dist: Any, rank: int, size: int) -> list[float]:
    """The tutorial's distributed synchronous SGD on a synthetic data set, the loss per epoch."""
    torch.manual_seed(1234)
    data = torch.randn(96, 8, dtype=FLOAT)
    labels = (data @ torch.linspace(-1, 1, 8, dtype=FLOAT) > 0).long()
    part = 96 // size
    mine = slice(rank * part, (rank + 1) * part)  # DataPartitioner: one shard per rank
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(FLOAT)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    losses = []
    for _ in range(3):
        epoch_loss = 0.0
        for start in range(mine.start, mine.stop, 8):
            x, y = data[start : min(start + 8, mine.stop)], labels[start : min(start + 8, mine.stop)]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            epoch_loss += loss.item()
            loss.backward()
            for param in model.parameters():  # average_gradients
                dist.all_reduce(param.grad.data, op=dist.reduce_op.SUM)
                param.grad.data /= float(size)
            optimizer.step()
        total = torch.tensor([epoch_loss], dtype=FLOAT)
        dist.all_reduce(total)
        losses.append(total.item())
    return losses


# ----------------------------------------------------------------------------- c10d group methods


def c10d(dist: Any, rank: int, size: int) -> dict[str, Any]:
    """The group object's c10d methods, with c10d's list arguments and options objects."""
    from torch.distributed import distributed_c10d as c10d_options  # torch's options classes

    _init(dist, "gloo", rank, size, init_method=os.environ["EXAMPLE_INIT"])
    pg = dist.group.WORLD
    root = size - 1
    mine = torch.arange(3, dtype=FLOAT) * (rank + 1) + rank
    out: dict[str, Any] = {}
    x = mine.clone()
    opts = c10d_options.ReduceOptions()
    opts.reduceOp, opts.rootRank = c10d_options.ReduceOp.MAX, root  # torch's options take its ReduceOp
    pg.reduce([x], opts).wait()
    out["reduce_max"] = x.tolist() if rank == root else None  # elsewhere unspecified (gloo: partials)
    gathered = [[torch.zeros(3, dtype=FLOAT) for _ in range(size)]] if rank == root else []
    gopts = c10d_options.GatherOptions()
    gopts.rootRank = root
    pg.gather(gathered, [mine.clone()], gopts).wait()
    out["gather"] = [t.tolist() for t in gathered[0]] if gathered else []
    got = torch.zeros(3, dtype=FLOAT)
    sopts = c10d_options.ScatterOptions()
    sopts.rootRank = root
    pieces = [[torch.full((3,), float(10 * i), dtype=FLOAT) for i in range(size)]] if rank == root else []
    pg.scatter([got], pieces, sopts).wait()
    out["scatter"] = got.tolist()
    a, b = mine.clone(), torch.ones(2, dtype=FLOAT) * rank
    copts = c10d_options.AllreduceCoalescedOptions()
    copts.reduceOp = c10d_options.ReduceOp.SUM
    pg.allreduce_coalesced([a, b], copts).wait()
    out["allreduce_coalesced"] = [a.tolist(), b.tolist()]
    flat = torch.zeros(3 * size, dtype=FLOAT)
    pg._allgather_base(flat, mine.clone()).wait()
    out["allgather_base"] = flat.tolist()
    dist.destroy_process_group()
    return out


PROGRAMS = {"detectron2": detectron2, "torchmetrics": torchmetrics, "tutorial": tutorial, "c10d": c10d}


def run(dist: Any, program: str, rank: int, size: int) -> dict[str, Any]:
    """Run ``program`` (``tutorial-mpi``: the tutorial's MPI recipe) and return its results."""
    if program == "tutorial-mpi":
        return tutorial(dist, rank, size, backend="mpi")
    result: dict[str, Any] = PROGRAMS[program](dist, rank, size)
    return result
