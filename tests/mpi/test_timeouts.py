"""Bounded waits in one job: Work.wait(timeout=), barrier(timeout=) with validation, errors naming the call.

The scenarios that end the job (a rank that never arrives, a watchdog abort) run in their own
``mpiexec`` from tests/unit/test_timeouts.py; here every rank arrives in the end, late.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import mpicomm


@pytest.mark.mpi(min_size=2)
def test_work_wait_timeout_raises_naming_irecv_and_a_later_wait_completes(world, rng):
    w, r = world.size(), world.rank()
    data = rng.standard_normal(5)  # the same on every rank: the shared seed
    if r == 0:
        got = np.zeros(5)
        work = mpicomm.irecv(got, src=1, tag=41)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"irecv: Work\.wait: .*within 0\.2 s.*Timed out") as info:
            work.wait(timeout=0.2)
        assert isinstance(info.value, mpicomm.CommunicationError)
        assert isinstance(info.value, mpicomm.DistBackendError)  # what a torch program catches
        assert 0.2 <= time.monotonic() - start < 5
        assert not work.is_completed()
    mpicomm.barrier()  # rank 1 sends only after rank 0 has timed out
    if r == 1:
        mpicomm.send(data, dst=0, tag=41)
    if r == 0:
        assert work.wait() is True
        np.testing.assert_array_equal(got, data)
    assert w >= 2


@pytest.mark.mpi(min_size=2)
@pytest.mark.usefixtures("validation_off")  # validation mode: no queued call to time
def test_work_wait_timeout_as_timedelta_on_a_collective_names_it(world):
    import datetime

    r, w = world.rank(), world.size()
    n = 20000  # 160 KB entries: the list all_gather's pairwise messages, pending until matched (a
    # one-MPI-call collective returns a Work already complete since issue 34: no timeout to test)
    x = np.full(n, float(r))
    outs = [np.zeros(n) for _ in range(w)]
    # made on every rank first: new_group is itself a collective on the world
    side = mpicomm.new_group()
    if r == 0:
        work = mpicomm.all_gather(outs, x, async_op=True)
        with pytest.raises(mpicomm.CommunicationError, match=r"^all_gather: Work\.wait: .*Timed out"):
            work.wait(timeout=datetime.timedelta(milliseconds=100))
    mpicomm.barrier(group=side)  # another communicator: rank 0's all_gather is pending
    if r != 0:
        work = mpicomm.all_gather(outs, x, async_op=True)
    assert work.wait(timeout=30) is True
    np.testing.assert_array_equal(np.stack(outs), np.repeat(np.arange(w, dtype=float)[:, None], n, axis=1))


@pytest.mark.mpi(min_size=2)
def test_work_error_names_the_call_and_mpis_text(world):
    r = world.rank()
    if r == 0:
        small = np.zeros(2)
        work = mpicomm.irecv(small, src=1, tag=42)
        with pytest.raises(mpicomm.CommunicationError, match=r"^irecv: MPI reported an error: .*runcat"):
            work.wait()
        assert isinstance(work.exception(), RuntimeError)
    elif r == 1:
        mpicomm.send(np.ones(8), dst=0, tag=42)
    mpicomm.barrier()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("validate", [False, True])
def test_barrier_timeout_raises_on_the_waiting_ranks_validation_exchange_included(world, validate):
    """The last rank never enters: the others raise after 0.3 s, in the validation exchange or the barrier.

    Before, with validation on, the blocking validation exchange waited for it forever.
    """
    w, r = world.size(), world.rank()
    g = mpicomm.new_group()  # the timed-out barrier stays posted: never reuse its group
    mpicomm.set_validation(validate)
    try:
        if r != w - 1:
            start = time.monotonic()
            with pytest.raises(
                RuntimeError, match=r"barrier: not every rank of group .* within 0\.3 s.*Timed out"
            ):
                mpicomm.barrier(group=g, timeout=0.3)
            assert 0.3 <= time.monotonic() - start < 5
    finally:
        mpicomm.set_validation(False)
    mpicomm.barrier()


@pytest.mark.mpi(min_size=2)
def test_a_plain_barrier_on_a_late_rank_completes_a_timed_one_on_the_others(world):
    """A timed barrier (non-blocking, polled) and a plain one match: both are MPI_Ibarrier."""
    w, r = world.size(), world.rank()
    g = mpicomm.new_group()
    if r == w - 1:
        time.sleep(0.5)
        mpicomm.barrier(group=g)
    else:
        mpicomm.barrier(group=g, timeout=30)
    mpicomm.barrier(group=g)  # the group is still usable: nothing timed out


@pytest.mark.mpi(min_size=2)
def test_monitored_barrier_without_a_timeout_takes_its_groups_and_names_the_missing_rank(world):
    w, r = world.size(), world.rank()
    g = mpicomm.new_group(timeout=0.4)
    if r != w - 1:
        start = time.monotonic()
        with pytest.raises(
            RuntimeError, match=rf"monitored_barrier: world ranks \[{w - 1}\] of group .*0\.4 s"
        ):
            mpicomm.monitored_barrier(group=g)
        assert time.monotonic() - start < 5
    mpicomm.barrier()
