"""The communication engine (issue 41): ``async_op=True`` returns at once and the call overlaps.

Every test runs at any world size (1, 2, 3, 4, 8) and at MPI's serialized and multiple thread
levels (``MPICOMM_THREAD_LEVEL``); the ones that need a point-to-point call beside a queued
collective need ``multiple`` or, at serialized, MPICH's in-MPI lane (docs/sharp-bits.rst).
Results are checked against numpy on every rank.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm.core import engine, lane, watchdog

MULTIPLE = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
# validation mode runs an asynchronous call at the call, without the engine (docs/sharp-bits.rst)
pytestmark = pytest.mark.usefixtures("validation_off")


def _needs_p2p_beside_the_queue() -> None:
    """Skip unless a send/recv can run while a collective is queued: multiple, or MPICH's lane."""
    mpicomm.all_reduce(np.zeros(1), async_op=True).wait()  # starts the engine (and the lane)
    if not MULTIPLE and lane.started() is None:
        pytest.skip(f"point-to-point beside a queued collective: multiple, or the lane ({lane._Lane.why})")


def _inputs(rng: np.random.Generator, w: int, n: int) -> np.ndarray:
    return rng.integers(-9, 9, size=(w, n)).astype(np.float64)


@pytest.mark.mpi(min_size=1)
def test_async_call_is_in_flight_until_the_peers_arrive(world, rng):
    """Rank 0's Work is not complete after the post; the others join only once rank 0 has seen that."""
    _needs_p2p_beside_the_queue()
    w, r = world.size(), world.rank()
    xs = _inputs(rng, w, 5)
    x = xs[r].copy()
    flag = np.zeros(1)
    if r == 0:
        work = mpicomm.all_reduce(x, async_op=True)
        in_flight = w == 1 or not work.is_completed()
        for peer in range(1, w):
            mpicomm.send(np.array([float(in_flight)]), peer)  # sent while the all_reduce is queued
        work.wait()
        assert in_flight
    else:
        mpicomm.recv(flag, 0)
        assert flag[0] == 1.0
        mpicomm.all_reduce(x)
    np.testing.assert_array_equal(x, xs.sum(0))


@pytest.mark.mpi(min_size=1)
def test_point_to_point_the_peer_needs_first_after_an_async_collective(world, rng):
    """The gloo idiom: post an all_reduce, then send what the peer receives before its all_reduce."""
    _needs_p2p_beside_the_queue()
    w, r = world.size(), world.rank()
    xs = _inputs(rng, w, 4)
    x = xs[r].copy()
    y = np.zeros(3)
    nxt, prv = (r + 1) % w, (r - 1) % w
    if w == 1:
        mpicomm.all_reduce(x, async_op=True).wait()
    elif r == 0:
        work = mpicomm.all_reduce(x, async_op=True)
        mpicomm.send(np.full(3, 7.0), nxt)
        mpicomm.recv(y, prv)
        work.wait()
    else:
        mpicomm.recv(y, prv)
        mpicomm.send(np.full(3, 7.0), nxt)
        mpicomm.all_reduce(x)
    np.testing.assert_array_equal(x, xs.sum(0))
    if w > 1:
        np.testing.assert_array_equal(y, np.full(3, 7.0))


@pytest.mark.mpi(min_size=2)
def test_async_call_returns_before_a_late_peer(world, rng):
    """The other ranks sleep before joining: rank 0's Work is still pending right after its post."""
    w, r = world.size(), world.rank()
    xs = _inputs(rng, w, 5)
    x = xs[r].copy()
    mpicomm.barrier()
    if r == 0:
        work = mpicomm.all_reduce(x, async_op=True)
        assert not work.is_completed()  # the others sleep 2 s before they call
        assert work.exception() is None
        work.wait()
        assert work.is_completed()
        assert work.result()[0] is x
    else:
        time.sleep(2.0)
        mpicomm.all_reduce(x)
    np.testing.assert_array_equal(x, xs.sum(0))


