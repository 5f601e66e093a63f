"""Strided views as send and receive buffers: p2p, sendrecv and every collective, checked against numpy.

Each output is a view into a larger array filled with a sentinel; after the call the view must hold the
numpy reference and every byte outside it must still hold the sentinel (MPI wrote through the view and
nowhere else). Inputs are strided views too. Every rank builds the global data from the shared seed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import mpicomm
from mpicomm.core import buffers, layouts

SENTINEL = -7.0

# name -> (shape of the base for a view of `shape`, the view of the base)
Cut = Callable[[np.ndarray], np.ndarray]
LAYOUTS: dict[str, tuple[Callable[[tuple[int, ...]], tuple[int, ...]], Cut]] = {
    "contiguous": (lambda s: s, lambda b: b),
    "every-other": (lambda s: (*s[:-1], 2 * s[-1]), lambda b: b[..., ::2]),
    "transposed": (lambda s: s[::-1], lambda b: b.T),
    "reversed": (lambda s: s, np.flip),
    "column": (lambda s: (*s, 3), lambda b: b[..., 1]),
    "interior": (lambda s: tuple(n + 2 for n in s), lambda b: b[(slice(1, -1),) * b.ndim]),
}
KINDS = list(LAYOUTS)


def strided(kind: str, shape: tuple[int, ...], dtype: Any = np.float64) -> tuple[np.ndarray, np.ndarray]:
    """A sentinel-filled base and the ``kind`` view of it with ``shape``."""
    base_shape, cut = LAYOUTS[kind]
    base = np.full(base_shape(shape), SENTINEL, dtype)
    view = cut(base)
    assert view.shape == shape
    return base, view


def laid_out(kind: str, values: np.ndarray) -> np.ndarray:
    """``values`` copied into a ``kind`` view (an input with that layout)."""
    _, view = strided(kind, values.shape, values.dtype)
    view[...] = values
    return view


def check(kind: str, base: np.ndarray, view: np.ndarray, expected: np.ndarray) -> None:
    """The view holds ``expected`` and everything around it is untouched."""
    np.testing.assert_array_equal(view, expected)
    mask = np.ones(base.shape, bool)
    LAYOUTS[kind][1](mask)[...] = False
    assert (base[mask] == SENTINEL).all(), f"{kind}: bytes outside the view were written"


def data(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Small integers as floats: exact in every sum."""
    return rng.integers(-50, 50, size=shape).astype(np.float64)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("out_kind", KINDS)
@pytest.mark.parametrize("in_kind", ["contiguous", "transposed", "column"])
def test_send_recv_ring_reads_and_writes_strided_views(world, rng, in_kind, out_kind):
    w, r = world.size(), world.rank()
    msgs = data(rng, w, 3, 4)
    left, right = (r - 1) % w, (r + 1) % w
    base, got = strided(out_kind, (3, 4))
    work = mpicomm.irecv(got, src=left, tag=11)
    mpicomm.send(laid_out(in_kind, msgs[r]), dst=right, tag=11)
    assert work.wait() and work.source_rank() == left
    check(out_kind, base, got, msgs[left])
    base2, got2 = strided(out_kind, (3, 4))
    sent = mpicomm.isend(laid_out(in_kind, msgs[r]), dst=right, tag=12)
    assert mpicomm.recv(got2, src=left, tag=12) == left
    sent.wait()
    check(out_kind, base2, got2, msgs[left])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", KINDS)
def test_sendrecv_ring_shifts_strided_columns(world, rng, kind):
    w, r = world.size(), world.rank()
    msgs = data(rng, w, 5)
    base, got = strided(kind, (5,))
    src = mpicomm.sendrecv(laid_out(kind, msgs[r]), got, dst=(r + 1) % w, src=(r - 1) % w, tag=3)
    assert src == (r - 1) % w
    check(kind, base, got, msgs[(r - 1) % w])


@pytest.mark.mpi(min_size=1)
def test_sendrecv_none_peer_sends_or_receives_nothing(world, rng):
    w, r = world.size(), world.rank()
    msgs = data(rng, w, 4)
    u = np.full((4, 3), SENTINEL)
    # a non-periodic line of ranks: the last rank sends nothing, rank 0 receives nothing
    src = mpicomm.sendrecv(
        msgs[r].copy(), u[:, 0], dst=r + 1 if r + 1 < w else None, src=r - 1 if r > 0 else None, tag=4
    )
    if r == 0:
        assert src == -1 and (u == SENTINEL).all()
    else:
        assert src == r - 1
        np.testing.assert_array_equal(u[:, 0], msgs[r - 1])
        assert (u[:, 1:] == SENTINEL).all()


