"""Plan embedding tables onto ranks, then send each rank the sparse features of its tables: a torchrec
sharding script on numpy arrays.

With torchrec the imports are::

    import torch.distributed as dist
    from torchrec.distributed.dist_data import KJTAllToAll
    from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
    from torchrec.distributed.planner.types import Perf, Shard, ShardingOption, Storage, Topology
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

and the arrays are tensors (``torch.empty`` where this script has ``np.empty``); nothing else changes.
Run it with ``mpiexec -n 4 python -m mpi4py shard_tables.py``.
"""

from __future__ import annotations

import json

import numpy as np

import mpicomm as dist
from mpicomm import KeyedJaggedArray as KeyedJaggedTensor
from mpicomm import KJTAllToAll
from mpicomm.planner import GreedyPerfPartitioner, Perf, Shard, ShardingOption, Storage, Topology

#: table name -> (rows, embedding dim, pooling factor)
TABLES = {f"table_{i}": (1000 * (i + 1), 16 * (1 + i % 3), 1.0 + 0.5 * (i % 4)) for i in range(6)}
BATCH = 4


def sharding_options() -> list[ShardingOption]:
    """One table-wise option per table, its cost estimated from its size and pooling factor."""
    options = []
    for name, (rows, dim, pooling) in TABLES.items():
        shard = Shard(
            size=[rows, dim],
            offset=[0, 0],
            storage=Storage(hbm=rows * dim * 4, ddr=0),
            perf=Perf(fwd_compute=0.1 * pooling * dim, fwd_comms=0.02 * dim, bwd_compute=0.2 * pooling * dim),
        )
        options.append(
            ShardingOption(
                name=name,
                tensor=np.empty((rows, dim), dtype=np.float32),
                module=("sparse.ebc", None),
                input_lengths=[pooling],
                batch_size=BATCH,
                sharding_type="table_wise",
                partition_by="device",
                compute_kernel="fused",
                shards=[shard],
            )
        )
    return options


def local_features(rank: int) -> KeyedJaggedTensor:
    """This rank's batch: for every table's feature, BATCH bags of ids."""
    rng = np.random.default_rng(rank)
    keys = [f"f_{name}" for name in TABLES]
    lengths = rng.integers(0, 4, size=len(keys) * BATCH).astype(np.int32)
    values = rng.integers(0, 1000, size=int(lengths.sum())).astype(np.int64)
    return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)


def main() -> None:
    dist.init_process_group(backend="mpi")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD

    topology = Topology(world_size=world_size, compute_device="cuda", hbm_cap=1 << 30)
    plan = GreedyPerfPartitioner().partition(proposal=sharding_options(), storage_constraint=topology)
    table_rank = {option.name: option.shards[0].rank for option in plan}

    # features in destination-rank order, then one all-to-all: rank r gets its tables' features
    kjt = local_features(rank)
    order = sorted(range(len(plan)), key=lambda i: (plan[i].shards[0].rank, i))
    splits = [sum(1 for option in plan if option.shards[0].rank == r) for r in range(world_size)]
    kjt = kjt.permute(order)
    awaitable = KJTAllToAll(pg, splits, None)(kjt)
    features = awaitable.wait().wait()

    mine = {key: [bag.tolist() for bag in jt] for key, jt in features.to_dict().items()}
    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        print(json.dumps({"plan": table_rank, "features": everyone, "stride": features.stride()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
