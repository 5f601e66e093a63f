"""Rank probe for the Slurm tests: on ``PYTHONPATH`` of every test job, loaded by every Python process.

When ``MPICOMM_RANK_PROBE_DIR`` is set and the process initialised MPI, it writes one file at exit,
``<job id>.<rank>``, holding ``rank size processor-name SLURMD_NODENAME``: what MPI really ran, so that a
job that silently started N singletons (no PMI) cannot pass for an N-rank job. Python's exit
handlers run before mpi4py finalises MPI, so the communicator is still usable here.
"""

from __future__ import annotations

import atexit
import os
import sys


def _record() -> None:
    mpi = sys.modules.get("mpi4py.MPI")
    where = os.environ.get("MPICOMM_RANK_PROBE_DIR", "")
    if mpi is None or not where or not mpi.Is_initialized() or mpi.Is_finalized():
        return
    rank, size = mpi.COMM_WORLD.Get_rank(), mpi.COMM_WORLD.Get_size()
    job = os.environ.get("SLURM_JOB_ID", "nojob")
    node = os.environ.get("SLURMD_NODENAME", "-")
    with open(os.path.join(where, f"{job}.{rank}"), "w") as out:
        out.write(f"{rank} {size} {mpi.Get_processor_name()} {node}\n")


if os.environ.get("MPICOMM_RANK_PROBE_DIR"):
    atexit.register(_record)
