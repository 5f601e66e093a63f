"""A k-means written with mpicomm equals its mpi4py twin bitwise (issue 44, item 5).

MPICH picks some collectives' algorithms by how many collectives a communicator has seen, so a
collective mpicomm makes for its own bookkeeping on the communicator the data moves on (the
question "does any rank pipeline this large message?", ``mpicomm.core.chunks.split``) shifts the
algorithm of the program's later reductions, and a sum's last bit with it. The bookkeeping travels
on the group's private communicator instead: the data communicator sees exactly the program's own
calls. Both programs run on fresh communicators (the twin on a ``Dup`` of the world, mpicomm on a
new group of every rank); every rank builds the points from the shared seed. The sums are large
(5 MiB: past one chunk, so every call asks the question) and small (the counts).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm.core import cmpi

K, D, N, ITERS = 32, 20480, 24, 6  # sums of K x D float64: 5 MiB, past the 4 MiB chunk


def _points(r: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(20261128)
    pts = rng.standard_normal((w * N, D)) * rng.uniform(0.001, 1000.0, (w * N, 1))
    return pts[r * N : (r + 1) * N], pts[:K].copy()


def _step(pts: np.ndarray, centers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    near = ((centers**2).sum(1)[None, :] - 2.0 * pts @ centers.T).argmin(1)
    sums = np.zeros((K, D))
    np.add.at(sums, near, pts)
    return sums, np.bincount(near, minlength=K).astype(np.float64)


def _twin(comm: Any) -> np.ndarray:
    pts, centers = _points(comm.Get_rank(), comm.Get_size())
    comm.Bcast(centers, root=0)
    for _ in range(ITERS):
        sums, counts = _step(pts, centers)
        comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
        comm.Allreduce(MPI.IN_PLACE, counts, op=MPI.SUM)
        centers = sums / np.maximum(counts, 1.0)[:, None]
    return centers


def _ours(g: mpicomm.ProcessGroup) -> np.ndarray:
    pts, centers = _points(g.rank(), g.size())
    mpicomm.broadcast(centers, group_src=0, group=g)
    for _ in range(ITERS):
        sums, counts = _step(pts, centers)
        mpicomm.all_reduce(sums, group=g)
        mpicomm.all_reduce(counts, group=g)
        centers = sums / np.maximum(counts, 1.0)[:, None]
    return centers


@pytest.mark.mpi(min_size=1)
def test_a_kmeans_equals_its_mpi4py_twin_and_mpicomm_asks_nothing_on_its_data_communicator(
    world: mpicomm.ProcessGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    twin_comm = MPI.COMM_WORLD.Dup()
    want = _twin(twin_comm)
    twin_comm.Free()
    g = mpicomm.new_group(list(range(world.size())))
    seen: list[tuple[bool, str, int]] = []  # (on the data communicator, dtype, elements) of each C call
    real = cmpi.allreduce

    def recording(buf: np.ndarray, dt: Any, op: Any, comm: Any) -> Any:
        seen.append((comm is g.comm, str(buf.dtype), int(buf.size)))
        return real(buf, dt, op, comm)

    monkeypatch.setattr(cmpi, "allreduce", recording)
    got = _ours(g)
    monkeypatch.undo()
    # on the data communicator: the program's own sums (K x D) and counts (K), nothing else
    assert [s for s in seen if s[0]] == [(True, "float64", K * D), (True, "float64", K)] * ITERS, seen
    assert got.tobytes() == want.tobytes(), np.abs(got - want).max()
    mpicomm.destroy_process_group(g)
