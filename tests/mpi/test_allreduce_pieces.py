"""A large all_reduce in pieces (mpicomm.core.pieces): one call's result, on every rank, by either path.

The piece size is set to 64 bytes here, so that small arrays go in several pieces (the real size is
24 MiB). Every rank builds the global input from a shared seed and checks the result against numpy;
small integers make float sums exact in any order. Ranks that take mpi4py's path (the C call
refused, as with ``MPICOMM_C=0``) must cut alike, or the calls would not match: odd ranks take it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm.core import cmpi, pieces
from mpicomm.dense import reductions
from mpicomm.errors import ArgumentError
from tests.ranks import rank_size

pytestmark = pytest.mark.mpi


@pytest.fixture
def small_pieces() -> Iterator[None]:
    """Pieces of 64 bytes for one test, the default restored after it."""
    rank_size()
    pieces.reload({pieces.PIECE_ENV_VAR: "64"})
    yield
    pieces.reload()


def _inputs(seed: int, w: int, n: int, dtype: str) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 4, (w, n)).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int8"])
@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 50, 1001])
def test_every_size_reduces_as_one_call(small_pieces: None, dtype: str, n: int) -> None:
    r, w = rank_size()
    g = _inputs(n + len(dtype), w, n, dtype)
    for op, ref in (
        (mpicomm.ReduceOp.SUM, g.sum(0, dtype=dtype)),
        (mpicomm.ReduceOp.MAX, g.max(0, initial=0)),
    ):
        x = g[r].copy()
        mpicomm.all_reduce(x, op=op)
        np.testing.assert_array_equal(x, ref[:n].astype(dtype))


def test_equal_pieces_and_their_count(small_pieces: None) -> None:
    r, w = rank_size()
    g = _inputs(3, w, 50, "float32")  # 200 bytes: four pieces of 13, 13, 13 and 11 elements
    assert pieces.per_call(50, 200) == 13
    x, made = g[r].copy(), pieces.made()
    mpicomm.all_reduce(x)
    np.testing.assert_array_equal(x, g.sum(0))
    if cmpi.bound() is None:  # the C call made them
        assert pieces.made() - made == 4


def test_ranks_on_the_mpi4py_path_cut_alike(small_pieces: None, monkeypatch: pytest.MonkeyPatch) -> None:
    r, w = rank_size()
    if r % 2:  # the C call refuses here: mpi4py's calls, in the same pieces
        monkeypatch.setattr(cmpi, "allreduce", lambda *args: NotImplemented)
    g = _inputs(4, w, 3001, "float64")
    for async_op in (False, r % 2 == 0):  # and ranks differing in async_op
        x = g[r].copy()
        work = mpicomm.all_reduce(x, async_op=async_op)
        if work is not None:
            work.wait()
        np.testing.assert_array_equal(x, g.sum(0))


def test_a_strided_array_is_cut_in_its_contiguous_copy(small_pieces: None) -> None:
    r, w = rank_size()
    g = _inputs(5, w, 2 * 97, "float32").reshape(w, 97, 2)
    x = g[r].copy()
    mpicomm.all_reduce(x[:, 1])
    np.testing.assert_array_equal(x[:, 1], g.sum(0)[:, 1])
    np.testing.assert_array_equal(x[:, 0], g[r][:, 0])  # the other column untouched


def test_a_bad_piece_size_names_the_variable() -> None:
    rank_size()
    with pytest.raises(ArgumentError, match="MPICOMM_ALLREDUCE_PIECE"):
        pieces.reload({pieces.PIECE_ENV_VAR: "lots"})
    assert pieces.reload({pieces.PIECE_ENV_VAR: "0"}) == 0 and pieces.per_call(10**9, 4 * 10**9) == 10**9
    assert pieces.reload() == pieces.DEFAULT_PIECE_BYTES


@pytest.mark.parametrize("stacked", [False, True])
def test_a_large_reduce_scatter_tensor_goes_pairwise_with_one_call_s_result(
    small_pieces: None, stacked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # past the piece size, reduce_scatter_tensor is the list form's pairwise exchange (MPI's own
    # temporary would be mapped afresh each call); every rank decides on the input's size alike
    r, w = rank_size()
    calls: list[int] = []
    pairwise = reductions._reduce_scatter_pairwise
    monkeypatch.setattr(reductions, "_reduce_scatter_pairwise", lambda *a: calls.append(1) or pairwise(*a))
    n = 37  # 296 bytes of float64 a rank's block: past 64 bytes whatever the group size
    g = _inputs(11, w, w * n, "float64")
    cases = (
        (mpicomm.ReduceOp.SUM, g.sum(0)),
        (mpicomm.ReduceOp.MAX, g.max(0)),
        (mpicomm.ReduceOp.AVG, g.sum(0) / w),
        (mpicomm.ReduceOp.PREMUL_SUM(0.5), (0.5 * g).sum(0)),
    )
    for op, ref in cases:
        x = g[r].reshape(w, n) if stacked else g[r].copy()
        out = np.full(n, -1.0)
        work = mpicomm.reduce_scatter_tensor(out, x, op=op, async_op=r % 2 == 1)  # ranks differ in async_op
        if work is not None:
            work.wait()
        np.testing.assert_allclose(out, ref[r * n : (r + 1) * n], rtol=1e-12)
        np.testing.assert_array_equal(x.reshape(-1), g[r])  # the input is not modified
    assert len(calls) == (len(cases) if w > 1 else 0)


@pytest.mark.parametrize("n", [0, 1, 7, 50, 1001])
def test_a_large_reduce_goes_in_pieces_of_a_third(
    small_pieces: None, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pieces of 21 bytes (a third of 64) for reduce: int64 sums and maxima, every root
    r, w = rank_size()
    asked: list[tuple[int, int]] = []
    real = pieces.per_call
    monkeypatch.setattr(pieces, "per_call", lambda c, b, s=None: asked.append((b, s or 0)) or real(c, b, s))
    g = _inputs(20 + n, w, n, "int64")
    for root in range(w):
        for op, ref in ((mpicomm.ReduceOp.SUM, g.sum(0)), (mpicomm.ReduceOp.MAX, g.max(0, initial=0))):
            x = g[r].copy()
            mpicomm.reduce(x, dst=root, op=op)
            np.testing.assert_array_equal(x, ref[:n] if r == root else g[r])
    # at multiple (python -m mpi4py) the general path cut every call past 21 bytes with a third of the
    # piece and the C call took the rest (with MPICOMM_C=0, the general path all); below multiple
    # every reduce goes whole
    multiple = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
    general = 8 * n > 21 or cmpi.bound() is not None
    assert pieces._State.reduce == (21 if multiple else 1 << 62)
    assert set(asked) == ({(8 * n, 21)} if general and multiple else set())
    assert real(50, 400, 21) == 3  # 50 int64 in 21-byte pieces: 17 calls of 3 elements and one of 2
