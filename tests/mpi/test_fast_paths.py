"""The fast paths of the common call: same answers as the general path, no stale plan, same errors.

Every rank builds the global input from the shared seed and checks its own slice against numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mpicomm
from mpicomm import ArgumentError
from mpicomm.dense import alltoall


def _all_to_all_single(w: int, r: int, sends: np.ndarray, rows: list[np.ndarray]) -> None:
    """One all_to_all_single with split sizes ``sends`` (sends[i, j]: rows rank i sends to j)."""
    out = np.empty((int(sends[:, r].sum()), 3))
    mpicomm.all_to_all_single(out, rows[r], sends[:, r].tolist(), sends[r].tolist())
    expected = [np.split(rows[i], np.cumsum(sends[i])[:-1])[r] for i in range(w)]
    np.testing.assert_array_equal(out, np.concatenate(expected))


def test_a_changed_split_with_the_same_shapes_is_not_served_a_stale_plan(
    world: mpicomm.ProcessGroup, rng: Any
) -> None:
    w, r = world.size(), world.rank()
    rows = [rng.integers(0, 1000, (4 * w, 3)).astype(np.float64) for _ in range(w)]
    even = np.full((w, w), 4)
    _all_to_all_single(w, r, even, rows)
    _all_to_all_single(w, r, even, rows)  # the second call is served from the cache
    # The same row totals and column totals (so the same shapes on every rank), other splits:
    # rank i sends one row more to i+1 and one row less to i+2.
    shift = np.zeros((w, w), dtype=np.int64)
    for i in range(w):
        shift[i, (i + 1) % w] += 1
        shift[i, (i + 2) % w] -= 1
    moved = even + shift
    assert w < 2 or not (moved == even).all()
    _all_to_all_single(w, r, moved, rows)
    _all_to_all_single(w, r, even, rows)


def test_the_plan_cache_stays_bounded(world: mpicomm.ProcessGroup, rng: Any) -> None:
    w, r = world.size(), world.rank()
    rows = [rng.integers(0, 1000, (w * (alltoall._PLANS_MAX + 8), 3)).astype(np.float64) for _ in range(w)]
    for k in range(1, alltoall._PLANS_MAX + 8):  # a new shape each call: every one a new plan
        sends = np.full((w, w), k)
        part = [x[: w * k] for x in rows]
        _all_to_all_single(w, r, sends, part)
        assert len(alltoall._PLANS) <= alltoall._PLANS_MAX


def test_small_all_gather_and_reduce_scatter_with_a_strided_list_on_one_rank(
    world: mpicomm.ProcessGroup, rng: Any
) -> None:
    """Rank 0 passes strided views (its general path), the others plain arrays (their fast path)."""
    w, r = world.size(), world.rank()
    g = rng.integers(0, 100, (w, 3)).astype(np.float64)
    if r == 0:
        block = np.zeros((3, 2 * w))
        outs = [block[:, 2 * j] for j in range(w)]  # strided columns
    else:
        outs = [np.empty(3) for _ in range(w)]
    mpicomm.all_gather(outs, g[r].copy())
    for j in range(w):
        np.testing.assert_array_equal(outs[j], g[j])
    inputs = rng.integers(0, 100, (w, w, 3)).astype(np.float64)  # inputs[i][j]: rank i's entry j
    out = np.zeros((3, 2))[:, 0] if r == 0 else np.empty(3)
    mpicomm.reduce_scatter(out, [inputs[r, j].copy() for j in range(w)])
    np.testing.assert_array_equal(out, inputs[:, r].sum(axis=0))


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda w, r: mpicomm.broadcast(np.zeros(2), src=w), ("broadcast", "src")),
        (lambda w, r: mpicomm.send(np.zeros(2), dst=r), ("send", "dst", "this rank")),
        (lambda w, r: mpicomm.all_gather_into_tensor(np.zeros(2 * w + 1), np.zeros(2)), ("output_tensor",)),
        (lambda w, r: mpicomm.reduce_scatter_tensor(np.zeros(2), np.zeros(2 * w + 1)), ("input",)),
        (
            lambda w, r: mpicomm.all_to_all_single(np.zeros(w), np.zeros(w), [1] * w, [2] * w),
            ("input_split_sizes",),
        ),
    ],
    ids=["bcast-src", "send-self", "agit-size", "rst-size", "a2as-splits"],
)
def test_calls_the_fast_path_refuses_get_the_general_paths_errors(
    world: mpicomm.ProcessGroup, call: Any, words: Any
) -> None:
    with pytest.raises(ArgumentError) as info:
        call(world.size(), world.rank())
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("alias", ["none", "own", "peer"])
@pytest.mark.parametrize("op", ["SUM", "MAX", "AVG", "PREMUL_SUM"])
def test_large_list_reduce_scatter_receives_into_its_output_only_when_nothing_shares_it(
    world: mpicomm.ProcessGroup, rng: Any, alias: str, op: str
) -> None:
    """Pairwise reduce_scatter (entries past the small path) with the output apart, or a view of
    this rank's own input, or of a peer's input: every case matches numpy."""
    w, r = world.size(), world.rank()
    n = (64 << 10) // 8 + 3  # float64 entries just past mpicomm.dense.small.SMALL
    full = rng.integers(-20, 20, (w, w, n)).astype(np.float64)  # full[i, j]: rank i's entry j
    ins = [full[r, j].copy() for j in range(w)]
    if alias == "own":
        out = ins[r]
    elif alias == "peer" and w > 1:
        out = ins[(r + 1) % w]
    else:
        out = np.empty(n)
    expected_ins = full[:, r]
    reduce_op = mpicomm.ReduceOp.PREMUL_SUM(2.0) if op == "PREMUL_SUM" else getattr(mpicomm.ReduceOp, op)
    mpicomm.reduce_scatter(out, ins, op=reduce_op)
    if op == "MAX":
        want = expected_ins.max(axis=0)
    elif op == "AVG":
        want = expected_ins.sum(axis=0) / w
    elif op == "PREMUL_SUM":
        want = 2.0 * expected_ins.sum(axis=0)
    else:
        want = expected_ins.sum(axis=0)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("count", [(64 << 10) // 8 + 1, 1 << 17])
def test_large_list_all_gather_pairwise_from_c_or_python_on_each_rank(
    world: mpicomm.ProcessGroup, rng: Any, count: int
) -> None:
    """Past 64 KiB the list all_gather exchanges pairwise: from C on plain arrays, from Python on
    rank 0's strided entries; every rank gets every rank's input, and the mistakes stay errors."""
    w, r = world.size(), world.rank()
    x = rng.integers(-99, 99, (w, count)).astype(np.float64)
    if r == 0:
        base = np.full((w, 2 * count), -1.0)
        outs = [base[j, ::2] for j in range(w)]  # strided: the C call refuses, Python serves
    else:
        outs = [np.full(count, -1.0) for _ in range(w)]
    mpicomm.all_gather(outs, x[r].copy())
    for j in range(w):
        np.testing.assert_array_equal(outs[j], x[j])
    if w > 1:  # an output entry that overlaps the input: refused before any message, on every rank
        plain = [np.empty(count) for _ in range(w)]
        with pytest.raises(ArgumentError):
            mpicomm.all_gather(plain, plain[(r + 1) % w])
    with pytest.raises(ArgumentError):  # this rank's own entry of the wrong size
        mpicomm.all_gather([np.empty(count + (j == r)) for j in range(w)], x[r].copy())


@pytest.mark.parametrize("op", ["SUM", "MAX"])
@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_large_list_reduce_scatter_pairwise_from_c_or_python_on_each_rank(
    world: mpicomm.ProcessGroup, rng: Any, op: str, dtype: Any
) -> None:
    """Past 64 KiB the list reduce_scatter exchanges pairwise: from C on plain arrays, from Python on
    rank 0's strided inputs and on a rank whose own piece lies in its output; all get numpy's answer."""
    w, r = world.size(), world.rank()
    count = (64 << 10) // np.dtype(dtype).itemsize + 3
    x = rng.integers(-99, 99, (w, w, count)).astype(dtype)  # x[i, j]: rank i's piece for rank j
    reduce = {"SUM": np.sum, "MAX": np.max}[op]
    want = reduce(x[:, r], axis=0).astype(dtype)
    if r == 0:
        base = np.zeros((w, 2 * count), dtype)
        base[:, ::2] = x[r]
        ins = [base[j, ::2] for j in range(w)]  # strided: the C call refuses, Python serves
        out = np.full(count, -1, dtype)
    elif r == w - 1:
        ins = [x[r, j].copy() for j in range(w)]
        out = ins[r]  # the own piece is the output (in place): the Python path's order
    else:
        ins = [x[r, j].copy() for j in range(w)]
        out = np.full(count, -1, dtype)
    keep = [a.copy() for a in ins]
    for _ in range(2):  # the first call of an (op, dtype) fills the op's cache; the second is the C one
        mpicomm.reduce_scatter(out, ins, op=getattr(mpicomm.ReduceOp, op))
        np.testing.assert_array_equal(out, want)
        for a, b in zip(ins, keep, strict=True):
            a[...] = b
    with pytest.raises(ArgumentError):  # this rank's own piece of the wrong size, refused everywhere
        mpicomm.reduce_scatter(np.empty(count, dtype), [np.empty(count + (j == r), dtype) for j in range(w)])
