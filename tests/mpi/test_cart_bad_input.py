"""CartGrid's bad input: each raises an error naming the call, the argument, what was expected and what came.

Every rank passes the same mistake (so each raises before any message moves), except where a test
says one rank alone is wrong: then every rank raises, with the same message, and none waits.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpicomm
from mpicomm import ArgumentError, ArgumentTypeError, CrossRankMismatchError

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def grid() -> mpicomm.CartGrid:
    return mpicomm.CartGrid((0, 0), periodic=True)


def test_dims_whose_product_is_not_the_group_size_are_refused() -> None:
    size = mpicomm.get_world_size()
    with pytest.raises(
        ArgumentError,
        match=rf"^CartGrid: dims is \(3, 5\), 15 ranks; expected a product equal to the group size {size}",
    ):
        mpicomm.CartGrid((3, 5))
    with pytest.raises(
        ArgumentError,
        match=rf"^CartGrid: dims is \(0, 16\), whose nonzero entries multiply to 16; expected a divisor of "
        rf"the group size {size}",
    ):
        mpicomm.CartGrid([0, 16])


@pytest.mark.parametrize(
    ("dims", "kind", "text"),
    [
        ("ab", ArgumentTypeError, r"^CartGrid: dims is 'ab'; expected a list or tuple of ints"),
        ((0, 1.5), ArgumentTypeError, r"^CartGrid: dims is \(0, 1.5\); expected a list or tuple of ints"),
        ((0, True), ArgumentTypeError, r"^CartGrid: dims is \(0, True\); expected a list or tuple of ints"),
        ((), ArgumentError, r"^CartGrid: dims is \(\); expected at least one axis"),
        ((0, -1), ArgumentError, r"^CartGrid: dims is \(0, -1\); expected entries >= 0"),
    ],
)
def test_dims_of_the_wrong_kind_are_refused(dims: object, kind: type, text: str) -> None:
    with pytest.raises(kind, match=text):
        mpicomm.CartGrid(dims)


def test_periodic_of_the_wrong_kind_or_length_is_refused() -> None:
    with pytest.raises(ArgumentTypeError, match=r"^CartGrid: periodic is 1; expected a bool or a list"):
        mpicomm.CartGrid((0, 0), periodic=1)
    with pytest.raises(ArgumentError, match=r"^CartGrid: periodic has 3 entries; expected 2, one per axis"):
        mpicomm.CartGrid((0, 0), periodic=(True, False, True))


def test_ranks_that_pass_different_dims_raise_together() -> None:
    size = mpicomm.get_world_size()
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    dims = (0, 1) if mpicomm.get_rank() == 0 else (1, 0)
    with pytest.raises(CrossRankMismatchError, match=r"^CartGrid: the ranks passed different arguments"):
        mpicomm.CartGrid(dims)


def test_one_rank_with_bad_dims_makes_every_rank_raise_its_error() -> None:
    dims = (3, 5) if mpicomm.get_rank() == 0 else (0, 0)
    with pytest.raises(ArgumentError, match=r"CartGrid: dims is \(3, 5\), 15 ranks"):
        mpicomm.CartGrid(dims)


def test_a_width_larger_than_the_block_is_refused(grid: mpicomm.CartGrid) -> None:
    u = np.zeros((5, 9))
    with pytest.raises(
        ArgumentError,
        match=r"^CartGrid.exchange_halos: width is 2, more than the block's 1 interior cells along axis 0 "
        r"\(u has shape \(5, 9\)\); expected at least width interior cells on every axis "
        r"\(each axis >= 3 \* width = 6\)",
    ):
        grid.exchange_halos(u, width=2)


@pytest.mark.parametrize(
    ("width", "kind", "text"),
    [
        (0, ArgumentError, r"^CartGrid.exchange_halos: width is 0; expected an int >= 1"),
        (-1, ArgumentError, r"^CartGrid.exchange_halos: width is -1; expected an int >= 1"),
        ("1", ArgumentTypeError, r"^CartGrid.exchange_halos: width is '1'; expected an int"),
        (1.0, ArgumentTypeError, r"^CartGrid.exchange_halos: width is 1.0; expected an int"),
    ],
)
def test_a_width_that_is_no_positive_int_is_refused(
    grid: mpicomm.CartGrid, width: object, kind: type, text: str
) -> None:
    with pytest.raises(kind, match=text):
        grid.exchange_halos(np.zeros((6, 6)), width=width)  # type: ignore[arg-type]


def test_a_block_of_another_number_of_axes_is_refused(grid: mpicomm.CartGrid) -> None:
    with pytest.raises(
        ArgumentError,
        match=r"^CartGrid.exchange_halos: u has 3 axes \(shape \(4, 4, 4\)\); expected 2, one per axis",
    ):
        grid.exchange_halos(np.zeros((4, 4, 4)))


def test_read_only_and_non_array_blocks_are_refused(grid: mpicomm.CartGrid) -> None:
    u = np.zeros((6, 6))
    u.flags.writeable = False
    with pytest.raises(
        ArgumentError, match=r"^CartGrid.exchange_halos: u is read-only; expected a writeable array"
    ):
        grid.exchange_halos(u)
    with pytest.raises(
        ArgumentTypeError, match=r"^CartGrid.exchange_halos: u is a builtins.list; expected a numpy"
    ):
        grid.exchange_halos([[0.0] * 6] * 6)
    with pytest.raises(ArgumentTypeError, match=r"^exchange_halos: async_op is 1; expected True or False"):
        grid.exchange_halos(np.zeros((6, 6)), async_op=1)  # type: ignore[arg-type]


def test_bad_axes_of_neighbors_are_refused(grid: mpicomm.CartGrid) -> None:
    with pytest.raises(ArgumentError, match=r"^CartGrid.neighbors: axis is 2; expected 0 <= axis < 2"):
        grid.neighbors(2)
    with pytest.raises(ArgumentTypeError, match=r"^CartGrid.neighbors: axis is 'x'; expected an int"):
        grid.neighbors("x")  # type: ignore[arg-type]


def test_scatter_of_a_global_array_of_another_number_of_axes_raises_on_every_rank(
    grid: mpicomm.CartGrid,
) -> None:
    whole = np.zeros(40) if mpicomm.get_rank() == 0 else None
    text = (
        r"^CartGrid.scatter_blocks: global_array has 1 axes \(shape \(40,\)\); expected 2"
        if mpicomm.get_rank() == 0
        else (r"^CartGrid.scatter_blocks: world rank 0 refused its arguments")
    )
    with pytest.raises(ArgumentError, match=text):
        grid.scatter_blocks(whole)


def test_scatter_into_an_out_of_the_wrong_shape_on_one_rank_raises_on_every_rank(
    grid: mpicomm.CartGrid,
) -> None:
    rank = mpicomm.get_rank()
    whole = np.zeros((20, 20))
    shape = tuple(s.stop - s.start for s in grid.block_slices(whole.shape))
    out = np.zeros((shape[0] + 1, shape[1]) if rank == 0 else shape)
    first = [np.array_split(np.arange(20), d)[0].size for d in grid.dims]  # rank 0's block
    text = (
        rf"^CartGrid.scatter_blocks: out has shape \({first[0] + 1}, {first[1]}\) on world rank 0; "
        rf"expected \({first[0]}, {first[1]}\)"
    )
    with pytest.raises(ArgumentError, match=text):
        grid.scatter_blocks(whole if rank == 0 else None, out=out)


def test_gather_of_blocks_that_are_no_array_split_shares_raises_on_every_rank(grid: mpicomm.CartGrid) -> None:
    rank, size = mpicomm.get_rank(), mpicomm.get_world_size()
    if size == 1:
        pytest.skip("a single block is always its own share")
    where = grid.block_slices((20, 20))
    shape = [s.stop - s.start for s in where]
    shape[0] += 3 * (rank == 0)  # rank 0's block three rows longer than its share of any whole
    with pytest.raises(
        ArgumentError,
        match=r"^CartGrid.gather_blocks: local has shape .* on world rank \d+ \(width 0\); expected",
    ):
        grid.gather_blocks(np.zeros(shape))


def test_ranks_that_name_different_roots_raise_together(grid: mpicomm.CartGrid) -> None:
    if mpicomm.get_world_size() == 1:
        pytest.skip("needs two ranks to disagree")
    where = grid.block_slices((20, 20))
    mine = np.zeros(tuple(s.stop - s.start for s in where))
    with pytest.raises(
        CrossRankMismatchError,
        match=r"^CartGrid.gather_blocks: the ranks passed different dst \(rank 0: 0, rank 1: 1",
    ):
        grid.gather_blocks(mine, dst=mpicomm.get_rank())


def test_a_block_whose_elements_share_memory_is_refused(grid: mpicomm.CartGrid) -> None:
    u = np.lib.stride_tricks.as_strided(np.zeros(12), shape=(6, 6), strides=(8, 8), writeable=True)
    with pytest.raises(ArgumentError, match=r"^CartGrid.exchange_halos: u has strides \(8, 8\) for shape"):
        grid.exchange_halos(u)


def test_neighbours_blocks_of_different_sizes_raise_a_communication_error() -> None:
    size, rank = mpicomm.get_world_size(), mpicomm.get_rank()
    if size == 1:
        pytest.skip("needs a neighbour")
    line = mpicomm.CartGrid((0,), periodic=True)
    u = np.zeros(5 + 3 * (rank == 0))  # a 1-D face is one element whatever the length: equal
    line.exchange_halos(u)
    grid = mpicomm.CartGrid((0, 1), periodic=(True, False))
    cols = 6 if rank % 2 == 0 else 5  # faces along axis 0 differ in length between neighbours
    u = np.zeros((4, cols))
    if size % 2 == 0:
        # every rank's lower neighbour sends a face of another size: shorter ones are reported, longer
        # ones truncated by MPI
        with pytest.raises(
            mpicomm.CommunicationError,
            match=r"^CartGrid.exchange_halos: a ghost layer along axis 0 was sent (5|more .*) elements by "
            r"world rank \d+; expected [56] \(u has shape \(4, [56]\) here\): neighbours' blocks must",
        ):
            grid.exchange_halos(u)


def test_an_out_of_another_dtype_on_one_rank_raises_on_every_rank(grid: mpicomm.CartGrid) -> None:
    rank = mpicomm.get_rank()
    shape = tuple(s.stop - s.start for s in grid.block_slices((20, 20)))
    out = np.zeros(shape, np.float32 if rank == 0 else np.float64)
    with pytest.raises(
        mpicomm.DtypeMismatchError,
        match=r"^CartGrid.scatter_blocks: out has dtype float32 on world rank 0; expected float64, glob",
    ):
        grid.scatter_blocks(np.zeros((20, 20)) if rank == 0 else None, out=out)
    whole = np.zeros((20, 20), np.int64) if rank == 0 else None
    with pytest.raises(
        mpicomm.DtypeMismatchError,
        match=r"^CartGrid.gather_blocks: out has dtype int64 on world rank 0; expected float64, the blocks'",
    ):
        grid.gather_blocks(np.zeros(shape), out=whole)
