"""A 1-D heat equation with ghost cells, written twice: halo exchange by mpicomm.sendrecv and by raw
mpi4py's Sendrecv (the code it replaces), non-periodic, MPI.PROC_NULL at the domain's two edges.

Both versions step the same global field built from one seed; every rank's block must be bitwise
equal between them and equal to the single-process solution.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm

pytestmark = pytest.mark.mpi


def _step(u: np.ndarray) -> None:
    u[1:-1] = u[1:-1] + 0.25 * (u[:-2] - 2.0 * u[1:-1] + u[2:])


def _run(exchange: str, field: np.ndarray, r: int, w: int, steps: int) -> np.ndarray:
    n = field.size // w
    u = np.zeros(n + 2)
    u[1:-1] = field[r * n : (r + 1) * n]
    left = r - 1 if r > 0 else MPI.PROC_NULL
    right = r + 1 if r < w - 1 else MPI.PROC_NULL
    comm = MPI.COMM_WORLD
    for _ in range(steps):
        if exchange == "mpicomm":
            mpicomm.sendrecv(u[1:2], u[-1:], dst=left, src=right, sendtag=1, recvtag=1)
            mpicomm.sendrecv(u[-2:-1], u[:1], dst=right, src=left, sendtag=2, recvtag=2)
        else:
            comm.Sendrecv(u[1:2], left, 1, u[-1:], right, 1)
            comm.Sendrecv(u[-2:-1], right, 2, u[:1], left, 2)
        _step(u)
    return u[1:-1].copy()


def _serial(field: np.ndarray, steps: int) -> np.ndarray:
    u = np.concatenate([[0.0], field, [0.0]])
    for _ in range(steps):
        _step(u)
    return u[1:-1]


def test_heat_halo_exchange_matches_raw_mpi4py_and_the_serial_solution() -> None:
    mpicomm.init()
    r, w = mpicomm.get_rank(), mpicomm.get_world_size()
    field = np.random.default_rng(33).random(16 * w)
    ours = _run("mpicomm", field, r, w, 20)
    theirs = _run("mpi4py", field, r, w, 20)
    np.testing.assert_array_equal(ours, theirs)
    n = 16
    np.testing.assert_array_equal(ours, _serial(field, 20)[r * n : (r + 1) * n])
