"""mpicomm.CartGrid: its shape and neighbours, and exchange_halos against a serial box stencil.

Every rank builds the whole grid from one seed, takes its block with its ghost layers, runs steps of
a box stencil (corners read: a wrong or missing corner changes the answer) with ``exchange_halos``
before each, and compares its block bit for bit with the same steps on the whole grid in one
process (tests/mpi/gridref.py). Size-agnostic: 1, 2, 3, 4 and 8 ranks.
"""

from __future__ import annotations

from typing import Any

import gridref
import numpy as np
import pytest
from mpi4py import MPI

import mpicomm

pytestmark = pytest.mark.mpi

#: Interior shapes per number of axes: uneven cuts at every size up to 8 ranks, and room for width 2.
SHAPES = {1: (37,), 2: (19, 13), 3: (9, 11, 7)}
PERIODIC = {"periodic": True, "fixed": False, "mixed": None}


def _periodic(kind: str, nd: int) -> tuple[bool, ...]:
    flag = PERIODIC[kind]
    return tuple(a % 2 == 0 for a in range(nd)) if flag is None else (flag,) * nd


def _run(
    grid: mpicomm.CartGrid, shape: tuple[int, ...], width: int, steps: int, seed: int, layout: str = "C"
) -> tuple[np.ndarray, tuple[slice, ...]]:
    """This rank's block after ``steps`` steps, and where it lies in the whole grid (frame included)."""
    whole = gridref.initial(shape, width, seed)
    where = grid.block_slices(whole.shape, width=width)
    u = _laid_out(whole[where], layout)
    for _ in range(steps):
        grid.exchange_halos(u, width=width)
        gridref.step(u, width)
    return u, where


def _laid_out(block: np.ndarray, layout: str) -> np.ndarray:
    """``block`` copied into an array of the given layout: C order, Fortran order, or a strided view."""
    if layout == "F":
        return np.asfortranarray(block)
    if layout == "view":  # every other element of a larger array, along every axis
        big = np.full(tuple(2 * n + 1 for n in block.shape), np.nan)
        u = big[tuple(slice(1, None, 2) for _ in block.shape)]
        u[...] = block
        return u
    return block.copy()


def _check(
    grid: mpicomm.CartGrid, shape: tuple[int, ...], width: int, periodic: tuple[bool, ...], **kw: Any
) -> None:
    steps, seed = 3, 44 + len(shape)
    u, where = _run(grid, shape, width, steps, seed, **kw)
    want = gridref.serial(shape, width, periodic, steps, seed)[where]
    inner = tuple(slice(width, n - width) for n in u.shape)
    np.testing.assert_array_equal(u[inner], want[inner])


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("kind", list(PERIODIC))
@pytest.mark.parametrize("width", [1, 2])
def test_box_stencil_blocks_equal_the_serial_stencil_bitwise(nd: int, kind: str, width: int) -> None:
    periodic = _periodic(kind, nd)
    grid = mpicomm.CartGrid((0,) * nd, periodic=periodic)
    _check(grid, SHAPES[nd], width, periodic)


@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("layout", ["F", "view"])
def test_blocks_of_any_layout_exchange_in_place(nd: int, layout: str) -> None:
    periodic = _periodic("mixed", nd)
    grid = mpicomm.CartGrid((0,) * nd, periodic=periodic)
    _check(grid, SHAPES[nd], 1, periodic, layout=layout)


@pytest.mark.parametrize("dims", [(0, 1), (1, 0)])
@pytest.mark.parametrize("kind", ["periodic", "fixed"])
def test_all_ranks_along_one_axis_and_one_rank_wide_on_the_other(dims: tuple[int, int], kind: str) -> None:
    periodic = _periodic(kind, 2)
    grid = mpicomm.CartGrid(dims, periodic=periodic)
    assert grid.dims[dims.index(1)] == 1
    _check(grid, (17, 19), 2, periodic)


