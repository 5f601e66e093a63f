"""The in-MPI lane (issue 41, item 2): point-to-point calls the peer needs first, after an async collective.

Rank 0 posts an ``all_reduce`` with ``async_op=True``, then makes a point-to-point call that its
peer needs before it joins that all_reduce (gloo's idiom). At the serialized thread level the call
is served by MPICH's in-MPI lane (``sendrecv``, ``isend``/``irecv``, strided buffers packed); at
multiple it runs on the caller's thread beside the queue. ``python -m mpi4py`` starts MPI at
multiple: tests/unit/test_lane_jobs.py runs this file at serialized (2 and 3 ranks), as does
``MPI4PY_RC_THREAD_LEVEL=serialized``. Every test runs at any world size (1, 2, 3, 4, 8): every
rank's data built from a shared seed and checked against numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm.core import lane, lane_work

MULTIPLE = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
pytestmark = pytest.mark.usefixtures("validation_off")


def _needs_the_lane() -> None:
    """Skip unless a point-to-point call can run while a collective is queued: multiple, or the lane."""
    mpicomm.all_reduce(np.zeros(1), async_op=True).wait()  # starts the engine (and the lane)
    if not MULTIPLE and lane.started() is None:
        pytest.skip(f"point-to-point beside a queued collective: multiple, or the lane ({lane._Lane.why})")


def _setup(world, rng, n=4):
    w, r = world.size(), world.rank()
    xs = rng.integers(-9, 9, size=(w, n)).astype(np.float64)
    data = rng.integers(-99, 99, size=(w, 3, 5)).astype(np.float64)
    return w, r, xs, data, (r + 1) % w, (r - 1) % w


def _lane_work(work) -> None:
    """At serialized, with a collective queued, isend/irecv's Work is the lane's."""
    if not MULTIPLE and mpicomm.get_world_size() > 1:
        assert isinstance(work, lane_work.LaneWork)


@pytest.mark.mpi(min_size=1)
def test_sendrecv_the_peer_needs_first_after_an_async_collective(world, rng):
    """Rank 0's sendrecv (after its async all_reduce) feeds rank 1, which joins the all_reduce after."""
    _needs_the_lane()
    _w, r, xs, data, nxt, prv = _setup(world, rng)
    x = xs[r].copy()
    got = np.zeros(5)
    if r == 0:
        work = mpicomm.all_reduce(x, async_op=True)
        src = mpicomm.sendrecv(data[r, 0].copy(), got, dst=nxt, src=prv, sendtag=3, recvtag=3)
        work.wait()
    else:
        src = mpicomm.sendrecv(data[r, 0].copy(), got, dst=nxt, src=prv, sendtag=3, recvtag=3)
        mpicomm.all_reduce(x)
    assert src == prv
    np.testing.assert_array_equal(got, data[prv, 0])
    np.testing.assert_array_equal(x, xs.sum(0))


@pytest.mark.mpi(min_size=1)
def test_sendrecv_with_no_peer_after_an_async_collective(world, rng):
    """A non-periodic line: the ends send or receive nothing (MPI_PROC_NULL) through the lane."""
    _needs_the_lane()
    w, r, xs, data, _, _ = _setup(world, rng)
    x = xs[r].copy()
    got = np.full(5, -1.0)
    left, right = (r - 1 if r > 0 else None), (r + 1 if r < w - 1 else None)
    work = mpicomm.all_reduce(x, async_op=r == 0)
    src = mpicomm.sendrecv(data[r, 1].copy(), got, dst=right, src=left)
    if work is not None:
        work.wait()
    assert src == (-1 if left is None else left)
    np.testing.assert_array_equal(got, np.full(5, -1.0) if left is None else data[left, 1])
    np.testing.assert_array_equal(x, xs.sum(0))


@pytest.mark.mpi(min_size=1)
def test_isend_irecv_the_peer_needs_first_after_an_async_collective(world, rng):
    """Rank 0's irecv/isend complete (wait, is_completed) while its all_reduce's peers wait for them."""
    _needs_the_lane()
    w, r, xs, data, nxt, prv = _setup(world, rng)
    x = xs[r].copy()
    got = np.zeros((3, 5))
    if w == 1:  # no peer: a message to itself is refused
        got[:] = data[0]
        mpicomm.all_reduce(x, async_op=True).wait()
    elif r == 0:
        work = mpicomm.all_reduce(x, async_op=True)
        rq = mpicomm.irecv(got, src=prv, tag=7)
        sq = mpicomm.isend(data[r].copy(), dst=nxt, tag=7)
        _lane_work(rq)
        _lane_work(sq)
        assert sq.wait() and rq.wait(timeout=60)
        assert rq.is_completed() and sq.is_completed()
        assert rq.exception() is None and sq.result() == []
        assert rq.source_rank() == prv
        assert rq.result()[0] is got
        work.wait()
    else:
        rq = mpicomm.irecv(got, src=prv, tag=7)
        rq.wait()
        mpicomm.isend(data[r].copy(), dst=nxt, tag=7).wait()
        mpicomm.all_reduce(x)
    np.testing.assert_array_equal(got, data[prv])
    np.testing.assert_array_equal(x, xs.sum(0))


