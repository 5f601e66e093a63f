"""CartGrid.scatter_blocks and gather_blocks: uneven blocks, ghost widths, every root, torch and numpy.

Every rank builds the global array from one seed; the block each rank gets must be its
``numpy.array_split`` share (with its ghost layers), and gathering the blocks must give the global
array back, bit for bit. Then a whole run: scatter, steps of a box stencil with exchange_halos,
gather, against the serial stencil. Size-agnostic: 1, 2, 3, 4 and 8 ranks.
"""

from __future__ import annotations

from typing import Any

import gridref
import numpy as np
import pytest

import mpicomm

pytestmark = pytest.mark.mpi


def _split_share(whole: np.ndarray, dims: tuple[int, ...], coords: tuple[int, ...], width: int) -> np.ndarray:
    """The share of ``whole`` at ``coords``, by ``numpy.array_split`` of its interior along every axis."""
    w = width
    inner = tuple(n - 2 * w for n in whole.shape)
    cells = [np.array_split(np.arange(n), d)[c] for n, d, c in zip(inner, dims, coords, strict=True)]
    lo = [int(c[0]) for c in cells]
    hi = [int(c[-1]) + 1 + 2 * w for c in cells]
    return whole[tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))]


@pytest.mark.parametrize("shape", [(23,), (9, 10), (8, 9, 10)])
@pytest.mark.parametrize("width", [0, 1])
def test_scatter_gives_each_rank_its_array_split_share_and_gather_puts_them_back(
    shape: tuple[int, ...], width: int
) -> None:
    size, rank = mpicomm.get_world_size(), mpicomm.get_rank()
    grid = mpicomm.CartGrid((0,) * len(shape))
    whole = gridref.initial(shape, width, 3)
    root = size - 1
    mine = grid.scatter_blocks(whole if rank == root else None, src=root, width=width)
    np.testing.assert_array_equal(mine, _split_share(whole, grid.dims, grid.coords, width))
    back = grid.gather_blocks(mine, dst=root, width=width)
    if rank == root:
        inner = tuple(slice(width, n - width) for n in whole.shape)
        np.testing.assert_array_equal(back, whole[inner])
    else:
        assert back is None


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_out_arrays_of_any_layout_and_kind_are_written_in_place(kind: str) -> None:
    rank = mpicomm.get_rank()
    grid = mpicomm.CartGrid((0, 0))
    whole = gridref.initial((11, 9), 1, 8)
    where = grid.block_slices(whole.shape, width=1)
    block_shape = tuple(s.stop - s.start for s in where)
    out: Any = np.asfortranarray(np.zeros(block_shape))
    full: Any = np.zeros((11, 9))[:, ::-1]  # a strided view, written through
    if kind == "torch":
        torch = pytest.importorskip("torch")
        out, full = torch.zeros(block_shape).double(), torch.zeros((9, 11)).double().T
    got = grid.scatter_blocks(whole if rank == 0 else None, width=1, out=out)
    assert got is out
    np.testing.assert_array_equal(np.asarray(out), whole[where])
    back = grid.gather_blocks(out, width=1, out=full)
    if rank == 0:
        assert back is full
        np.testing.assert_array_equal(np.asarray(full), whole[1:-1, 1:-1])
    else:
        assert back is None


@pytest.mark.parametrize("periodic", [True, False])
def test_scatter_step_gather_equals_the_serial_stencil(periodic: bool) -> None:
    rank = mpicomm.get_rank()
    grid = mpicomm.CartGrid((0, 0), periodic=periodic)
    shape, width, steps = (21, 18), 2, 4
    whole = gridref.initial(shape, width, 11)
    u = grid.scatter_blocks(whole if rank == 0 else None, width=width)
    for _ in range(steps):
        grid.exchange_halos(u, width=width)
        gridref.step(u, width)
    got = grid.gather_blocks(u, width=width)
    if rank == 0:
        want = gridref.serial(shape, width, (periodic, periodic), steps, 11)
        np.testing.assert_array_equal(got, want[width:-width, width:-width])


def test_integer_and_complex_dtypes_travel_unchanged() -> None:
    rank = mpicomm.get_rank()
    grid = mpicomm.CartGrid((0,))
    for dtype in (np.int16, np.complex128, np.uint8):
        whole = (np.arange(40) * 7).astype(dtype)
        mine = grid.scatter_blocks(whole if rank == 0 else None)
        assert mine.dtype == dtype
        back = grid.gather_blocks(mine)
        if rank == 0:
            assert back.dtype == dtype
            np.testing.assert_array_equal(back, whole)