@pytest.mark.mpi(min_size=1)
def test_sendrecv_checks_arguments_before_mpi(world):
    u = np.zeros((3, 3))
    with pytest.raises(mpicomm.ArgumentError, match=r"^sendrecv: tensor overlaps recv_tensor"):
        mpicomm.sendrecv(u[0], u[0], dst=0, src=0)
    frozen = np.zeros(3)
    frozen.flags.writeable = False
    with pytest.raises(mpicomm.ArgumentError, match=r"^sendrecv: recv_tensor is read-only"):
        mpicomm.sendrecv(u[0], frozen, dst=0, src=0)
    with pytest.raises(mpicomm.ArgumentTypeError, match=r"^sendrecv: tensor is a builtins.list"):
        mpicomm.sendrecv([1.0], u[0], dst=0, src=0)
    with pytest.raises(mpicomm.ArgumentError, match=r"^sendrecv: dst"):
        mpicomm.sendrecv(u[0], u[1], dst=world.size(), src=0)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", ["SUM", "AVG", "MAX"])
@pytest.mark.parametrize("async_op", [False, True])
def test_all_reduce_writes_through_strided_views(world, rng, kind, op, async_op):
    w, r = world.size(), world.rank()
    xs = data(rng, w, 3, 4)
    base, view = strided(kind, (3, 4))
    view[...] = xs[r]
    work = mpicomm.all_reduce(view, op=getattr(mpicomm.ReduceOp, op), async_op=async_op)
    if async_op:
        work.wait()
    expected = {"SUM": xs.sum(0), "AVG": xs.sum(0) / w, "MAX": xs.max(0)}[op]
    check(kind, base, view, expected)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", KINDS)
def test_reduce_and_broadcast_write_through_strided_views(world, rng, kind):
    w, r = world.size(), world.rank()
    xs = data(rng, w, 3, 4)
    root = w - 1
    base, view = strided(kind, (3, 4))
    view[...] = xs[r]
    mpicomm.reduce(view, dst=root)
    check(kind, base, view, xs.sum(0) if r == root else xs[r])
    base, view = strided(kind, (3, 4))
    if r == root:
        view[...] = xs[0]
    mpicomm.broadcast(view, src=root)
    check(kind, base, view, xs[0])
    base, view = strided(kind, (3, 4))
    if r == 0:
        view[...] = xs[1 % w]
    mpicomm.broadcast(view, src=0, async_op=True).wait()
    check(kind, base, view, xs[1 % w])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", KINDS)
def test_gathers_and_scatter_write_through_strided_list_entries(world, rng, kind):
    w, r = world.size(), world.rank()
    xs = data(rng, w, 2, 3)
    outs = [strided(kind, (2, 3)) for _ in range(w)]
    mpicomm.all_gather([v for _, v in outs], laid_out(kind, xs[r]))
    for j, (b, v) in enumerate(outs):
        check(kind, b, v, xs[j])
    outs = [strided(kind, (2, 3)) for _ in range(w)] if r == 0 else None
    mpicomm.gather(laid_out(kind, xs[r]), [v for _, v in outs] if outs else None, dst=0)
    for j, (b, v) in enumerate(outs or []):
        check(kind, b, v, xs[j])
    base, view = strided(kind, (2, 3))
    mpicomm.scatter(view, [laid_out(kind, x) for x in xs] if r == 0 else None, src=0)
    check(kind, base, view, xs[r])


@pytest.mark.mpi(min_size=1)
def test_all_gather_into_columns_of_one_array(world, rng):
    """Interleaved entries share a byte range but no element: allowed, and written exactly."""
    w, r = world.size(), world.rank()
    xs = data(rng, w, 5)
    grid = np.full((5, w), SENTINEL)
    mpicomm.all_gather([grid[:, j] for j in range(w)], xs[r])
    np.testing.assert_array_equal(grid, xs.T)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("async_op", [False, True])
