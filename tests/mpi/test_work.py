"""async_op=True: every collective returns a Work whose wait, result, is_completed and exception behave.

Each case builds the global input from the shared seed, starts the call with ``async_op=True`` and
returns the Work, the arrays ``result()`` must hand back, and a check of the values once it is done.
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import mpicomm
from mpicomm import ReduceOp


@dataclass
class Started:
    """A started async call: its Work, the outputs result() must return, and the value check."""

    work: mpicomm.Work
    outputs: list[np.ndarray]
    check: Callable[[], None]
    buffers: list[np.ndarray] = field(default_factory=list)  # arrays MPI reads or writes in place


def _all_reduce(w: int, r: int, rng: np.random.Generator) -> Started:
    data = rng.integers(-9, 10, (w, 2, 3)).astype(np.int64)
    x = data[r].copy()
    work = mpicomm.all_reduce(x, op=ReduceOp.AVG, async_op=True)
    want = np.trunc(data.sum(axis=0) / w)
    return Started(work, [x], lambda: np.testing.assert_array_equal(x, want), [x])


def _reduce(w: int, r: int, rng: np.random.Generator) -> Started:
    data = rng.standard_normal((w, 4))
    x = data[r].copy()
    work = mpicomm.reduce(x, dst=w - 1, op=ReduceOp.PREMUL_SUM(2.0), async_op=True)
    want = (2.0 * data).sum(axis=0) if r == w - 1 else data[r]
    return Started(work, [x], lambda: np.testing.assert_allclose(x, want), [x])


def _broadcast(w: int, r: int, rng: np.random.Generator) -> Started:
    data = rng.standard_normal(5)
    x = data.copy() if r == w - 1 else np.zeros(5)
    work = mpicomm.broadcast(x, src=w - 1, async_op=True)
    return Started(work, [x], lambda: np.testing.assert_array_equal(x, data), [x])


def _all_gather(w: int, r: int, rng: np.random.Generator) -> Started:
    parts = [rng.standard_normal(i % 3 + 1) for i in range(w)]
    outs = [np.empty_like(p) for p in parts]
    inp = parts[r].copy()
    work = mpicomm.all_gather(outs, inp, async_op=True)

    def check() -> None:
        for got, want in zip(outs, parts, strict=True):
            np.testing.assert_array_equal(got, want)

    return Started(work, outs, check, [inp, *outs])


def _all_gather_into_tensor(w: int, r: int, rng: np.random.Generator) -> Started:
    data = rng.standard_normal((w, 3))
    out, inp = np.empty((w, 3)), data[r].copy()
    work = mpicomm.all_gather_into_tensor(out, inp, async_op=True)
    return Started(work, [out], lambda: np.testing.assert_array_equal(out, data), [out, inp])


def _gather(w: int, r: int, rng: np.random.Generator) -> Started:
    parts = [rng.standard_normal(i % 2 + 1) for i in range(w)]
    outs = [np.empty_like(p) for p in parts] if r == 0 else None
    inp = parts[r].copy()
    work = mpicomm.gather(inp, outs, dst=0, async_op=True)

    def check() -> None:
        if outs is not None:
            for got, want in zip(outs, parts, strict=True):
                np.testing.assert_array_equal(got, want)

    return Started(work, outs or [], check, [inp, *(outs or [])])


def _scatter(w: int, r: int, rng: np.random.Generator) -> Started:
    parts = [rng.standard_normal(i % 2 + 1) for i in range(w)]
    ins = [p.copy() for p in parts] if r == 0 else []
    out = np.empty_like(parts[r])
    work = mpicomm.scatter(out, ins or None, src=0, async_op=True)
    return Started(work, [out], lambda: np.testing.assert_array_equal(out, parts[r]), [out, *ins])


def _reduce_scatter(w: int, r: int, rng: np.random.Generator) -> Started:
    sizes = [i % 3 for i in range(w)]
    data = rng.integers(0, 9, (w, sum(sizes))).astype(np.float64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    buf = data[r].copy()
    ins = [buf[starts[i] : starts[i + 1]] for i in range(w)]  # adjacent views of one buffer
    out = np.empty(sizes[r])
    work = mpicomm.reduce_scatter(out, ins, op=ReduceOp.AVG, async_op=True)
    want = data[:, starts[r] : starts[r + 1]].sum(axis=0) / w
    return Started(work, [out], lambda: np.testing.assert_array_equal(out, want), [out, buf])


def _reduce_scatter_tensor(w: int, r: int, rng: np.random.Generator) -> Started:
    data = rng.integers(0, 9, (w, w, 2)).astype(np.int32)
    out, inp = np.empty(2, np.int32), data[r].copy()
    work = mpicomm.reduce_scatter_tensor(out, inp, op=ReduceOp.MAX, async_op=True)
    want = data[:, r].max(axis=0)
    return Started(work, [out], lambda: np.testing.assert_array_equal(out, want), [out, inp])


def _all_to_all(w: int, r: int, rng: np.random.Generator) -> Started:
    sizes = rng.integers(0, 3, (w, w))
    pieces = [[rng.standard_normal(int(sizes[i][j])) for j in range(w)] for i in range(w)]
    ins = [p.copy() for p in pieces[r]]
    outs = [np.empty(int(sizes[j][r])) for j in range(w)]
    work = mpicomm.all_to_all(outs, ins, async_op=True)

    def check() -> None:
        for j in range(w):
            np.testing.assert_array_equal(outs[j], pieces[j][r])

    return Started(work, outs, check, [*ins, *outs])


def _all_to_all_single(w: int, r: int, rng: np.random.Generator) -> Started:
    sizes = rng.integers(0, 3, (w, w))
    inputs = [rng.standard_normal((int(sizes[i].sum()), 2)) for i in range(w)]
    starts = [np.concatenate([[0], np.cumsum(sizes[i])]).astype(int) for i in range(w)]
    want = np.concatenate([inputs[j][starts[j][r] : starts[j][r + 1]] for j in range(w)])
    out, inp = np.empty((int(sizes[:, r].sum()), 2)), inputs[r].copy()
    work = mpicomm.all_to_all_single(out, inp, sizes[:, r], sizes[r], async_op=True)
    return Started(work, [out], lambda: np.testing.assert_array_equal(out, want), [out, inp])


def _barrier(w: int, r: int, rng: np.random.Generator) -> Started:
    return Started(mpicomm.barrier(async_op=True), [], lambda: None)


CASES: dict[str, Callable[[int, int, np.random.Generator], Started]] = {
    "all_reduce": _all_reduce,
    "reduce": _reduce,
    "broadcast": _broadcast,
    "all_gather": _all_gather,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "gather": _gather,
    "scatter": _scatter,
    "reduce_scatter": _reduce_scatter,
    "reduce_scatter_tensor": _reduce_scatter_tensor,
    "all_to_all": _all_to_all,
    "all_to_all_single": _all_to_all_single,
    "barrier": _barrier,
}


def _same_arrays(got: list[Any], want: list[np.ndarray]) -> bool:
    return len(got) == len(want) and all(a is b for a, b in zip(got, want, strict=True))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", list(CASES))
def test_async_collective_wait_returns_true_and_result_gives_outputs(world, rng, name):
    started = CASES[name](world.size(), world.rank(), rng)
    assert isinstance(started.work, mpicomm.Work)
    assert started.work.wait() is True
    started.check()
    assert started.work.wait(timeout=5.0) is True  # waiting again is harmless
    assert _same_arrays(started.work.result(), started.outputs)
    assert started.work.is_completed() and started.work.is_success()
    assert started.work.exception() is None


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", list(CASES))
def test_async_collective_is_completed_eventually_turns_true(world, rng, name):
    started = CASES[name](world.size(), world.rank(), rng)
    deadline = time.monotonic() + 60  # a guard against a hang, not a speed check
    while not started.work.is_completed():  # the communication thread finishes it meanwhile
        assert time.monotonic() < deadline, f"{name}: is_completed() still False after 60 s"
        time.sleep(1e-4)  # lets the communication thread have the GIL (and, loaded, the core)
    assert started.work.exception() is None
    started.check()  # is_completed() alone finishes the call (AVG's division included)
    assert _same_arrays(started.work.result(), started.outputs)


@pytest.mark.mpi(min_size=1)
def test_many_outstanding_collectives_complete_in_any_wait_order(world, rng):
    w, r = world.size(), world.rank()
    started = [CASES[name](w, r, rng) for name in CASES]
    for s in reversed(started):
        assert s.work.wait()
    for s in started:
        s.check()


@pytest.mark.mpi(min_size=1)
def test_two_async_all_gathers_in_flight_keep_their_messages_apart(world, rng):
    w, r = world.size(), world.rank()
    first, second = rng.standard_normal((w, 3)), rng.standard_normal((w, 2))
    outs1, outs2 = [np.empty(3) for _ in range(w)], [np.empty(2) for _ in range(w)]
    w1 = mpicomm.all_gather(outs1, first[r], async_op=True)
    w2 = mpicomm.all_gather(outs2, second[r], async_op=True)
    w2.wait()
    w1.wait()
    np.testing.assert_array_equal(np.stack(outs1), first)
    np.testing.assert_array_equal(np.stack(outs2), second)


@pytest.mark.mpi(min_size=1)
def test_two_async_reduce_scatters_in_flight_keep_their_messages_apart(world, rng):
    w, r = world.size(), world.rank()
    first = rng.integers(0, 9, (w, w, 3)).astype(np.float64)  # first[k][i]: rank k's piece for i
    second = rng.integers(0, 9, (w, w, 1)).astype(np.float64)
    out1, out2 = np.empty(3), np.empty(1)
    w1 = mpicomm.reduce_scatter(out1, list(first[r]), async_op=True)
    w2 = mpicomm.reduce_scatter(out2, list(second[r]), op=ReduceOp.MAX, async_op=True)
    w2.wait()
    w1.wait()
    np.testing.assert_array_equal(out1, first[:, r].sum(axis=0))
    np.testing.assert_array_equal(out2, second[:, r].max(axis=0))


@pytest.mark.mpi(min_size=2)
def test_async_point_to_point_work_reports_source_and_result(world, rng):
    w, r = world.size(), world.rank()
    data = rng.standard_normal((w, 3))
    if r == 0:
        bufs = [np.empty(3) for _ in range(1, w)]
        works = [mpicomm.irecv(b, tag=31) for b in bufs]
        for wk, b in zip(works, bufs, strict=True):
            while not wk.is_completed():
                pass
            assert wk.exception() is None
            assert wk.result()[0] is b
            np.testing.assert_array_equal(b, data[wk.source_rank()])
        assert sorted(wk.source_rank() for wk in works) == list(range(1, w))
    else:
        work = mpicomm.isend(data[r], dst=0, tag=31)
        assert work.wait() is True
        assert work.result() == [] and work.exception() is None and work.is_completed()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", [n for n in CASES if n != "barrier"])
def test_async_work_keeps_its_buffers_alive_until_it_completes(world, rng, name):
    # Work's contract: the caller may drop its references once the call is started
    started = CASES[name](world.size(), world.rank(), rng)
    refs = [weakref.ref(b.base if b.base is not None else b) for b in started.buffers]
    work = started.work
    del started  # drops every reference of the test's own, the value check's closure included
    gc.collect()
    alive = [ref() is not None for ref in refs]
    pending = not work._done  # a collective's Work comes back complete (issue 34): MPI holds nothing
    assert work.wait() is True
    assert all(alive) or not pending, f"{name}: buffers freed before the call completed: {alive}"