@pytest.mark.mpi(min_size=2)
def test_irecv_wait_with_timeout_raises_then_completes(world, rng):
    """An irecv whose sender has not sent yet: wait(timeout) raises, the message later completes it."""
    _needs_the_lane()
    _w, r, xs, data, _, _ = _setup(world, rng)
    x = xs[r].copy()
    got = np.zeros(5)
    go = np.zeros(1)
    if r == 0:
        work = mpicomm.all_reduce(x, async_op=True)
        rq = mpicomm.irecv(got, src=1, tag=5)
        _lane_work(rq)
        assert not rq.is_completed()
        with pytest.raises(mpicomm.CommunicationError, match="did not complete within"):
            rq.wait(timeout=0.2)
        mpicomm.send(np.ones(1), dst=1, tag=4)  # now rank 1 may send
        rq.wait()
        assert rq.source_rank() == 1
        work.wait()
    else:
        if r == 1:
            mpicomm.recv(go, src=0, tag=4)
            mpicomm.send(data[1, 2].copy(), dst=0, tag=5)
        mpicomm.all_reduce(x)
    if r == 0:
        np.testing.assert_array_equal(got, data[1, 2])
    np.testing.assert_array_equal(x, xs.sum(0))


@pytest.mark.mpi(min_size=1)
def test_strided_buffers_after_an_async_collective(world, rng):
    """Ghost columns (strided views) sent and received through the lane: packed, copied back in place."""
    _needs_the_lane()
    w, r, xs, data, nxt, prv = _setup(world, rng)
    x = xs[r].copy()
    u = np.zeros((3, 5, 4))  # u[:, :, k]: strided (3, 5) views
    u[:, :, 0] = data[r]
    untouched = u[:, :, 3].copy()
    if w == 1:  # no peer: a message to itself is refused
        u[:, :, 1:3] = u[:, :, :1]
        mpicomm.all_reduce(x, async_op=True).wait()
    elif r == 0:
        work = mpicomm.all_reduce(x, async_op=True)
        mpicomm.send(u[:, :, 0], dst=nxt)
        mpicomm.recv(u[:, :, 1], src=prv)
        rq = mpicomm.irecv(u[:, 1:, 2], src=prv, tag=2)
        mpicomm.isend(u[:, 1:, 0], dst=nxt, tag=2).wait()
        rq.wait()
        work.wait()
    else:
        mpicomm.recv(u[:, :, 1], src=prv)
        mpicomm.send(u[:, :, 0], dst=nxt)
        rq = mpicomm.irecv(u[:, 1:, 2], src=prv, tag=2)
        rq.wait()
        mpicomm.isend(u[:, 1:, 0], dst=nxt, tag=2).wait()
        mpicomm.all_reduce(x)
    np.testing.assert_array_equal(u[:, :, 1], data[prv])
    np.testing.assert_array_equal(u[:, 1:, 2], data[prv][:, 1:])
    if w > 1:
        np.testing.assert_array_equal(u[:, 0, 2], np.zeros(3))  # outside the view: not written
    np.testing.assert_array_equal(u[:, :, 3], untouched)
    np.testing.assert_array_equal(x, xs.sum(0))


@pytest.mark.mpi(min_size=1)
def test_strided_sendrecv_after_an_async_collective(world, rng):
    """sendrecv of a strided edge into a strided ghost column, while an all_reduce is queued."""
    _needs_the_lane()
    _w, r, xs, data, nxt, prv = _setup(world, rng)
    x = xs[r].copy()
    u = np.zeros((5, 6))
    u[:, 1:-1] = data[r, 0][:, None]
    work = mpicomm.all_reduce(x, async_op=r == 0)
    src = mpicomm.sendrecv(u[:, -2], u[:, 0], dst=nxt, src=prv)
    if work is not None:
        work.wait()
    assert src == prv
    np.testing.assert_array_equal(u[:, 0], data[prv, 0])
    np.testing.assert_array_equal(u[:, -1], np.zeros(5))
    np.testing.assert_array_equal(x, xs.sum(0))


@pytest.mark.mpi(min_size=2)
def test_messages_keep_their_order_through_the_lane_and_after(world, rng):
    """Same peer, same tag: isends through the lane, then a blocking send once the queue is empty."""
    _needs_the_lane()
    w, r, xs, data, _, _ = _setup(world, rng)
    x = xs[r].copy()
    got = np.zeros((4, 5))
    if r == 0:
        work = mpicomm.all_reduce(x, async_op=True)
        sent = [mpicomm.isend(data[k % w, k % 3].copy(), dst=1) for k in range(3)]
        work.wait()
        mpicomm.send(data[3 % w, 0].copy(), dst=1)
        assert mpicomm.wait_all(sent)
    elif r == 1:
        mpicomm.all_reduce(x)
        for k in range(4):
            mpicomm.recv(got[k], src=0)
    else:
        mpicomm.all_reduce(x)
    if r == 1:
        want = np.stack([data[k % w, k % 3] for k in range(3)] + [data[3 % w, 0]])
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(x, xs.sum(0))
    assert not lane_work._Ring.held  # every slot taken again


