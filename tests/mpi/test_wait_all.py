"""mpicomm.wait_all: MPI's Waitall over a list of Work handles (None entries allowed).

Every rank posts the receives and sends of a halo step (both neighbours on a ring) plus a collective,
waits for all at once, and checks what arrived against the numpy reference built from a shared seed.
"""

from __future__ import annotations

import datetime

import numpy as np
import pytest

import mpicomm


@pytest.mark.mpi(min_size=1)
def test_wait_all_completes_a_halo_step_and_a_collective(world, rng):
    w, r = world.size(), world.rank()
    data = rng.integers(-9, 9, (w, 2, 5)).astype(np.float64)
    left, right = (r - 1) % w, (r + 1) % w
    from_left, from_right = np.zeros(5), np.zeros(5)
    total = data[r, 0].copy()
    works = [mpicomm.all_reduce(total, async_op=True), None]
    if w > 1:
        works += [
            mpicomm.irecv(from_left, src=left, tag=31),
            mpicomm.irecv(from_right, src=right, tag=32),
            mpicomm.isend(data[r, 0], dst=right, tag=31),
            mpicomm.isend(data[r, 1], dst=left, tag=32),
            None,
        ]
    assert mpicomm.wait_all(works) is True
    assert all(wk is None or wk.is_completed() for wk in works)
    np.testing.assert_array_equal(total, data[:, 0].sum(axis=0))
    if w > 1:
        np.testing.assert_array_equal(from_left, data[left, 0])
        np.testing.assert_array_equal(from_right, data[right, 1])
        assert works[2].source_rank() == left and works[3].source_rank() == right  # statuses filled
        assert works[2].result()[0] is from_left
    assert mpicomm.wait_all(works) is True  # completed handles: nothing left to wait for
    assert mpicomm.wait_all([]) is True and mpicomm.wait_all((None,)) is True


@pytest.mark.mpi(min_size=2)
def test_wait_all_with_a_timeout_and_strided_receives(world, rng):
    w, r = world.size(), world.rank()
    data = rng.integers(-9, 9, (w, 4)).astype(np.float32)
    u = np.full((4, 3), -1.0, np.float32)
    works = [
        mpicomm.irecv(u[:, 0], src=(r - 1) % w, tag=33),
        mpicomm.isend(data[r], dst=(r + 1) % w, tag=33),
    ]
    assert mpicomm.wait_all(works, timeout=datetime.timedelta(seconds=60))
    np.testing.assert_array_equal(u[:, 0], data[(r - 1) % w])
    assert (u[:, 1:] == -1.0).all()


@pytest.mark.mpi(min_size=2)
def test_wait_all_times_out_on_a_receive_nobody_sends(world):
    r = world.rank()
    got = np.zeros(1)
    work = mpicomm.irecv(got, src=(r + 1) % world.size(), tag=34)
    with pytest.raises(mpicomm.CommunicationError, match=r"^wait_all: 1 of 1 operations did not complete"):
        mpicomm.wait_all([work], timeout=0.05)
    mpicomm.barrier()  # every rank timed out; now complete the receive, so no message is left over
    mpicomm.send(np.array([float(r)]), dst=(r - 1) % world.size(), tag=34)
    assert mpicomm.wait_all([work])
    assert got[0] == float((r + 1) % world.size())


@pytest.mark.mpi(min_size=1)
def test_wait_all_refuses_what_is_not_a_work_before_waiting(world):
    work = mpicomm.all_reduce(np.ones(1), async_op=True)
    with pytest.raises(mpicomm.ArgumentTypeError, match=r"^wait_all: works\[1\] is a builtins.int; expected"):
        mpicomm.wait_all([work, 3])
    with pytest.raises(mpicomm.ArgumentTypeError, match=r"^wait_all: works is a Work; expected a list"):
        mpicomm.wait_all(work)  # type: ignore[arg-type]
    assert mpicomm.wait_all([work])
