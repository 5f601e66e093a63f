"""The halo-exchange example (mpicomm.apps.halo): Jacobi steps on a Cartesian grid of ranks.

Every rank's block must equal, bit for bit, the same steps of the whole grid in one process (the same
arithmetic in the same order), at any world size whose process grid fits the grid.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpicomm
from mpicomm.apps import halo


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize(("ny", "nx", "steps"), [(24, 32, 50), (9, 7, 13), (8, 8, 1)])
def test_jacobi_blocks_match_the_single_process_solution(world, ny, nx, steps):
    mine, want = halo.check(ny, nx, steps=steps, seed=ny * nx)
    np.testing.assert_array_equal(mine, want)
    # the blocks tile the grid: their sizes add up to the whole interior on every world size
    sizes = np.array([mine.size])
    mpicomm.all_reduce(sizes)
    assert sizes[0] == ny * nx


@pytest.mark.mpi(min_size=1)
def test_blocks_and_neighbours_form_a_cartesian_grid(world):
    w, r = world.size(), world.rank()
    py, px = halo.process_grid(w)
    assert py * px == w and py >= px
    b = halo.Block(16, 16, r, w)
    # a neighbour's opposite neighbour is this rank
    for there, back in (("up", "down"), ("down", "up"), ("left", "right"), ("right", "left")):
        peer = getattr(b, there)
        if peer is not None:
            assert getattr(halo.Block(16, 16, peer, w), back) == r


@pytest.mark.mpi(min_size=1)
def test_ghost_exchange_fills_ghosts_from_neighbours_edges(world):
    w, r = world.size(), world.rank()
    b = halo.Block(8, 12, r, w)
    rows, cols = b.rows.stop - b.rows.start, b.cols.stop - b.cols.start
    u = np.full((rows + 2, cols + 2), -1.0)
    u[1:-1, 1:-1] = r
    halo.exchange_ghosts(u, b)
    for side, ghost in (
        ("left", u[1:-1, 0]),
        ("right", u[1:-1, -1]),
        ("up", u[0, 1:-1]),
        ("down", u[-1, 1:-1]),
    ):
        peer = getattr(b, side)
        assert (ghost == (-1.0 if peer is None else peer)).all(), side
    assert (u[[0, 0, -1, -1], [0, -1, 0, -1]] == -1.0).all()  # corners: not part of a 5-point stencil


def test_a_grid_smaller_than_the_process_grid_is_refused():
    with pytest.raises(ValueError, match=r"^Block: a 2x2 grid cannot be cut into 4x2 blocks"):
        halo.Block(2, 2, 0, 8)
