"""What the 8-byte fast paths keep between calls, and the complete Work they answer async_op=True with.

The fast paths of all_reduce, broadcast and reduce read the world group's communicator and size from
``mpicomm.core.fast.WORLD`` (kept per world group) and answer ``async_op=True`` with a Work made
complete (``mpicomm.core.work.completed``) where the engine is off (``MPICOMM_ENGINE=0``), else
a Work the engine completes. Every rank builds the global input from the shared
seed and checks its own result against numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mpicomm
from mpicomm.core import fast
from mpicomm.core.groups import DefaultGroupError


def _check_small_calls(w: int, r: int, rng: np.random.Generator, async_op: bool) -> None:
    xs = rng.integers(-9, 9, size=(w, 2)).astype(np.float64)
    x = xs[r].copy()
    work = mpicomm.all_reduce(x, async_op=async_op)
    assert (work is not None) is async_op
    src = w - 1
    y = xs[r].copy()
    work_y = mpicomm.broadcast(y, src=src, async_op=async_op)
    z = xs[r].copy()
    work_z = mpicomm.reduce(z, dst=src, async_op=async_op)
    if async_op:  # the engine runs them in order; the results are there once each is waited for
        assert work.wait() and work_y.wait() and work_z.wait()
    np.testing.assert_array_equal(x, xs.sum(axis=0))
    np.testing.assert_array_equal(y, xs[src])
    np.testing.assert_array_equal(z, xs.sum(axis=0) if r == src else xs[r])


@pytest.mark.mpi(min_size=1)
def test_a_world_made_after_destroy_is_the_one_the_fast_paths_use(world, rng):
    w, r = world.size(), world.rank()
    _check_small_calls(w, r, rng, False)
    assert fast.WORLD[0] is world and fast.WORLD[2] == w
    mpicomm.destroy_process_group()
    try:
        # the kept parts are the destroyed world's (its communicator freed): never served
        for call in (
            lambda: mpicomm.all_reduce(np.ones(2)),
            lambda: mpicomm.broadcast(np.ones(2), src=0),
            lambda: mpicomm.reduce(np.ones(2), dst=0),
        ):
            with pytest.raises(DefaultGroupError, match="default process group was destroyed"):
                call()
    finally:
        new = mpicomm.init()
    assert new is not world
    for async_op in (False, True, False):
        _check_small_calls(w, r, rng, async_op)
    assert fast.WORLD[0] is new and fast.WORLD[1] is new.comm


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("call", ["all_reduce", "broadcast", "reduce"])
def test_the_first_small_call_of_a_new_world_keeps_its_parts_for_the_next(world, rng, call):
    """Each fast path's first call (its general path) keeps the world's parts, whichever call comes first."""
    w, r = world.size(), world.rank()
    mpicomm.destroy_process_group()
    new = mpicomm.init()
    assert fast.WORLD[0] is not new  # nothing has used the new world yet
    xs = rng.integers(-9, 9, size=(w, 2)).astype(np.float64)
    x = xs[r].copy()
    if call == "all_reduce":
        mpicomm.all_reduce(x)
        want = xs.sum(axis=0)
    elif call == "broadcast":
        mpicomm.broadcast(x, src=0)
        want = xs[0]
    else:
        mpicomm.reduce(x, dst=0)
        want = xs.sum(axis=0) if r == 0 else xs[r]
    np.testing.assert_array_equal(x, want)
    assert fast.WORLD[0] is new and fast.WORLD[1] is new.comm and fast.WORLD[2] == w


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_async_op_answers_with_a_work_that_acts_as_any_work(world, rng, kind):
    w, r = world.size(), world.rank()
    xs = rng.integers(-9, 9, size=(w, 3)).astype(np.float32)
    for call, want in (
        (lambda t: mpicomm.all_reduce(t, async_op=True), xs.sum(axis=0)),
        (lambda t: mpicomm.broadcast(t, src=0, async_op=True), xs[0]),
        (lambda t: mpicomm.reduce(t, dst=0, async_op=True), xs.sum(axis=0) if r == 0 else xs[r]),
    ):
        x = xs[r].copy() if kind == "numpy" else torch.from_numpy(xs[r].copy())
        work = call(x)
        assert isinstance(work, mpicomm.Work), type(work)
        assert work.wait() is True and work.wait(timeout=1.0) is True
        assert "completed" in repr(work), repr(work)
        assert work.is_completed() and work.is_success() and work.exception() is None
        (out,) = work.result()
        assert out is x  # the caller's own array (a torch tensor stays the tensor)
        (fut,) = work.get_future().wait()
        assert fut is x
        assert mpicomm.wait_all([work, None]) is True
        np.testing.assert_array_equal(np.asarray(x), want)
