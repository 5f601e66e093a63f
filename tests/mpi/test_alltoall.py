"""all_to_all and all_to_all_single, checked against numpy at any world size.

Every rank draws the same W x W matrix of sizes (``sizes[i][j]``: rows rank i sends to rank j) and the
same global data from the shared seed, runs the exchange on its own part and checks what arrived.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mpicomm


def offsets(sizes: np.ndarray) -> np.ndarray:
    """Start offsets of consecutive pieces of the given sizes, plus the total at the end."""
    return np.concatenate([[0], np.cumsum(sizes)]).astype(int)


def global_inputs(
    rng: np.random.Generator, sizes: np.ndarray, row: tuple[int, ...], dtype: Any = np.float64
) -> list[np.ndarray]:
    """Rank i's whole input: ``sizes[i].sum()`` rows of shape ``row``, distinct values per rank."""
    w = len(sizes)
    return [(rng.integers(0, 100, (int(sizes[i].sum()), *row)) + 1000 * i).astype(dtype) for i in range(w)]


def expected_output(inputs: list[np.ndarray], sizes: np.ndarray, r: int) -> np.ndarray:
    """What rank r receives: rank j's block for r, for j in rank order."""
    pieces = []
    for j, inp in enumerate(inputs):
        start = offsets(sizes[j])[r]
        pieces.append(inp[start : start + sizes[j][r]])
    return np.concatenate(pieces)


