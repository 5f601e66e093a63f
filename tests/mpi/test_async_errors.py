"""An asynchronous call's argument errors raise at the call, before it is queued (issue 41).

Every rank makes the same mistake, so no rank enters MPI for it; the queue stays usable afterwards
(an argument error raised at the call never reaches the engine). A failure on the engine itself
ends what the rank may do (tests/unit/test_engine_jobs.py, each in its own job). Runs at any world
size and at both thread levels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import mpicomm
from mpicomm.core import engine, watchdog


def _read_only(n: int) -> np.ndarray:
    x = np.zeros(n)
    x.flags.writeable = False
    return x


def _cases(w: int, r: int) -> list[tuple[str, Callable[[], Any], type[Exception], str]]:
    """(name, the call, the error, what its message says): each a mistake every rank makes alike."""
    return [
        (
            "all_reduce",
            lambda: mpicomm.all_reduce(_read_only(3), async_op=True),
            mpicomm.ArgumentError,
            r"^all_reduce: tensor is read-only",
        ),
        (
            "all_reduce op",
            lambda: mpicomm.all_reduce(np.zeros(3), op="sum", async_op=True),
            mpicomm.ArgumentTypeError,
            r"^all_reduce: op is 'sum'",
        ),
        (
            "broadcast",
            lambda: mpicomm.broadcast(np.zeros(2), src=w + 3, async_op=True),
            ValueError,
            rf"^broadcast: src is {w + 3}",
        ),
        (
            "reduce",
            lambda: mpicomm.reduce(np.zeros(2), dst=-4, async_op=True),
            ValueError,
            r"^reduce: dst is -4",
        ),
        (
            "all_gather",
            lambda: mpicomm.all_gather([np.zeros(2)] * (w + 1), np.zeros(2), async_op=True),
            mpicomm.ArgumentError,
            rf"^all_gather: tensor_list has {w + 1} entries; expected {w}",
        ),
        (
            "all_gather_into_tensor",
            lambda: mpicomm.all_gather_into_tensor(np.zeros(2 * w), np.zeros(2, np.float32), async_op=True),
            mpicomm.ArgumentTypeError,
            r"^all_gather_into_tensor: .*dtype",
        ),
        (
            "reduce_scatter_tensor",
            lambda: mpicomm.reduce_scatter_tensor(
                np.zeros(2), np.zeros(2 * w), op=mpicomm.ReduceOp.BAND, async_op=True
            ),
            mpicomm.ReductionTypeError,
            r"^reduce_scatter_tensor: ",
        ),
        (
            "all_to_all_single",
            lambda: mpicomm.all_to_all_single(
                np.zeros(w), np.zeros(w), output_split_sizes=[1] * (w + 1), async_op=True
            ),
            ValueError,
            rf"^all_to_all_single: output_split_sizes has {w + 1} entries",
        ),
        (
            "gather",
            lambda: (
                mpicomm.gather(np.zeros(2), gather_list=None, dst=0, async_op=True)
                if r == 0
                else mpicomm.gather(np.zeros(2), gather_list=[np.zeros(2)] * w, dst=0, async_op=True)
            ),
            mpicomm.ArgumentError,
            r"^gather: gather_list is ",
        ),
        (
            "scatter",
            lambda: (
                mpicomm.scatter(np.zeros(2), scatter_list=[np.zeros(2)] * (w + 1), src=0, async_op=True)
                if r == 0
                else mpicomm.scatter(_read_only(2), src=0, async_op=True)
            ),
            mpicomm.ArgumentError,
            r"^scatter: ",
        ),
        (
            "unknown keyword",
            lambda: mpicomm.all_reduce(np.zeros(1), async_op=True, bogus=1),
            TypeError,
            r"bogus",
        ),
    ]


@pytest.mark.mpi(min_size=1)
def test_an_async_calls_argument_error_raises_at_the_call(world):
    w, r = world.size(), world.rank()
    for name, call, error, message in _cases(w, r):
        with pytest.raises(error, match=message):
            call()
        assert watchdog._Threads.pending == 0, name  # nothing was queued
    x = np.full(2, float(r))  # the queue is still usable: nothing reached the engine
    assert mpicomm.all_reduce(x, async_op=True).wait()
    np.testing.assert_array_equal(x, np.full(2, float(sum(range(w)))))


@pytest.mark.mpi(min_size=2)
def test_a_queued_point_to_point_calls_argument_error_raises_at_the_call(world, rng):
    """isend and irecv posted behind a queued collective (queued too) check their peer and tag first."""
    w, r = world.size(), world.rank()
    xs = rng.integers(-9, 9, size=(w, 3)).astype(np.float64)
    x = xs[r].copy()
    work = mpicomm.all_reduce(x, async_op=True)
    with pytest.raises(ValueError, match=rf"^isend: dst is {w}"):
        mpicomm.isend(np.zeros(2), dst=w)
    with pytest.raises(mpicomm.ArgumentError, match=r"^irecv: src is this rank"):
        mpicomm.irecv(np.zeros(2), src=r)
    with pytest.raises(mpicomm.ArgumentTypeError, match=r"^isend: tag is 'x'"):
        mpicomm.isend(np.zeros(2), dst=(r + 1) % w, tag="x")
    with pytest.raises(mpicomm.ArgumentError, match=r"^irecv: tag is -1"):
        mpicomm.irecv(np.zeros(2), src=(r + 1) % w, tag=-1)
    with pytest.raises(mpicomm.ArgumentError, match=r"^recv: tensor is read-only"):
        mpicomm.recv(_read_only(2), src=(r - 1) % w)  # a blocking one behind the queue: at the call too
    assert work.wait()
    np.testing.assert_array_equal(x, xs.sum(0))
    got = np.zeros(3)
    posted = [mpicomm.irecv(got, src=(r - 1) % w), mpicomm.isend(np.full(3, float(r)), dst=(r + 1) % w)]
    assert mpicomm.wait_all(posted)
    np.testing.assert_array_equal(got, np.full(3, float((r - 1) % w)))


@pytest.mark.mpi(min_size=1)
@pytest.mark.usefixtures("validation_off")  # validation mode: nothing queued
def test_the_checks_run_on_the_callers_thread_before_the_call_is_queued(world, monkeypatch):
    import threading

    from mpicomm.front import prechecks

    seen: list[tuple[str, int, int]] = []
    real = prechecks.check

    def watched(fn: str, *rest: Any) -> None:
        seen.append((fn, threading.get_ident(), watchdog._Threads.pending))
        real(fn, *rest)

    monkeypatch.setattr(prechecks, "check", watched)
    x = np.ones(2)
    assert mpicomm.all_reduce(x, async_op=True).wait()
    assert seen == [("all_reduce", threading.get_ident(), 0)]  # here, and before it was queued
    assert x[0] == world.size()


@pytest.mark.mpi(min_size=1)
def test_a_blocking_call_behind_the_queue_raises_its_argument_error_at_the_call(world):
    x = np.ones(2)
    work = mpicomm.all_reduce(x, async_op=True)
    with pytest.raises(mpicomm.ArgumentError, match=r"^broadcast: tensor is read-only"):
        mpicomm.broadcast(_read_only(2), src=0)
    assert work.wait() and x[0] == world.size()
    assert engine._Q.failed is None