@pytest.mark.mpi(min_size=1)
def test_blocking_calls_run_after_the_pending_async_ones_in_program_order(world, rng):
    """A blocking broadcast after queued all_reduces sees their results; ranks differ in async_op."""
    w, r = world.size(), world.rank()
    xs = _inputs(rng, w, 6)
    sub = mpicomm.new_group(list(range(w)))
    a, b = xs[r].copy(), xs[r].copy() * 2
    works = [mpicomm.all_reduce(a, async_op=r % 2 == 0), mpicomm.all_reduce(b, group=sub, async_op=True)]
    mpicomm.broadcast(a, src=w - 1)  # blocking: after the all_reduce of a, on every rank
    c = np.zeros(2)
    mpicomm.all_gather_into_tensor(np.zeros(2 * w), c, async_op=True).wait()
    for work in works:
        if work is not None:
            work.wait()
    np.testing.assert_array_equal(a, xs.sum(0))
    np.testing.assert_array_equal(b, 2 * xs.sum(0))
    mpicomm.destroy_process_group(sub)


@pytest.mark.mpi(min_size=1)
def test_every_collective_through_the_engine(world, rng):
    """Each collective posted while others are queued gives numpy's answer (the queue runs them in order)."""
    w, r = world.size(), world.rank()
    xs = _inputs(rng, w, 2 * w)
    x = xs[r].copy()
    gathered = np.zeros(2 * w * w)
    rs = np.zeros(2)
    root = np.array(xs[w - 1]) if r == w - 1 else np.zeros(2 * w)
    a2a = np.zeros(2 * w)
    works = [
        mpicomm.all_reduce(x, async_op=True),
        mpicomm.all_gather_into_tensor(gathered, xs[r].copy(), async_op=True),
        mpicomm.reduce_scatter_tensor(rs, xs[r].copy(), async_op=True),
        mpicomm.broadcast(root, src=w - 1, async_op=True),
        mpicomm.all_to_all_single(a2a, xs[r].copy(), async_op=True),
    ]
    futures = [mpicomm.all_reduce_coalesced([np.ones(3), np.ones(2)], async_op=True)]
    assert mpicomm.wait_all(works)
    for fut in futures:
        assert [float(t[0]) for t in fut.wait()] == [float(w), float(w)]
    np.testing.assert_array_equal(x, xs.sum(0))
    np.testing.assert_array_equal(gathered, xs.reshape(-1))
    np.testing.assert_array_equal(rs, xs.sum(0)[2 * r : 2 * r + 2])
    np.testing.assert_array_equal(root, xs[w - 1])
    np.testing.assert_array_equal(a2a, xs.reshape(w, w, 2)[:, r, :].reshape(-1))
    assert watchdog._Threads.pending == 0


@pytest.mark.mpi(min_size=2)
def test_wait_timeout_raises_while_a_peer_is_away(world, rng):
    """wait(timeout) raises a DistError while the others are away; a later wait completes the call."""
    w, r = world.size(), world.rank()
    x = np.full(3, float(r))
    mpicomm.barrier()
    if r == 0:
        work = mpicomm.all_reduce(x, async_op=True)
        with pytest.raises(
            mpicomm.DistError, match=r"^all_reduce: Work.wait: .*did not complete within 0.2 s"
        ):
            work.wait(timeout=0.2)  # the others sleep 3 s first
        assert not work.is_completed()
        assert work.wait()
    else:
        time.sleep(3.0)
        mpicomm.all_reduce(x)
    np.testing.assert_array_equal(x, np.full(3, float(sum(range(w)))))


@pytest.mark.mpi(min_size=1)
def test_future_of_an_engine_work(world):
    x = np.ones(3)
    fut = mpicomm.all_reduce(x, async_op=True).get_future()
    doubled = fut.then(lambda f: [t * 2 for t in f.value()])
    assert float(doubled.wait()[0][0]) == 2.0 * world.size()
    assert fut.done()


@pytest.mark.mpi(min_size=1)
def test_torch_tensors_come_back_as_tensors(world):
    torch = pytest.importorskip("torch")
    t = torch.ones(4)
    work = mpicomm.all_reduce(t, async_op=True)
    out = work.result()
    assert out[0] is t and float(t[0]) == world.size()


