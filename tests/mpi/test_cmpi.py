"""mpicomm.core.cmpi: the fast paths' MPI calls made from C, on real MPI at any rank count.

Each C function is called directly (so a silent fall back to mpi4py cannot pass for it) and its
result checked against a numpy reference built on every rank from a shared seed; the arguments it
must refuse return NotImplemented before any MPI call; an MPI error raises mpi4py's exception.
Run with MPICOMM_C=0 (``make test-noc``) the binding is off and every function answers
NotImplemented, which the last test checks.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm.core import cmpi

OFF = os.environ.get("MPICOMM_C", "1") == "0"
on = pytest.mark.skipif(OFF, reason="MPICOMM_C=0: the C calls are switched off in this run")


@pytest.fixture(scope="module")
def world() -> tuple[MPI.Intracomm, int, int]:
    g = mpicomm.init()
    return g.comm, g.rank(), g.size()


def data(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """The same integers on every rank (exact sums in any order)."""
    return np.random.default_rng(seed).integers(-50, 50, size=shape).astype(np.float64)


@on
def test_bound_when_built(world: object) -> None:
    assert cmpi.bound() is None, cmpi.bound()


@on
def test_allreduce_bcast_allgather_reduce_scatter(world: tuple[MPI.Intracomm, int, int]) -> None:
    comm, rank, size = world
    full = data(1, (size, 5))
    x = full[rank].copy()
    assert cmpi.allreduce(x, MPI.DOUBLE, MPI.SUM, comm) is None
    np.testing.assert_array_equal(x, full.sum(axis=0))

    root = size - 1
    b = full[rank].copy()
    assert cmpi.bcast(b, MPI.DOUBLE, root, comm) is None
    np.testing.assert_array_equal(b, full[root])

    out = np.empty(size * 5)
    assert cmpi.allgather(full[rank].copy(), out, MPI.DOUBLE, comm) is None
    np.testing.assert_array_equal(out, full.reshape(-1))

    blocks = data(2, (size, size, 3))  # rank r contributes blocks[r]
    mine = np.empty(3)
    assert cmpi.reduce_scatter_block(blocks[rank].reshape(-1).copy(), mine, MPI.DOUBLE, MPI.MAX, comm) is None
    np.testing.assert_array_equal(mine, blocks[:, rank].max(axis=0))


@on
def test_alltoall_and_alltoallv(world: tuple[MPI.Intracomm, int, int]) -> None:
    comm, rank, size = world
    full = data(3, (size, size, 2))  # full[src, dst] goes from src to dst
    out = np.empty((size, 2))
    assert cmpi.alltoall(full[rank].copy(), out, MPI.DOUBLE, comm) is None
    np.testing.assert_array_equal(out, full[:, rank])

    counts = (np.arange(size)[:, None] + 2 * np.arange(size)[None, :]) % 3 + 1  # counts[src, dst]
    pieces = {
        (s, d): data(100 + s * size + d, (int(counts[s, d]),)) for s in range(size) for d in range(size)
    }
    send = np.concatenate([pieces[rank, d] for d in range(size)])
    recv = np.empty(int(counts[:, rank].sum()))
    sc = counts[rank].astype(np.int32)
    rc = counts[:, rank].astype(np.int32)
    sd = np.concatenate([[0], np.cumsum(sc)[:-1]]).astype(np.int32)
    rd = np.concatenate([[0], np.cumsum(rc)[:-1]]).astype(np.int32)
    assert cmpi.alltoallv(send, sc, sd, recv, rc, rd, MPI.DOUBLE, comm) is None
    np.testing.assert_array_equal(recv, np.concatenate([pieces[s, rank] for s in range(size)]))


@on
def test_list_forms(world: tuple[MPI.Intracomm, int, int]) -> None:
    comm, rank, size = world
    full = data(4, (size, 3))
    outs = [np.empty(3) for _ in range(size)]
    assert cmpi.allgather_list(full[rank].copy(), outs, MPI.DOUBLE, comm, 1 << 16) is None
    np.testing.assert_array_equal(np.stack(outs), full)

    blocks = data(5, (size, size, 3))
    out = np.empty(3)
    ins = [blocks[rank, j].copy() for j in range(size)]
    assert cmpi.reduce_scatter_list(out, ins, MPI.DOUBLE, MPI.SUM, comm, 1 << 16) is None
    np.testing.assert_array_equal(out, blocks[:, rank].sum(axis=0))

    root = size // 2
    gathered = [np.empty(3) for _ in range(size)] if rank == root else None
    assert cmpi.gather_list(full[rank].copy(), gathered, root, MPI.DOUBLE, comm, 1 << 16) is None
    if gathered is not None:
        np.testing.assert_array_equal(np.stack(gathered), full)

    # all_to_all's exchange with uneven pieces: from src to dst, dst + 1 elements
    sends = [data(200 + rank * size + d, (d + 1,)) for d in range(size)]
    recvs = [np.empty(rank + 1) for _ in range(size)]
    assert cmpi.exchange(recvs, sends, None, 77, MPI.DOUBLE, comm) is None
    for s in range(size):
        np.testing.assert_array_equal(recvs[s], data(200 + s * size + rank, (rank + 1,)))

    # scatter's: the root sends, the others receive
    scattered = np.empty(2)
    if rank == root:
        assert (
            cmpi.exchange(None, [full[j, :2].copy() for j in range(size)], scattered, 78, MPI.DOUBLE, comm)
            is None
        )
    else:
        assert cmpi.recv(scattered, MPI.DOUBLE, root, 78, comm) is None
    np.testing.assert_array_equal(scattered, full[rank, :2])


@on
def test_send_recv_and_truncation(world: tuple[MPI.Intracomm, int, int]) -> None:
    comm, rank, size = world
    if size < 2:
        pytest.skip("needs a peer")
    payload = data(6, (4,))
    if rank == 0:
        assert cmpi.send(payload, MPI.DOUBLE, 1, 5, comm) is None
        assert cmpi.send(payload, MPI.DOUBLE, 1, 6, comm) is None
    elif rank == 1:
        got = np.empty(4)
        assert cmpi.recv(got, MPI.DOUBLE, 0, 5, comm) is None
        np.testing.assert_array_equal(got, payload)
        short = np.empty(2)
        with pytest.raises(MPI.Exception) as info:
            cmpi.recv(short, MPI.DOUBLE, 0, 6, comm)
        assert info.value.Get_error_class() == MPI.ERR_TRUNCATE
    comm.Barrier()


@on
def test_refusals_before_any_mpi_call(world: tuple[MPI.Intracomm, int, int]) -> None:
    """Arguments the C calls cannot serve: NotImplemented, and nothing sent (else the test would hang)."""
    comm, rank, size = world
    ro = np.zeros(4)
    ro.flags.writeable = False
    strided = np.zeros(8)[::2]
    dt, op = MPI.DOUBLE, MPI.SUM
    ni = NotImplemented
    assert cmpi.allreduce(ro, dt, op, comm) is ni
    assert cmpi.allreduce(strided, dt, op, comm) is ni
    assert cmpi.allreduce([0.0, 1.0], dt, op, comm) is ni
    assert cmpi.allreduce(np.zeros(2), "double", op, comm) is ni
    assert cmpi.bcast(np.zeros((3, 3)).T, dt, 0, comm) is ni
    whole = np.zeros(4 * size + 4)
    assert cmpi.allgather(whole[:4], whole[:-4].reshape(-1)[: 4 * size], dt, comm) is ni  # overlap
    assert cmpi.allgather(np.zeros(4), np.zeros(4 * size + 1), dt, comm) is ni  # wrong size
    assert cmpi.reduce_scatter_block(np.zeros(4 * size), np.zeros(5), dt, op, comm) is ni
    assert cmpi.alltoall(np.zeros(4 * size), np.zeros(4 * size + 1), dt, comm) is ni
    bad = np.full(size, 10, np.int32)  # counts past the buffers
    zeros = np.zeros(size, np.int32)
    assert cmpi.alltoallv(np.zeros(4), bad, zeros, np.zeros(4), bad, zeros, dt, comm) is ni
    assert cmpi.alltoallv(np.zeros(4), bad[:-1], zeros, np.zeros(4), bad, zeros, dt, comm) is ni
    assert cmpi.send(np.zeros(2), "double", 0, 0, comm) is ni  # (a strided array is packed: served)
    assert cmpi.recv(ro, dt, 0, 0, comm) is ni
    one = np.zeros(2)
    assert cmpi.allgather_list(one, [one] * size, dt, comm, 1 << 16) is ni  # outputs share memory
    assert cmpi.allgather_list(one, [np.zeros(2, np.float32)] * size, dt, comm, 1 << 16) is ni  # dtype
    assert cmpi.allgather_list(one, tuple(np.zeros(2) for _ in range(size)), dt, comm, 1 << 16) is ni
    assert cmpi.allgather_list(np.zeros(1024), [np.zeros(1024) for _ in range(size)], dt, comm, 64) is ni
    assert cmpi.reduce_scatter_list(one, [one] + [np.zeros(2)] * (size - 1), dt, op, comm, 1 << 16) is ni
    assert cmpi.gather_list(one, [np.zeros(3) for _ in range(size)], rank, dt, comm, 1 << 16) is ni
    assert cmpi.gather_list(one, None, size, dt, comm, 1 << 16) is ni  # root out of range
    empty_items = [np.zeros(3, dtype=[]) for _ in range(size)]  # itemsize 0: no element count
    assert cmpi.exchange([np.zeros(3, dtype=[]) for _ in range(size)], empty_items, None, 1, dt, comm) is ni
    shared = np.zeros(2)
    assert cmpi.exchange([shared] * size, [shared] * size, None, 1, dt, comm) is ni
    assert cmpi.exchange(None, [np.zeros(2)] * size, one.copy()[:1], 1, dt, comm) is ni  # own size


@on
def test_public_calls_raise_communication_error_from_c(world: tuple[MPI.Intracomm, int, int]) -> None:
    """An MPI error inside a C call becomes mpicomm's CommunicationError naming the call."""
    _, rank, size = world
    if size < 2:
        pytest.skip("needs a peer")
    if rank == 0:
        mpicomm.send(np.arange(6.0), dst=1, tag=9)
    elif rank == 1:
        with pytest.raises(mpicomm.CommunicationError, match="recv"):
            mpicomm.recv(np.empty(3), src=0, tag=9)
    mpicomm.barrier()


def test_switched_off_answers_not_implemented(world: object) -> None:
    if not OFF:
        assert cmpi.bound() is None
        return
    assert "MPICOMM_C=0" in str(cmpi.bound())
    assert cmpi.allreduce(np.zeros(2), MPI.DOUBLE, MPI.SUM, MPI.COMM_SELF) is NotImplemented
    assert cmpi.exchange(None, [np.zeros(1)], None, 1, MPI.DOUBLE, MPI.COMM_SELF) is NotImplemented
