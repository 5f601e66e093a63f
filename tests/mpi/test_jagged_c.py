"""jagged_all_to_all's C call (``mpicomm.core._cmpi.jagged``): the results, the path taken, forged counts.

The C module serves a blocking call once the Python path has met its dtypes (int64 lengths); it
makes the same MPI calls as the Python path, so ranks on either path meet. Every rank builds all
ranks' inputs from one seed and checks its own received rows against a plain numpy reference.
With the C calls off (``MPICOMM_C=0``) the same tests check the Python path and assert that the C
call was not taken.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from unit.test_jagged_reference import received_rows

import mpicomm
from mpicomm import jagged_all_to_all
from mpicomm.core import cmpi
from mpicomm.errors import ArgumentError, CommunicationError, CrossRankMismatchError
from mpicomm.jagged import JaggedResult, exchange
from mpicomm.jagged.wire import _DTYPES, _HEADER, _JAGGED_WORDS, _ROWS, _TOTAL, _VALUES, _fingerprint

PARTICLE = np.dtype([("x", "<f8", (3,)), ("id", "<i8"), ("charge", "<f4")])

# validation mode never takes the C call (its calls go the Python path, to the validation exchange),
# and a rank that forges the counts message by hand skips that exchange: these tests run without it
pytestmark = pytest.mark.usefixtures("validation_off")


class Spy:
    """Counts what the C call answered: results, a hand-over to Python, or NotImplemented."""

    def __init__(self) -> None:
        self.done = self.handed = self.refused = 0
        self.real = cmpi.jagged

    def __call__(self, *args: Any) -> Any:
        got = self.real(*args)
        if type(got) is tuple:
            self.done += 1
        elif got is NotImplemented:
            self.refused += 1
        else:
            self.handed += 1
        return got


@pytest.fixture
def spy(world: mpicomm.ProcessGroup, monkeypatch: pytest.MonkeyPatch) -> Iterator[Spy]:
    s = Spy()
    monkeypatch.setattr(cmpi, "jagged", s)
    yield s


def c_on() -> bool:
    return cmpi.bound() is None


def inputs(
    w: int, seed: int, rows: int, dtype: np.dtype, shape: tuple[int, ...] = ()
) -> tuple[list, list, list]:
    rng = np.random.default_rng(seed)
    lengths, splits, values = [], [], []
    for _ in range(w):
        cells = rng.multinomial(rows, [1 / w] * w)
        lens = rng.integers(0, 4, rows).astype(np.int64)
        vals = np.zeros((int(lens.sum()), *shape), dtype)
        if dtype.names:
            vals["x"] = rng.random((vals.shape[0], 3))
            vals["id"] = rng.integers(0, 1 << 40, vals.shape[0])
            vals["charge"] = rng.random(vals.shape[0])
        else:
            vals[...] = rng.integers(-100, 100, vals.shape)
        lengths.append(lens)
        splits.append(cells.tolist())
        values.append(vals)
    return lengths, splits, values


def check(world: mpicomm.ProcessGroup, got: Any, lengths: list, splits: list, values: list) -> None:
    r = world.rank()
    assert isinstance(got, JaggedResult)
    want_l, want_v = received_rows(r, lengths, values, splits)
    assert got.splits == [splits[s][r] for s in range(world.size())]
    assert got.lengths.dtype == np.int64 and got.values.dtype == values[r].dtype
    assert got.values.shape[1:] == values[r].shape[1:]
    np.testing.assert_array_equal(got.lengths, want_l)
    assert got.values.tobytes() == want_v.tobytes()


@pytest.mark.parametrize(
    ("rows", "dtype", "shape"),
    [
        (1, np.dtype(np.float64), ()),
        (5, PARTICLE, ()),
        (40, PARTICLE, ()),  # more than 9 rows to a destination: the lengths need their own Alltoallv
        (7, np.dtype(np.float32), (3,)),
        (60, np.dtype(np.int8), (2, 5)),
        (0, np.dtype(np.float64), ()),
        (4, np.dtype(np.float64), (0,)),
    ],
    ids=["one-row", "few-records", "many-records", "rows-of-3", "many-2x5-int8", "nothing", "empty-rows"],
)
def test_a_repeated_call_is_served_in_c_and_moves_the_rows(
    world: mpicomm.ProcessGroup, spy: Spy, rows: int, dtype: np.dtype, shape: tuple[int, ...]
) -> None:
    w, r = world.size(), world.rank()
    for seed in range(3):  # the first call meets the dtype on the Python path; the others are C's
        lengths, splits, values = inputs(w, 100 * rows + seed, rows * w, dtype, shape)
        check(world, jagged_all_to_all(values[r], lengths[r], splits[r]), lengths, splits, values)
    if c_on():
        assert spy.done >= 2 and spy.handed == 0
    else:
        assert spy.done == spy.handed == 0


def test_ranks_on_the_c_call_and_on_the_python_path_meet(world: mpicomm.ProcessGroup, spy: Spy) -> None:
    w, r = world.size(), world.rank()
    for seed, rows in enumerate((3, 3, 30, 30)):  # few rows (lengths inline) and many
        lengths, splits, values = inputs(w, 7 + seed, rows * w, np.dtype(np.float64))
        mine = values[r]
        if r % 2:  # odd ranks pass a strided view, which the C call refuses (the Python path copies it)
            spaced = np.zeros(2 * mine.size)
            spaced[::2] = mine
            mine = spaced[::2]
        check(world, jagged_all_to_all(mine, lengths[r], splits[r]), lengths, splits, values)
    assert (spy.done > 0) == (c_on() and r % 2 == 0)


def test_one_rank_with_many_rows_makes_every_rank_send_its_lengths(
    world: mpicomm.ProcessGroup, spy: Spy
) -> None:
    w, r = world.size(), world.rank()
    rng = np.random.default_rng(5)
    splits = [[3] * w for _ in range(w)]
    splits[0][w - 1] = 12  # rank 0 sends 12 rows to the last rank: past what rides inline
    lengths = [rng.integers(0, 5, sum(s)).astype(np.int64) for s in splits]
    values = [rng.random(int(x.sum())) for x in lengths]
    for _ in range(2):
        check(world, jagged_all_to_all(values[r], lengths[r], splits[r]), lengths, splits, values)


def test_ranks_may_differ_in_async_op_on_the_c_call(world: mpicomm.ProcessGroup, spy: Spy) -> None:
    w, r = world.size(), world.rank()
    lengths, splits, values = inputs(w, 11, 4 * w, np.dtype(np.float64))
    for _ in range(2):
        got = jagged_all_to_all(values[r], lengths[r], splits[r], async_op=r == w - 1 and w > 1)
        if not isinstance(got, JaggedResult):
            got = JaggedResult(*got.result())
        check(world, got, lengths, splits, values)
    if c_on() and w > 1 and r != w - 1:
        assert spy.handed >= 1  # the C call sent the counts and left the non-blocking calls to Python


@pytest.mark.parametrize("rows", [3, 30])
def test_argument_errors_on_the_c_call_name_the_argument(world: mpicomm.ProcessGroup, rows: int) -> None:
    w = world.size()
    lens = np.ones(rows * w, np.int64)
    jagged_all_to_all(np.zeros(lens.size), lens, [rows] * w)  # the dtypes met: the next calls go to C
    bad = lens.copy()
    bad[-1] = -1
    with pytest.raises(ArgumentError, match="jagged_all_to_all: lengths has a negative entry -1"):
        jagged_all_to_all(np.zeros(lens.size), bad, [rows] * w)
    with pytest.raises(ArgumentError, match=f"lengths sum to {lens.size}; expected {lens.size + 1}"):
        jagged_all_to_all(np.zeros(lens.size + 1), lens, [rows] * w)
    with pytest.raises(ArgumentError, match=f"send_splits has {w + 1} entries; expected {w}"):
        jagged_all_to_all(np.zeros(lens.size), lens, [rows] * w + [0])
    with pytest.raises(ArgumentError, match="send_splits has a negative entry"):
        jagged_all_to_all(np.zeros(lens.size), lens, [rows * w + 1] + [0] * (w - 2) + [-1] if w > 1 else [-1])
    # and the next good call still works on every rank
    got = jagged_all_to_all(np.arange(lens.size, dtype=np.float64), lens, [rows] * w)
    assert isinstance(got, JaggedResult) and got.lengths.tolist() == [1] * (rows * w)


def forge(world: mpicomm.ProcessGroup, edit: str) -> np.ndarray:
    w = world.size()
    values = np.ones(w)
    header = np.zeros((w, _JAGGED_WORDS), np.int64)
    header[:, _DTYPES] = _fingerprint("int64", values.dtype.str, values.shape[1:])
    header[:, _ROWS], header[:, _VALUES], header[:, _HEADER] = 1, 1, 1
    if edit == "negative":
        header[:, _VALUES] = -5
    elif edit == "huge":
        header[:, _VALUES] = 2**50
    elif edit == "inline":
        header[:, _HEADER] = 7
    elif edit == "dtype":
        header[:, _DTYPES] += 1
    elif edit == "mode":
        header[:, _TOTAL] = 9
    return header


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(
    ("edit", "error", "words"),
    [
        ("negative", CommunicationError, "-5"),
        ("huge", CommunicationError, str(2**50)),
        ("inline", CommunicationError, r"rank 0 sends 1 rows of lengths \[7\] for 1 values"),
        ("dtype", CrossRankMismatchError, "dtypes or value shapes"),
        ("mode", CommunicationError, "unknown mode 9"),
    ],
)
def test_forged_counts_reach_the_python_checks_from_the_c_call(
    world: mpicomm.ProcessGroup, spy: Spy, edit: str, error: type[Exception], words: str
) -> None:
    w = world.size()
    values, lengths = np.ones(w), np.ones(w, np.int64)
    jagged_all_to_all(values, lengths, [1] * w)  # every rank meets the dtypes
    if world.rank() == 0:  # rank 0 does not run mpicomm: it sends a forged counts message
        header = forge(world, edit)
        world.internal.Alltoall([header, MPI.INT64_T], [np.empty_like(header), MPI.INT64_T])
    else:
        with pytest.raises(error, match=words):
            jagged_all_to_all(values, lengths, [1] * w)
        if c_on():
            assert spy.handed == 1
    MPI.COMM_WORLD.Barrier()
    got = jagged_all_to_all(values * world.rank(), lengths, [1] * w)  # the group still works
    assert isinstance(got, JaggedResult) and got.values.tolist() == list(range(w))


def test_the_c_file_keeps_the_wire_format() -> None:
    # _cmpi_jagged.c writes the counts message itself: its word positions must be wire.py's
    from pathlib import Path

    from mpicomm.jagged import wire

    src = (Path(exchange.__file__).parent.parent / "core" / "_cmpi_jagged.c").read_text()
    assert "enum { W_FLAGS, W_DTYPES, W_SPLITS, W_ROWS, W_VALUES, W_STRIDE, W_MODE, W_HEADER };" in src
    words = (wire._FLAGS, wire._DTYPES, wire._SPLITS, wire._ROWS, wire._VALUES, wire._STRIDE)
    assert words == (0, 1, 2, 3, 4, 5)
    assert exchange._MODE == wire._TOTAL == 6 and wire._HEADER == 7
    assert f"#define INLINE {wire._INLINE}\n" in src
    assert "enum { M_IN_HEADER, M_BLOCKING, M_NONBLOCKING };" in src
    assert (exchange._IN_HEADER, exchange._BLOCKING, exchange._NONBLOCKING) == (0, 1, 2)
