"""jagged_all_to_all on particle records (structured dtypes), long lengths and narrow length dtypes.

Every rank builds all ranks' inputs from one seed and checks what it receives against the slices of
those inputs a plain numpy reference picks, blocking and with ``async_op``.
"""

from __future__ import annotations

import numpy as np
import pytest
from unit.test_jagged_reference import received_rows

import mpicomm
from mpicomm import jagged_all_to_all
from mpicomm.core.work import Work
from mpicomm.errors import ArgumentError
from mpicomm.jagged import JaggedResult

PARTICLE = np.dtype([("x", "<f8", (3,)), ("id", "<i8"), ("charge", "<f4")])


def inputs(world: mpicomm.ProcessGroup, seed: int, rows: int, dtype: np.dtype, lens_dtype: type) -> tuple:
    rng = np.random.default_rng(seed)
    lengths, splits, values = [], [], []
    for _ in range(world.size()):
        cells = rng.multinomial(rows, [1 / world.size()] * world.size())
        lens = rng.integers(0, 4, rows).astype(lens_dtype)
        vals = np.zeros(int(lens.sum()), dtype)
        if dtype.names:
            vals["x"] = rng.random((vals.size, 3))
            vals["id"] = rng.integers(0, 1 << 40, vals.size)
            vals["charge"] = rng.random(vals.size)
        else:
            vals[:] = rng.random(vals.size)
        lengths.append(lens)
        splits.append(cells.tolist())
        values.append(vals)
    return lengths, splits, values


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize(
    ("rows", "dtype", "lens_dtype"),
    [(5, PARTICLE, np.int64), (300, PARTICLE, np.int32), (200, np.dtype(np.float32), np.uint16)],
    ids=["few-records", "many-records-int32-lengths", "many-floats-uint16-lengths"],
)
def test_records_move_whole(
    world: mpicomm.ProcessGroup, rows: int, dtype: np.dtype, lens_dtype: type, async_op: bool
) -> None:
    lengths, splits, values = inputs(world, 7 + rows, rows, dtype, lens_dtype)
    r = world.rank()
    got = jagged_all_to_all(values[r], lengths[r], splits[r], async_op=async_op)
    if async_op:
        assert isinstance(got, Work)
        got = JaggedResult(*got.result())
    assert isinstance(got, JaggedResult)
    want_l, want_v = received_rows(world.rank(), lengths, values, splits)
    assert got.splits == [splits[s][r] for s in range(world.size())]
    assert got.lengths.dtype == lens_dtype and got.values.dtype == dtype
    np.testing.assert_array_equal(got.lengths, want_l)
    assert got.values.tobytes() == want_v.tobytes()


@pytest.mark.parametrize("rows", [3, 300])
def test_negative_lengths_are_refused_short_or_long(world: mpicomm.ProcessGroup, rows: int) -> None:
    lens = np.ones(rows * world.size(), np.int64)
    lens[-1] = -1
    with pytest.raises(ArgumentError, match="jagged_all_to_all: lengths has a negative entry -1"):
        jagged_all_to_all(np.zeros(int(lens.sum()) + 2), lens, [rows] * world.size())


@pytest.mark.parametrize("rows", [3, 300])
def test_lengths_that_do_not_match_the_values_are_refused(world: mpicomm.ProcessGroup, rows: int) -> None:
    lens = np.ones(rows * world.size(), np.int64)
    with pytest.raises(ArgumentError, match=f"lengths sum to {lens.size}; expected {lens.size + 1}"):
        jagged_all_to_all(np.zeros(lens.size + 1), lens, [rows] * world.size())


@pytest.mark.parametrize("rows", [2, 30])
def test_ranks_may_differ_in_async_op(world: mpicomm.ProcessGroup, rows: int) -> None:
    # a blocking collective never matches a non-blocking one: one async rank makes every rank post
    # the non-blocking calls (the counts message says so), and the results stay right on all
    lengths, splits, values = inputs(world, 11, rows, np.dtype(np.float64), np.int64)
    r = world.rank()
    got = jagged_all_to_all(values[r], lengths[r], splits[r], async_op=r % 2 == 1)
    if isinstance(got, Work):
        got = JaggedResult(*got.result())
    assert isinstance(got, JaggedResult)
    want_l, want_v = received_rows(world.rank(), lengths, values, splits)
    np.testing.assert_array_equal(got.lengths, want_l)
    np.testing.assert_array_equal(got.values, want_v)


@pytest.mark.mpi(min_size=2)
@pytest.mark.usefixtures("validation_off")  # rank 0 forges the wire by hand, outside validation's exchange
def test_forged_inline_lengths_are_refused_on_the_receiver(world: mpicomm.ProcessGroup) -> None:
    from mpi4py import MPI

    from mpicomm.errors import CommunicationError
    from mpicomm.jagged.wire import _DTYPES, _HEADER, _JAGGED_WORDS, _ROWS, _VALUES, _fingerprint

    w = world.size()
    values, lengths = np.ones(w), np.ones(w, np.int64)
    if world.rank() == 0:  # one row of 5 values announced, its inline length says 7
        header = np.zeros((w, _JAGGED_WORDS), np.int64)
        header[:, _DTYPES] = _fingerprint(str(lengths.dtype), values.dtype.str, values.shape[1:])
        header[:, _ROWS], header[:, _VALUES], header[:, _HEADER] = 1, 5, 7
        world.internal.Alltoall([header, MPI.INT64_T], [np.empty_like(header), MPI.INT64_T])
    else:
        with pytest.raises(CommunicationError, match=r"rank 0 sends 1 rows of lengths \[7\] for 5 values"):
            jagged_all_to_all(values, lengths, [1] * w)
    MPI.COMM_WORLD.Barrier()
