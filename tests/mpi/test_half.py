"""float16 and bfloat16 reductions: every op, every reduction, checked against a numpy reference.

The inputs are small multiples of 1/4, so every float32 partial sum is exact whatever order MPI adds
in; the reference is then the float32 result rounded once to the half type, which is what mpicomm
promises (docs/torch.rst).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import mpicomm
from mpicomm import ReduceOp

HALVES = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
OPS = [
    ReduceOp.SUM,
    ReduceOp.AVG,
    ReduceOp.MIN,
    ReduceOp.MAX,
    ReduceOp.PRODUCT,
    ReduceOp.PREMUL_SUM(0.5),
]
IDS = ["sum", "avg", "min", "max", "product", "premul"]


def _inputs(w: int, n: int, dtype: np.dtype[Any], op: ReduceOp, seed: int = 14) -> np.ndarray:
    """Every rank's input, the same on every rank (row r is rank r's)."""
    rng = np.random.default_rng(seed)
    if op.name == "PRODUCT":  # small factors: products stay exact in float32 and finite in float16
        values = rng.choice(np.array([-2.0, -1.0, 0.5, 1.0, 1.5, 2.0]), size=(w, n))
    else:
        values = rng.integers(-64, 65, size=(w, n)) / 4.0
    return values.astype(dtype)


def _reference(rows: np.ndarray, op: ReduceOp) -> np.ndarray:
    """The float32 reduction of the rows, rounded once to their half dtype."""
    wide = rows.astype(np.float32)
    if op.name in ("SUM", "AVG", "PREMUL_SUM"):
        out = (wide * np.float32(op.factor or 1)).sum(axis=0, dtype=np.float32)
        if op.name == "AVG":
            out = out / np.float32(len(rows))
    else:
        out = {"MIN": np.min, "MAX": np.max, "PRODUCT": np.prod}[op.name](wide, axis=0)
    return out.astype(rows.dtype)


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", HALVES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op", OPS, ids=IDS)
@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_all_reduce_half_matches_float32_rounded_once(world, dtype, op, async_op):
    w, r = world.size(), world.rank()
    rows = _inputs(w, 37, dtype, op)
    x = rows[r].copy()
    work = mpicomm.all_reduce(x, op=op, async_op=async_op)
    if async_op:
        assert work.wait() and work.result()[0] is x
    _same(x, _reference(rows, op))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", HALVES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op", OPS, ids=IDS)
@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_reduce_half_changes_only_the_destination(world, dtype, op, async_op):
    w, r = world.size(), world.rank()
    rows = _inputs(w, 11, dtype, op, seed=3)
    dst = w - 1
    x = rows[r].copy()
    work = mpicomm.reduce(x, dst=dst, op=op, async_op=async_op)
    if async_op:
        assert work.wait()
    _same(x, _reference(rows, op) if r == dst else rows[r])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", HALVES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op", OPS, ids=IDS)
@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_reduce_scatter_tensor_half_gives_each_rank_its_chunk(world, dtype, op, async_op):
    w, r, n = world.size(), world.rank(), 5
    every = _inputs(w, w * n, dtype, op, seed=40)
    out = np.empty(n, dtype)
    work = mpicomm.reduce_scatter_tensor(out, every[r], op=op, async_op=async_op)
    if async_op:
        work.wait()
    _same(out, _reference(every, op)[r * n : (r + 1) * n])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", HALVES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op", OPS, ids=IDS)
@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_reduce_scatter_list_half_with_uneven_sizes(world, dtype, op, async_op):
    w, r = world.size(), world.rank()
    sizes = [j + 1 for j in range(w)]
    rows = _inputs(w, sum(sizes), dtype, op, seed=7)
    cuts = np.cumsum(sizes)[:-1]
    out = np.empty(sizes[r], dtype)
    work = mpicomm.reduce_scatter(out, [p.copy() for p in np.split(rows[r], cuts)], op=op, async_op=async_op)
    if async_op:
        while not work.is_completed():  # polling completes it too (and rounds the result back)
            pass
        assert work.result() == [out]
    _same(out, np.split(_reference(rows, op), cuts)[r])


@pytest.mark.mpi(min_size=1)
def test_float16_sum_is_rounded_once_not_at_every_step(world):
    # 2048 + 1 is not a float16 (the spacing there is 2): adding the ones one at a time in float16
    # would give 2048 at every step; one rounding of the exact sum gives the nearest float16 to it.
    w, r = world.size(), world.rank()
    x = np.array([2048.0 if r == 0 else 1.0], np.float16)
    mpicomm.all_reduce(x)
    assert x[0] == np.float16(2048 + (w - 1))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("op", [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR], ids=["band", "bor", "bxor"])
def test_bfloat16_refused_by_bitwise_ops_with_its_name(world, op):
    x = np.ones(3, ml_dtypes.bfloat16)
    with pytest.raises(mpicomm.ReductionTypeError, match=rf"all_reduce: op {op!r} on dtype bfloat16"):
        mpicomm.all_reduce(x, op=op)


@pytest.mark.mpi(min_size=1)
def test_half_outputs_must_be_writeable_and_strided_ones_are_written_through(world):
    frozen = np.ones(4, np.float16)
    frozen.flags.writeable = False
    with pytest.raises(mpicomm.ArgumentError, match=r"all_reduce: tensor .*read-only"):
        mpicomm.all_reduce(frozen)
    base = np.ones(8, np.float16)
    mpicomm.all_reduce(base[::2])  # strided outputs are written through, as on every dtype
    assert base.tolist() == [world.size(), 1] * 4