def test_all_gather_into_tensor_writes_through_strided_output(world, rng, kind, async_op):
    w, r = world.size(), world.rank()
    xs = data(rng, w, 4)
    base, view = strided(kind, (w, 4))
    work = mpicomm.all_gather_into_tensor(view, laid_out("every-other", xs[r]), async_op=async_op)
    if async_op:
        work.wait()
    check(kind, base, view, xs)
    if kind in ("every-other", "column", "interior"):
        base, view = strided(kind, (4 * w,))  # flat output: one row per element
        mpicomm.all_gather_into_tensor(view, xs[r])
        check(kind, base, view, xs.reshape(-1))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", KINDS)
def test_reduce_scatters_write_through_strided_output(world, rng, kind):
    w, r = world.size(), world.rank()
    xs = data(rng, w, w, 2, 3)  # xs[rank][dest]
    base, view = strided(kind, (2, 3))
    mpicomm.reduce_scatter(view, [laid_out(kind, x) for x in xs[r]])
    check(kind, base, view, xs[:, r].sum(0))
    base, view = strided(kind, (2, 3))
    mpicomm.reduce_scatter_tensor(view, laid_out("every-other", xs[r].reshape(w * 2, 3)))
    check(kind, base, view, xs[:, r].sum(0))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", KINDS)
def test_all_to_all_lists_of_strided_views(world, rng, kind):
    w, r = world.size(), world.rank()
    xs = data(rng, w, w, 2, 3)  # xs[src][dst]
    outs = [strided(kind, (2, 3)) for _ in range(w)]
    mpicomm.all_to_all([v for _, v in outs], [laid_out(kind, x) for x in xs[r]])
    for j, (b, v) in enumerate(outs):
        check(kind, b, v, xs[j, r])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("out_kind", KINDS)
@pytest.mark.parametrize("in_kind", ["contiguous", "every-other", "reversed", "transposed"])
@pytest.mark.parametrize("split", [False, True])
def test_all_to_all_single_strided_input_and_output(world, rng, out_kind, in_kind, split):
    w, r = world.size(), world.rank()
    # counts[src, dst] rows
    counts = rng.integers(0, 3, size=(w, w)) if split else np.full((w, w), 2)
    rows = [data(rng, int(counts[s].sum()), 3) for s in range(w)]
    pieces = [np.split(rows[s], np.cumsum(counts[s])[:-1]) for s in range(w)]
    expected = np.concatenate([pieces[s][r] for s in range(w)]).reshape(-1, 3)
    base, out = strided(out_kind, expected.shape)
    inp = laid_out(in_kind, rows[r])
    if split:
        mpicomm.all_to_all_single(out, inp, counts[:, r].tolist(), counts[r].tolist())
    else:
        mpicomm.all_to_all_single(out, inp, async_op=True).wait()
    check(out_kind, base, out, expected)


@pytest.mark.mpi(min_size=2)
def test_overlap_free_layout_that_datatypes_do_not_take_goes_through_a_temporary(world, rng):
    """Offsets i*24 + j*16 bytes never collide, but the simple overlap test cannot prove it."""
    w, r = world.size(), world.rank()
    xs = data(rng, w, 2, 3)
    base = np.full(8, SENTINEL)
    view = np.lib.stride_tricks.as_strided(base, shape=(2, 3), strides=(24, 16))
    assert not layouts.regular(view)
    mpicomm.sendrecv(xs[r], view, dst=(r + 1) % w, src=(r - 1) % w, tag=5)
    np.testing.assert_array_equal(view, xs[(r - 1) % w])
    touched = np.zeros(8, bool)
    touched[[0, 2, 3, 4, 5, 7]] = True
    assert (base[~touched] == SENTINEL).all()


@pytest.mark.mpi(min_size=1)
def test_datatype_cache_stays_bounded_and_results_stay_right(world, rng):
    w, r = world.size(), world.rank()
    for n in range(1, layouts.CACHE_SIZE + 20):
        x = np.full((n, 2), float(r))[:, 0]
        mpicomm.broadcast(x, src=0)
        assert (x == 0.0).all()
        assert layouts.cached() <= layouts.CACHE_SIZE
    xs = data(rng, w, 3)
    got = np.full((3, 2), SENTINEL)
    mpicomm.sendrecv(xs[r], got[:, 1], dst=(r + 1) % w, src=(r - 1) % w)
    np.testing.assert_array_equal(got[:, 1], xs[(r - 1) % w])


