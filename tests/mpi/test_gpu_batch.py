"""batch_isend_irecv on device arrays (issue 24, fix 12) and aliasing across a batch (issue 22, item 2).

Every operation of a batch is checked before the first is posted: two operations whose memory
overlaps where one of them receives raise on every rank before any MPI call, for numpy arrays, torch
tensors and device arrays (the fake cupy, tests/fakecupy).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fakecupy.testing import inputs, world

import mpicomm
from mpicomm import ArgumentError
from mpicomm.front import device as front

MIB4 = (4 << 20) // 8  # float64 elements in 4 MiB


def ring(make: Any, get: Any) -> None:
    r, n = world()
    x = inputs(n, 7)
    got = make(np.full(9, -1.0))
    ops = [
        mpicomm.P2POp(mpicomm.irecv, got, (r - 1) % n),
        mpicomm.P2POp(mpicomm.isend, make(np.concatenate([x[r], [5.0, 5.0]])), (r + 1) % n),
    ]
    if n == 1:
        with pytest.raises(ArgumentError, match="this rank"):
            mpicomm.batch_isend_irecv(ops)
        return
    for work in mpicomm.batch_isend_irecv(ops):
        assert work.wait()
    np.testing.assert_array_equal(get(got), np.concatenate([x[(r - 1) % n], [5.0, 5.0]]))


def test_batch_isend_irecv_takes_device_arrays(cp: Any) -> None:
    ring(cp.asarray, lambda d: d.get())
    if world()[1] > 1:
        assert front.PATHS["batch_isend_irecv", "staged"] == 1


def test_a_short_message_in_a_device_batch_keeps_the_rest(cp: Any) -> None:
    r, n = world()
    if n == 1:
        pytest.skip("point-to-point needs two ranks")
    got = cp.full(6, -1.0)
    ops = [
        mpicomm.P2POp(mpicomm.irecv, got, (r - 1) % n),
        mpicomm.P2POp(mpicomm.isend, cp.asarray(np.full(2, float(r))), (r + 1) % n),
    ]
    for work in mpicomm.batch_isend_irecv(ops):
        work.wait()
    np.testing.assert_array_equal(got.get(), [(r - 1) % n] * 2 + [-1.0] * 4)


@pytest.mark.parametrize("kind", ["numpy", "torch", "device"])
def test_one_4_mib_array_sent_and_received_in_a_batch_is_refused_before_mpi(cp: Any, kind: str) -> None:
    r, n = world()
    if n == 1:
        pytest.skip("a peer other than this rank needs two ranks")
    host = np.zeros(MIB4)
    if kind == "numpy":
        a, b = host, host[MIB4 // 2 :]
    elif kind == "torch":
        torch = pytest.importorskip("torch")
        t = torch.zeros(MIB4, dtype=torch.float64)
        a, b = t, t[MIB4 // 2 :]
    else:
        d = cp.zeros(MIB4)
        a, b = d, d[MIB4 // 2 :]
    peer = (r + 1) % n
    for second in (a, b):  # the very same array, and a view that overlaps it
        ops = [mpicomm.P2POp(mpicomm.isend, a, peer), mpicomm.P2POp(mpicomm.irecv, second, peer)]
        with pytest.raises(
            ArgumentError, match=r"batch_isend_irecv: p2p_op_list\[1\].tensor overlaps p2p_op_list\[0\]"
        ):
            mpicomm.batch_isend_irecv(ops)
    mpicomm.barrier()  # nothing was posted: the next call on every rank matches


def test_sends_may_share_memory_and_adjacent_halves_are_apart() -> None:
    r, n = world()
    if n == 1:
        pytest.skip("point-to-point needs two ranks")
    buf = np.zeros(16)
    buf[8:] = np.arange(8.0) + 10 * r
    ops = [
        mpicomm.P2POp(mpicomm.isend, buf[8:], (r + 1) % n),
        mpicomm.P2POp(mpicomm.isend, buf[8:][::2], (r + 1) % n, tag=1),  # shares memory with the first send
        mpicomm.P2POp(mpicomm.irecv, buf[:8], (r - 1) % n),  # ends where the sends' memory starts
    ]
    extra = np.zeros(4)
    ops.append(mpicomm.P2POp(mpicomm.irecv, extra, (r - 1) % n, tag=1))
    for work in mpicomm.batch_isend_irecv(ops):
        work.wait()
    src = np.arange(8.0) + 10 * ((r - 1) % n)
    np.testing.assert_array_equal(buf[:8], src)
    np.testing.assert_array_equal(extra, src[::2])
