"""A data-parallel training loop written the torch.distributed way, on numpy arrays.

With torch this script starts ``import torch.distributed as dist`` and its arrays are tensors; with
mpicomm only the import changes. Run it with ``mpiexec -n 4 python -m mpi4py train_step.py``.

Each rank fits a linear model to its own batches: the weights start on rank 0 and are broadcast, the
gradients are averaged with an asynchronous all_reduce, the optimizer state is sharded ZeRO-style
with reduce_scatter_tensor and all_gather_into_tensor, neighbours swap their weights with
batch_isend_irecv, and rank 0 prints the result as JSON.
"""

from __future__ import annotations

import datetime
import json

import numpy as np

import mpicomm as dist

FEATURES, BATCH, STEPS, LR = 8, 16, 4, 0.05


def batch_for(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's batch at ``step``: inputs and targets of the model y = x . [1, 2, ..., FEATURES]."""
    rng = np.random.default_rng(1000 * step + rank)
    x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32)
    return x, x @ np.arange(1, FEATURES + 1, dtype=np.float32)


def initial_weights() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(FEATURES).astype(np.float32)


def main() -> None:
    dist.init_process_group(backend="mpi", timeout=datetime.timedelta(minutes=5))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = dist.get_node_local_rank(fallback_rank=0)

    config = [{"lr": LR, "steps": STEPS} if rank == 0 else None]
    dist.broadcast_object_list(config, src=0)
    lr, steps = config[0]["lr"], config[0]["steps"]

    weights = initial_weights() if rank == 0 else np.zeros(FEATURES, np.float32)
    dist.broadcast(weights, src=0)

    # ZeRO-1 style: each rank keeps the momentum of one shard of the (padded) parameters
    shard = -(-FEATURES // world_size)
    momentum = np.zeros(shard, np.float32)
    loss = np.zeros(1, np.float32)
    for step in range(steps):
        x, y = batch_for(rank, step)
        err = x @ weights - y
        grad = (2.0 / BATCH) * (x.T @ err).astype(np.float32)
        work = dist.all_reduce(grad, op=dist.ReduceOp.SUM, async_op=True)
        loss[0] = np.mean(err**2)  # overlaps the gradient exchange
        work.wait()
        grad /= world_size

        padded = np.zeros(shard * world_size, np.float32)
        padded[:FEATURES] = grad
        my_grad = np.empty(shard, np.float32)
        dist.reduce_scatter_tensor(my_grad, padded, op=dist.ReduceOp.AVG)
        momentum = 0.9 * momentum + my_grad
        update = np.empty(shard * world_size, np.float32)
        dist.all_gather_into_tensor(update, momentum)
        weights -= lr * update[:FEATURES]
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)

    # fp16 compression of a last gradient, as torch's fp16_compress_hook does
    half = grad.astype(np.float16)
    dist.all_reduce(half)

    losses = [np.zeros(1, np.float32) for _ in range(world_size)]
    dist.all_gather(losses, loss)

    # pipeline-style: pass the weights to the next rank, receive the previous rank's
    received = weights.copy()
    if world_size > 1:
        ops = [
            dist.P2POp(dist.isend, weights, (rank + 1) % world_size),
            dist.P2POp(dist.irecv, received, (rank - 1) % world_size),
        ]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    evens = dist.new_group(ranks=list(range(0, world_size, 2)))
    count = np.ones(1, np.int64)
    dist.all_reduce(count, group=evens)  # a no-op (with a warning) on the odd ranks

    dist.barrier()
    if rank == 0:
        report = {
            "world_size": world_size,
            "local_rank": local_rank,
            "weights": weights.tolist(),
            "loss": float(loss[0]),
            "losses": [float(v[0]) for v in losses],
            "half_grad": half.astype(np.float32).tolist(),
            "received_equal": bool(np.array_equal(received, weights)),
            "evens": int(count[0]),
            "backend": dist.get_backend(),
        }
        print(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