# ---------------------------------------------------------------- halos: packed or by datatype (issue 33)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("rows", [8, 264, 40_000])  # 64 B to 320 KiB of ghost column
@pytest.mark.parametrize("width", [3, 66])
def test_ghost_columns_both_ways_on_a_line(world, rng, rows, width):
    """The 1-D domain decomposition by columns: each rank owns a block of columns with one ghost column
    each side; after the two exchanges every block equals its slice of the global padded array."""
    w, r = world.size(), world.rank()
    inner = width - 2
    glob = data(rng, rows, w * inner)
    padded = np.full((rows, w * inner + 2), SENTINEL)
    padded[:, 1:-1] = glob
    u = np.full((rows, width), SENTINEL)
    u[:, 1:-1] = glob[:, r * inner : (r + 1) * inner]
    left = r - 1 if r > 0 else None
    right = r + 1 if r < w - 1 else mpi_proc_null()
    assert mpicomm.sendrecv(u[:, -2], u[:, 0], dst=right, src=left, tag=21) == (-1 if left is None else left)
    assert mpicomm.sendrecv(u[:, 1], u[:, -1], dst=left, src=right, tag=22) == (r + 1 if r < w - 1 else -1)
    np.testing.assert_array_equal(u, padded[:, r * inner : r * inner + width])


def mpi_proc_null() -> int:
    from mpi4py import MPI

    return int(MPI.PROC_NULL)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("layout", ["every-other", "transposed", "column", "reversed"])
def test_blocking_send_recv_of_strided_views_in_place(world, rng, layout):
    """send and recv of a strided view (packed by the C calls, or by datatype without them)."""
    w, r = world.size(), world.rank()
    msgs = data(rng, w, 6, 5)
    base, got = strided(layout, (6, 5))
    if r == 0:
        mpicomm.send(laid_out(layout, msgs[0]), dst=1, tag=23)
        assert mpicomm.recv(got, src=1, tag=24) == 1
        check(layout, base, got, msgs[1])
    elif r == 1:
        assert mpicomm.recv(got, src=0, tag=23) == 0
        check(layout, base, got, msgs[0])
        mpicomm.send(laid_out(layout, msgs[1]), dst=0, tag=24)


@pytest.mark.mpi(min_size=1)
def test_long_runs_go_by_a_cached_datatype(world, rng):
    """A view of long contiguous runs (a block without its last column) travels by derived datatype,
    made and committed once for its layout: repeated calls make no new datatype."""
    w, r = world.size(), world.rank()
    n = 9000  # 72 KB runs of float64: past RUN_LIMIT
    msgs = data(rng, w, 3, n)
    base = np.full((3, n + 1), SENTINEL)
    got = base[:, :-1]
    assert not buffers.packs(got)
    for i in range(3):
        send = np.full((3, n + 1), SENTINEL)
        send[:, :-1] = msgs[r] + i
        mpicomm.sendrecv(send[:, :-1], got, dst=(r + 1) % w, src=(r - 1) % w, tag=25)
        np.testing.assert_array_equal(got, msgs[(r - 1) % w] + i)
        assert (base[:, -1] == SENTINEL).all()
        if i == 0:
            made = layouts.cached()
    assert layouts.cached() == made


@pytest.mark.mpi(min_size=1)
def test_overlapping_strided_buffers_are_refused(world):
    u = np.zeros((6, 4))
    with pytest.raises(mpicomm.ArgumentError, match=r"^sendrecv: tensor overlaps recv_tensor"):
        mpicomm.sendrecv(u[::2, 0], u[:, 0], dst=0, src=0)
    with pytest.raises(mpicomm.ArgumentError, match=r"^sendrecv: tensor overlaps recv_tensor"):
        mpicomm.sendrecv(u.T[0], u[:, 0], dst=0, src=0)


@pytest.mark.mpi(min_size=1)
def test_the_pack_choice_by_size_and_layout():
    assert buffers.packs(np.zeros((264, 66))[:, 0])  # a ghost column
    assert buffers.packs(np.zeros((64, 64))[:, ::2])
    assert buffers.packs(np.zeros((64, 64)).T)
    assert not buffers.packs(np.zeros((4, 20000))[:, :-1])  # 160 KB runs: a datatype moves them
    big = np.lib.stride_tricks.as_strided(np.zeros(1), shape=((buffers.PACK_LIMIT // 8) + 1,), strides=(0,))
    assert not buffers.packs(big)  # past the limit: no temporary that large