# ------------------------------------------------------------------------------------------ all_to_all


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [np.float64, np.int8, np.bool_, np.float16, np.complex64])
def test_all_to_all_lists_with_uneven_sizes_swap_pieces(world, rng, dtype):
    w, r = world.size(), world.rank()
    sizes = rng.integers(0, 4, (w, w))  # sizes[i][j]: elements rank i sends to rank j
    pieces = [
        [(rng.integers(0, 2 if dtype is np.bool_ else 50, int(sizes[i][j]))).astype(dtype) for j in range(w)]
        for i in range(w)
    ]
    ins = [p.copy() for p in pieces[r]]
    outs = [np.zeros(int(sizes[j][r]), dtype=dtype) for j in range(w)]
    assert mpicomm.all_to_all(outs, ins) is None
    for j in range(w):
        np.testing.assert_array_equal(outs[j], pieces[j][r])
    for a, b in zip(ins, pieces[r], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.mpi(min_size=1)
def test_all_to_all_lists_of_multi_dim_and_non_contiguous_arrays(world, rng):
    w, r = world.size(), world.rank()
    mats = rng.standard_normal((w, w, 3, 4))  # mats[i][j]: what rank i sends to rank j
    ins = [m[:, ::2] for m in mats[r]]  # non-contiguous (3, 2) views
    outs = [np.empty((2, 3)) for _ in range(w)]  # same size, another shape
    mpicomm.all_to_all(outs, ins)
    for j in range(w):
        np.testing.assert_array_equal(outs[j].reshape(-1), mats[j][r][:, ::2].reshape(-1))


@pytest.mark.mpi(min_size=2)
def test_all_to_all_docstring_example_at_two_ranks(world):
    if world.size() != 2:
        pytest.skip("the docstring table is for exactly 2 ranks")
    ins = [[np.array([0]), np.array([1, 1])], [np.array([10]), np.array([11, 11])]][world.rank()]
    outs = [[np.empty(1, int), np.empty(1, int)], [np.empty(2, int), np.empty(2, int)]][world.rank()]
    mpicomm.all_to_all(outs, ins)
    assert [o.tolist() for o in outs] == [[[0], [10]], [[1, 1], [11, 11]]][world.rank()]


# ----------------------------------------------------------------------------------- all_to_all_single


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("row", [(), (3,), (2, 2)], ids=["1d", "rows3", "rows2x2"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.float16, np.complex128])
def test_all_to_all_single_equal_splits_transpose_blocks(world, rng, row, dtype):
    w, r = world.size(), world.rank()
    sizes = np.full((w, w), 2)
    inputs = global_inputs(rng, sizes, row, dtype)
    out = np.empty((2 * w, *row), dtype=dtype)
    assert mpicomm.all_to_all_single(out, inputs[r]) is None
    np.testing.assert_array_equal(out, expected_output(inputs, sizes, r))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("empty", [None, []], ids=["None", "empty-list"])
def test_all_to_all_single_none_or_empty_splits_mean_equal_pieces(world, rng, empty):
    w, r = world.size(), world.rank()
    sizes = np.full((w, w), 3)
    inputs = global_inputs(rng, sizes, ())
    out = np.empty(3 * w)
    mpicomm.all_to_all_single(out, inputs[r], empty, empty)
    np.testing.assert_array_equal(out, expected_output(inputs, sizes, r))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("row", [(), (2, 3)], ids=["1d", "rows2x3"])
def test_all_to_all_single_uneven_splits_route_rows(world, rng, row):
    w, r = world.size(), world.rank()
    sizes = rng.integers(0, 4, (w, w))
    inputs = global_inputs(rng, sizes, row)
    out = np.full((int(sizes[:, r].sum()), *row), np.nan)
    mpicomm.all_to_all_single(out, inputs[r], sizes[:, r].tolist(), sizes[r].tolist())
    np.testing.assert_array_equal(out, expected_output(inputs, sizes, r))


@pytest.mark.mpi(min_size=1)
def test_all_to_all_single_zero_splits_send_nothing(world, rng):
    w, r = world.size(), world.rank()
    # every rank sends only to itself and to rank 0; every other pair exchanges nothing
    sizes = np.zeros((w, w), dtype=int)
    sizes[:, 0] = 2
    sizes[np.arange(w), np.arange(w)] = 1 + (np.arange(w) == 0)
    inputs = global_inputs(rng, sizes, (2,))
    out = np.full((int(sizes[:, r].sum()), 2), -1.0)
    mpicomm.all_to_all_single(out, inputs[r], sizes[:, r], sizes[r])
    np.testing.assert_array_equal(out, expected_output(inputs, sizes, r))
    if r != 0:
        assert out.shape == (1, 2)  # only its own row came back


@pytest.mark.mpi(min_size=1)
def test_all_to_all_single_all_zero_splits_move_nothing(world):
    w = world.size()
    out = np.empty((0, 4))
    mpicomm.all_to_all_single(out, np.empty((0, 4)), [0] * w, [0] * w)
    assert out.shape == (0, 4)


@pytest.mark.mpi(min_size=1)
def test_all_to_all_single_with_only_input_splits_receives_equal_pieces(world, rng):
    w, r = world.size(), world.rank()
    # every rank sends 2 rows to each rank, described explicitly on the input side only
    sizes = np.full((w, w), 2)
    inputs = global_inputs(rng, sizes, (3,))
    out = np.empty((2 * w, 3))
    mpicomm.all_to_all_single(out, inputs[r], None, [2] * w)
    np.testing.assert_array_equal(out, expected_output(inputs, sizes, r))


@pytest.mark.mpi(min_size=1)
def test_all_to_all_single_accepts_numpy_split_arrays_and_non_contiguous_input(world, rng):
    w, r = world.size(), world.rank()
    sizes = rng.integers(0, 3, (w, w))
    inputs = global_inputs(rng, sizes, (2,))
    wide = np.zeros((inputs[r].shape[0], 5))
    wide[:, 1:5:2] = inputs[r]
    out = np.empty((int(sizes[:, r].sum()), 2))
    mpicomm.all_to_all_single(out, wide[:, 1:5:2], np.asarray(sizes[:, r]), np.asarray(sizes[r]))
    np.testing.assert_array_equal(out, expected_output(inputs, sizes, r))


@pytest.mark.mpi(min_size=4)
def test_all_to_all_single_torch_docstring_example_at_four_ranks(world):
    if world.size() != 4:
        pytest.skip("the §1.8 docstring example is for exactly 4 ranks")
    r = world.rank()
    inputs = [np.arange(0, 6), np.arange(10, 19), np.arange(20, 25), np.arange(30, 37)]
    in_splits = [[2, 2, 1, 1], [3, 2, 2, 2], [2, 1, 1, 1], [2, 2, 2, 1]]
    out_splits = [[2, 3, 2, 2], [2, 2, 1, 2], [1, 2, 1, 2], [1, 2, 1, 1]]
    expected = [
        [0, 1, 10, 11, 12, 20, 21, 30, 31],
        [2, 3, 13, 14, 22, 32, 33],
        [4, 15, 16, 23, 34, 35],
        [5, 17, 18, 24, 36],
    ]
    out = np.full(sum(out_splits[r]), -1, dtype=inputs[r].dtype)
    mpicomm.all_to_all_single(out, inputs[r], out_splits[r], in_splits[r])
    assert out.tolist() == expected[r]