@pytest.mark.mpi(min_size=1)
def test_nothing_changes_when_nothing_is_queued(world, rng):
    """With no async call queued, p2p calls run on the caller's thread as before: plain Works."""
    w, r, _, data, nxt, prv = _setup(world, rng)
    mpicomm.barrier()
    held = dict(lane_work._Ring.held)
    got, ghost = np.zeros((3, 5)), np.zeros((5, 4))
    if w > 1:  # (a message to itself is refused)
        rq = mpicomm.irecv(got, src=prv)
        sq = mpicomm.isend(data[r].copy(), dst=nxt)
        assert not isinstance(rq, lane_work.LaneWork) and not isinstance(sq, lane_work.LaneWork)
        mpicomm.wait_all([rq, sq])
    else:
        got[:] = data[0]
    assert mpicomm.sendrecv(data[r, 0], ghost[:, 0], dst=nxt, src=prv) == prv
    np.testing.assert_array_equal(got, data[prv])
    np.testing.assert_array_equal(ghost[:, 0], data[prv, 0])
    assert lane_work._Ring.held == held


@pytest.mark.mpi(min_size=2)
def test_more_isends_than_the_ring_holds_keep_their_order(world, rng):
    """70 large isends while a collective is queued: the ring's 64 slots, the rest queued behind it.

    Rank 1 receives the first 64 before it joins the all_reduce (the lane serves them), the other
    6 after; every message arrives in the order sent, whichever way each went.
    """
    _needs_the_lane()
    _, r, xs, _, _, _ = _setup(world, rng)
    x = xs[r].copy()
    values = rng.integers(-999, 999, size=(70, 20_000)).astype(np.float64)  # past the eager limit
    got = np.zeros_like(values)
    if r == 0:
        work = mpicomm.all_reduce(x, async_op=True)
        sent = [mpicomm.isend(values[k], dst=1, tag=9) for k in range(70)]
        assert mpicomm.wait_all([work, *sent])
    elif r == 1:
        assert mpicomm.wait_all([mpicomm.irecv(got[k], src=0, tag=9) for k in range(64)])
        mpicomm.all_reduce(x)
        assert mpicomm.wait_all([mpicomm.irecv(got[k], src=0, tag=9) for k in range(64, 70)])
        np.testing.assert_array_equal(got, values)
    else:
        mpicomm.all_reduce(x)
    np.testing.assert_array_equal(x, xs.sum(0))
    assert not lane_work._Ring.held


@pytest.mark.mpi(min_size=2)
def test_any_source_and_group_ranks_through_the_lane(world, rng):
    """recv from any rank, and a sendrecv ring by group ranks on a group without rank 1 (from 3 ranks)."""
    _needs_the_lane()
    w, r, xs, data, _, _ = _setup(world, rng)
    members = [0, *range(2, w)] if w >= 3 else [0, 1]
    sub = mpicomm.new_group(members)
    x = xs[r].copy()
    got, ring = np.zeros(5), np.zeros(5)
    m = len(members)
    k = members.index(r) if r in members else -1
    ring_args = {"group": sub, "group_dst": (k + 1) % m, "group_src": (k - 1) % m}
    if r == 0:
        work = mpicomm.all_reduce(x, async_op=True)
        came = mpicomm.recv(got)  # from any rank: rank 1 sends it before its all_reduce
        src = mpicomm.sendrecv(data[r, 2].copy(), ring, **ring_args)
        work.wait()
        assert came == 1
        np.testing.assert_array_equal(got, data[1, 0])
    else:
        if r == 1:
            mpicomm.send(data[1, 0].copy(), dst=0)
        src = mpicomm.sendrecv(data[r, 2].copy(), ring, **ring_args) if k >= 0 else -1
        mpicomm.all_reduce(x)
    if k >= 0:
        sender = members[(k - 1) % m]  # the world rank of group rank k - 1
        assert src == sender
        np.testing.assert_array_equal(ring, data[sender, 2])
    np.testing.assert_array_equal(x, xs.sum(0))
    mpicomm.destroy_process_group(sub)


@pytest.mark.mpi(min_size=2)
def test_an_mpi_error_in_the_lane_fails_the_work(world, rng):
    """A message longer than the irecv's buffer: its Work raises MPI's error, named; the rank goes on."""
    _needs_the_lane()
    _, r, xs, data, _, _ = _setup(world, rng)
    x = xs[r].copy()
    short = np.zeros(3)
    if r == 0:
        work = mpicomm.all_reduce(x, async_op=True)
        rq = mpicomm.irecv(short, src=1, tag=6)
        with pytest.raises(mpicomm.CommunicationError, match="irecv: MPI reported an error"):
            rq.wait()
        assert isinstance(rq.exception(), mpicomm.CommunicationError)
        work.wait()
    else:
        if r == 1:
            mpicomm.send(data[1, 0].copy(), dst=0, tag=6)  # 5 elements
        mpicomm.all_reduce(x)
    np.testing.assert_array_equal(x, xs.sum(0))
