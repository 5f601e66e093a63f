"""Particle migration written twice: by mpicomm.jagged_all_to_all and by raw mpi4py (the code it replaces).

A periodic 1-D domain [0, 1) is cut into one slab per rank; particles are records (position, velocity,
id). Each step moves every particle, sorts the ones that left by destination rank, and migrates them:
mpi4py's way is ``Alltoall`` of the counts then ``Alltoallv`` of the records as bytes; mpicomm's is
one ``jagged_all_to_all`` with a row per destination rank. Both versions start from the same global
particles built from one seed; every rank's particles must be bitwise equal between them, and equal to
the particles of the single-process solution that end in its slab.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm

pytestmark = pytest.mark.mpi

PARTICLE = np.dtype([("x", "f8"), ("v", "f8"), ("id", "i8")])


def _particles(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = np.empty(n, PARTICLE)
    p["x"] = rng.random(n)
    p["v"] = rng.normal(0.0, 0.3, n)
    p["id"] = np.arange(n)
    return p


def _move(p: np.ndarray, dt: float) -> None:
    p["x"] = np.mod(p["x"] + p["v"] * dt, 1.0)


def _owner(p: np.ndarray, w: int) -> np.ndarray:
    return np.minimum((p["x"] * w).astype(np.int64), w - 1)


def _migrate_mpi4py(send: np.ndarray, counts: np.ndarray) -> np.ndarray:
    comm = MPI.COMM_WORLD
    rcounts = np.empty_like(counts)
    comm.Alltoall(counts, rcounts)
    size = PARTICLE.itemsize
    sdispl = np.concatenate(([0], np.cumsum(counts)[:-1])) * size
    rdispl = np.concatenate(([0], np.cumsum(rcounts)[:-1])) * size
    out = np.empty(int(rcounts.sum()), PARTICLE)
    comm.Alltoallv([send, (counts * size, sdispl), MPI.BYTE], [out, (rcounts * size, rdispl), MPI.BYTE])
    return out


def _run(how: str, everyone: np.ndarray, w: int, r: int, steps: int, dt: float) -> np.ndarray:
    mine = everyone[_owner(everyone, w) == r].copy()
    for _ in range(steps):
        _move(mine, dt)
        dest = _owner(mine, w)
        order = np.argsort(dest, kind="stable")
        send = mine[order]
        counts = np.bincount(dest, minlength=w).astype(np.int64)
        if how == "mpicomm":
            got = mpicomm.jagged_all_to_all(send, counts, [1] * w)
            mine = np.asarray(got.values)
            # one row from each rank: its count of particles that moved here
            assert np.array_equal(np.asarray(got.splits), np.ones(w, np.int64))
            assert int(np.asarray(got.lengths).sum()) == mine.size
        else:
            mine = _migrate_mpi4py(send, counts)
    return mine


@pytest.mark.parametrize("n, steps", [(64, 6), (4000, 12)])
def test_migration_by_mpicomm_equals_raw_mpi4py_and_the_serial_solution(n: int, steps: int) -> None:
    w, r = mpicomm.get_world_size(), mpicomm.get_rank()
    everyone = _particles(7 + n, n)
    dt = 0.37 / max(steps, 1)
    ours = _run("mpicomm", everyone, w, r, steps, dt)
    theirs = _run("mpi4py", everyone, w, r, steps, dt)
    assert ours.dtype == PARTICLE
    assert ours.tobytes() == theirs.tobytes()  # same records, same order, bit for bit

    serial = everyone.copy()
    for _ in range(steps):
        _move(serial, dt)
    expected = serial[_owner(serial, w) == r]
    assert np.array_equal(np.sort(ours["id"]), np.sort(expected["id"]))
    by_id = ours[np.argsort(ours["id"])]
    assert by_id.tobytes() == expected[np.argsort(expected["id"])].tobytes()
    total = np.array([ours.size], np.int64)
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, total)
    assert int(total[0]) == n  # no particle lost or duplicated