@pytest.mark.mpi(min_size=2)
def test_isend_irecv_queued_behind_a_collective(world, rng):
    """isend/irecv posted while a collective is queued complete, with the right data."""
    w, r = world.size(), world.rank()
    x = np.ones(2)
    got = np.zeros(4)
    work = mpicomm.all_reduce(x, async_op=True)
    posted = [mpicomm.irecv(got, src=(r - 1) % w), mpicomm.isend(np.full(4, float(r)), dst=(r + 1) % w)]
    assert mpicomm.wait_all([work, *posted])
    np.testing.assert_array_equal(got, np.full(4, float((r - 1) % w)))
    assert x[0] == w


@pytest.mark.mpi(min_size=1)
def test_the_engine_thread_is_a_daemon_and_named(world):
    mpicomm.all_reduce(np.ones(1), async_op=True).wait()
    thread = engine._Q.thread
    assert thread is not None and thread.daemon and thread.name == "mpicomm-engine"


@pytest.mark.mpi(min_size=1)
def test_sendrecv_and_broadcast_behind_a_queued_collective(world, rng):
    """The inline gates (all_reduce, broadcast, sendrecv) queue behind a pending call, in order."""
    w, r = world.size(), world.rank()
    xs = _inputs(rng, w, 4)
    x = xs[r].copy()
    work = mpicomm.all_reduce(x, async_op=True)
    got = np.zeros(4)
    src = mpicomm.sendrecv(np.full(4, float(r)), got, dst=(r + 1) % w, src=(r - 1) % w)
    assert src == (r - 1) % w
    np.testing.assert_array_equal(got, np.full(4, float((r - 1) % w)))
    b = np.full(2, float(r))
    bw = mpicomm.broadcast(b, src=w - 1, async_op=True)
    mpicomm.broadcast(x, src=0)  # blocking, after the all_reduce: every rank gets the sum
    assert work.wait() and bw.wait()
    np.testing.assert_array_equal(x, xs.sum(0))
    np.testing.assert_array_equal(b, np.full(2, float(w - 1)))


@pytest.mark.mpi(min_size=2)
def test_point_to_point_beside_the_queue_any_source_no_peer_and_tensors(world, rng):
    """Beside a queued all_reduce, rank 0 sends a tensor rank 1 needs first, sends to no peer, and
    receives from any source what the last rank sends before joining."""
    torch = pytest.importorskip("torch")
    _needs_p2p_beside_the_queue()
    w, r = world.size(), world.rank()
    xs = _inputs(rng, w, 3)
    x = xs[r].copy()
    if r == 0:
        work = mpicomm.all_reduce(x, async_op=True)
        assert mpicomm.send(np.ones(2), dst=MPI.PROC_NULL) is None  # no peer: nothing moves
        mpicomm.send(torch.arange(4.0), dst=1, tag=5)  # rank 1 waits for it before its all_reduce
        got = torch.zeros(4)
        src = mpicomm.recv(got, src=None, tag=6)  # any source
        assert src == w - 1 and got.tolist() == [float(w - 1)] * 4
        assert work.wait()
    else:
        if r == 1:
            first = torch.zeros(4)
            assert mpicomm.recv(first, src=0, tag=5) == 0
            assert first.tolist() == [0.0, 1.0, 2.0, 3.0]
        if r == w - 1:
            mpicomm.send(torch.full((4,), float(r)), dst=0, tag=6)
        mpicomm.all_reduce(x)
    np.testing.assert_array_equal(x, xs.sum(0))


@pytest.mark.mpi(min_size=2)
def test_a_recv_beside_a_collective_that_ends_first(world, rng):
    """The collective ends while the recv waits (its message comes after): the recv completes on the
    program's thread, whether the engine had posted it or not. Repeated so both happen."""
    _needs_p2p_beside_the_queue()
    w, r = world.size(), world.rank()
    for rep in range(30):
        x = np.full(2, float(r + rep))
        if r == 0:
            work = mpicomm.all_reduce(x, async_op=True)
            got = np.zeros(3)
            assert mpicomm.recv(got, src=1, tag=rep) == 1  # rank 1 sends it after its all_reduce
            np.testing.assert_array_equal(got, np.full(3, float(rep)))
            assert work.wait()
        else:
            mpicomm.all_reduce(x)
            if r == 1:
                mpicomm.send(np.full(3, float(rep)), dst=0, tag=rep)
        np.testing.assert_array_equal(x, np.full(2, float(sum(range(w)) + w * rep)))