def test_torch_cpu_tensors_are_exchanged_in_place() -> None:
    torch = pytest.importorskip("torch")
    periodic = (True, False)
    grid = mpicomm.CartGrid((0, 0), periodic=periodic)
    shape, width, seed = SHAPES[2], 1, 7
    whole = gridref.initial(shape, width, seed)
    where = grid.block_slices(whole.shape, width=width)
    t = torch.from_numpy(whole[where].copy())
    for _ in range(3):
        assert grid.exchange_halos(t, width=width) is None
        gridref.step(t.numpy(), width)
    want = gridref.serial(shape, width, periodic, 3, seed)[where]
    np.testing.assert_array_equal(t.numpy()[1:-1, 1:-1], want[1:-1, 1:-1])


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_async_op_returns_a_completed_work_over_the_callers_array(kind: str) -> None:
    grid = mpicomm.CartGrid((0, 0), periodic=True)
    whole = gridref.initial(SHAPES[2], 1, 5)
    where = grid.block_slices(whole.shape, width=1)
    u: Any = whole[where].copy()
    if kind == "torch":
        u = pytest.importorskip("torch").from_numpy(u)
    work = grid.exchange_halos(u, async_op=True)
    assert isinstance(work, mpicomm.Work) and work.is_completed()
    assert work.result()[0] is u
    got = u.numpy() if kind == "torch" else u
    gridref.wrap(whole, 1, (True, True))
    np.testing.assert_array_equal(got, whole[where])  # every ghost, corners too, is the whole grid's cell


def test_dims_are_filled_as_mpi_dims_create_fills_them() -> None:
    size = mpicomm.get_world_size()
    for dims in [(0,), (0, 0), (0, 0, 0), (0, 1), (1, 0), (size, 1), (0, 1, 0)]:
        grid = mpicomm.CartGrid(dims)
        assert grid.dims == tuple(MPI.Compute_dims(size, list(dims))), dims
        assert grid.ndim == len(dims)
        assert grid.group.size() == size and grid.group.rank() == mpicomm.get_rank()
        mpicomm.destroy_process_group(grid.group)


@pytest.mark.parametrize("periodic", [True, False, (True, False, True)])
def test_coords_and_neighbors_match_mpi4pys_cartcomm(periodic: Any) -> None:
    grid = mpicomm.CartGrid((0, 0, 0), periodic=periodic)
    theirs = MPI.COMM_WORLD.Create_cart(list(grid.dims), [bool(p) for p in grid.periodic], reorder=False)
    try:
        assert grid.coords == tuple(theirs.Get_coords(MPI.COMM_WORLD.Get_rank()))
        for axis in range(3):
            lo, hi = theirs.Shift(axis, 1)
            null = MPI.PROC_NULL
            assert grid.neighbors(axis) == (None if lo == null else lo, None if hi == null else hi)
            assert grid.neighbors(axis - 3) == grid.neighbors(axis)
    finally:
        theirs.Free()
    assert isinstance(grid.group.comm, MPI.Cartcomm)


def test_grid_group_takes_every_mpicomm_call() -> None:
    grid = mpicomm.CartGrid((0, 0), periodic=True)
    x = np.ones(3)
    mpicomm.all_reduce(x, group=grid.group)
    assert (x == mpicomm.get_world_size()).all()
    lower, upper = grid.neighbors(0)
    got = np.full(1, -1.0)
    mpicomm.sendrecv(np.array([float(mpicomm.get_rank())]), got, dst=upper, src=lower, group=grid.group)
    assert got[0] == lower


def test_a_grid_over_a_subgroup_has_the_subgroups_world_ranks() -> None:
    size, rank = mpicomm.get_world_size(), mpicomm.get_rank()
    evens = mpicomm.new_group(range(0, size, 2))
    if not evens.is_member:
        return
    grid = mpicomm.CartGrid((0,), periodic=True, group=evens)
    lower, upper = grid.neighbors(0)
    members = list(range(0, size, 2))
    i = members.index(rank)
    assert (lower, upper) == (members[i - 1], members[(i + 1) % len(members)])
    u = np.zeros(5)
    u[1:-1] = rank
    grid.exchange_halos(u)
    assert (u[0], u[-1]) == (lower, upper)


def test_a_destroyed_grid_raises_a_group_error() -> None:
    grid = mpicomm.CartGrid((0,))
    mpicomm.destroy_process_group(grid.group)
    with pytest.raises(mpicomm.GroupError, match=r"^CartGrid.exchange_halos: group \w+ was destroyed"):
        grid.exchange_halos(np.zeros(5))


@pytest.mark.parametrize("nd", [2, 3])
def test_strided_faces_packed_instead_of_typed_give_the_same_blocks(
    nd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mpicomm.dense import cart

    monkeypatch.setattr(cart, "TYPE_LIMIT", 0)  # every strided face through a kept buffer
    periodic = _periodic("mixed", nd)
    grid = mpicomm.CartGrid((0,) * nd, periodic=periodic)
    _check(grid, SHAPES[nd], 2, periodic)
    steps = next(iter(grid._geo.plans.values()))
    if grid.dims[-1] > 1:  # the last axis' faces are strided, and travel between ranks
        assert any(isinstance(s, cart._Message) and s.outbox is not None for s in steps)
