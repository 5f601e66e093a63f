"""Runs on every task of a test job: check the job against the layout it was planned for.

Usage (inside a job): ``python -m mpi4py layout_job.py NODES TASKS_PER_NODE DISTRIBUTION SOURCE``, where
SOURCE is ``mpi`` (rank and size from MPI) or ``env`` (from the launcher's and Slurm's variables).
Each rank writes ``layout-<job id>.<rank>.json`` (its placement and its Slurm variables) under
``MPICOMM_RANK_PROBE_DIR``; rank 0 prints ``LAYOUT OK <ranks> ranks on <nodes>`` last.
A mismatch raises LayoutMismatchError on every rank, and ``python -m mpi4py`` aborts the job.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from mpi4py import MPI

from mpicomm.planner import JobShape, RankLayout, check_environment

VARIABLES = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURMD_NODENAME", "PMI_RANK", "PMI_SIZE")


def main(nodes: str, per_node: str, distribution: str, source: str) -> None:
    shape = JobShape(nodes=int(nodes), ntasks_per_node=int(per_node), distribution=distribution)
    layout = RankLayout.from_shape(shape, node_names=os.environ["SLURM_JOB_NODELIST"])
    comm = MPI.COMM_WORLD
    if source == "mpi":
        placement = check_environment(layout, rank=comm.Get_rank(), world_size=comm.Get_size())
    else:
        placement = check_environment(layout)
    record = {
        "mpi_rank": comm.Get_rank(),
        "mpi_size": comm.Get_size(),
        "host": MPI.Get_processor_name(),
        "placement": dataclasses.asdict(placement),
        "env": {name: os.environ.get(name) for name in VARIABLES},
    }
    where = Path(os.environ["MPICOMM_RANK_PROBE_DIR"])
    (where / f"layout-{os.environ['SLURM_JOB_ID']}.{comm.Get_rank()}.json").write_text(json.dumps(record))
    comm.Barrier()
    if comm.Get_rank() == 0:
        print(f"LAYOUT OK {layout.world_size} ranks on {','.join(layout.node_names)}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
