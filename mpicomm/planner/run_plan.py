"""Run a planned job: ``python -m mpi4py -m mpicomm.planner.run_plan PLAN.json`` on every rank.

Each rank loads the plan, checks with :func:`~mpicomm.planner.check_environment` that the job has the
planned layout (rank count, nodes, local rank), prints its shards, and all ranks gather every rank's
storage and shard count with :func:`mpicomm.all_gather_into_tensor` and compare them with the plan, so
every rank raises the same error on a mismatch. Rank 0 ends with one line
``PLAN OK ranks=<n> shards=<n> ...``. The exit status is non-zero when any check fails.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import numpy as np

from .chart import format_bytes, shard_names
from .environment import check_environment, one_machine
from .io import load_plan

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Load the plan, check the job against it, print each rank's shards and one summary line."""
    import mpicomm  # here, not at import: importing this module must not need MPI

    parser = argparse.ArgumentParser(prog="python -m mpi4py -m mpicomm.planner.run_plan", description=__doc__)
    parser.add_argument("plan", help="a plan written by python -m mpicomm.plan --json")
    args = parser.parse_args(argv)
    plan, layout = load_plan(args.plan)
    rank, size = mpicomm.get_rank(), mpicomm.get_world_size()
    hosts: list[object] = [None] * size
    # Slurm's node name first: test clusters run several slurmd "nodes" on one host
    here = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    mpicomm.all_gather_object(hosts, here)  # every rank sees the same count, so raises the same error
    if layout.shape.nodes > 1 and len(set(hosts)) == 1 and size == layout.world_size:
        if rank == 0:  # every rank knows it: one short message, no traceback from each rank
            print(one_machine(layout, f"all {size} ranks run on {hosts[0]}"), file=sys.stderr, flush=True)
        return 1
    me = check_environment(layout, rank=rank, world_size=size)
    mine = plan.shards_on(rank)
    device = plan.devices[rank]
    names = shard_names(mine)
    gpu = "-" if me.gpu is None else me.gpu
    print(
        f"rank {rank} node {me.node_index} ({me.node_name}) local {me.local_rank} gpu {gpu}: "
        f"{len(mine)} shards {names} hbm {format_bytes(device.used.hbm)} ddr {format_bytes(device.used.ddr)} "
        f"perf {device.perf.total:g}",
        flush=True,
    )
    row = np.array([device.used.hbm, device.used.ddr, len(mine)], dtype=np.int64)
    table = np.empty((size, 3), dtype=np.int64)
    mpicomm.all_gather_into_tensor(table, row)
    want = np.array(
        [[d.used.hbm, d.used.ddr, len(plan.shards_on(d.rank))] for d in plan.devices], dtype=np.int64
    )
    if not np.array_equal(table, want):
        bad = sorted(set(np.nonzero((table != want).any(axis=1))[0].tolist()))
        raise RuntimeError(f"run_plan: ranks {bad} hold other shards than {args.plan} plans")
    mpicomm.barrier()
    if rank == 0:
        total = table.sum(axis=0)
        print(
            f"PLAN OK ranks={size} nodes={layout.shape.nodes} shards={int(total[2])} "
            f"hbm={int(total[0])} ddr={int(total[1])}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
