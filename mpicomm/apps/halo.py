"""A worked halo exchange: Jacobi steps of the 2-D heat equation on a Cartesian grid of ranks.

The global grid (``ny`` by ``nx`` interior points inside a fixed boundary) is cut into blocks by rows
and columns of ranks. Each rank keeps its block with one layer of ghost cells around it; before every
step the ghost cells are filled from the neighbours, then each rank updates its interior.
:func:`solve` does it with :class:`mpicomm.CartGrid`: ``scatter_blocks`` hands out the blocks with
their layer, ``exchange_halos`` fills the ghosts. :func:`exchange_ghosts` is the same exchange
written by hand, four :func:`mpicomm.sendrecv` calls on the strided edges (what ``exchange_halos``
replaces). :func:`check` compares every rank's block with the same steps on the whole grid in one
process. The demo runs it (``python -m mpicomm demo``); the docs walk through it (docs/halo.rst).
"""

from __future__ import annotations

import numpy as np

import mpicomm

__all__ = [
    "Block",
    "check",
    "check_reference",
    "exchange_ghosts",
    "initial_grid",
    "jacobi",
    "process_grid",
    "solve",
]


def process_grid(size: int) -> tuple[int, int]:
    """Rows and columns of ranks, as square as ``size`` allows (what ``MPI_Dims_create`` gives).

    Example:
        >>> process_grid(8), process_grid(6), process_grid(7)
        ((4, 2), (3, 2), (7, 1))
    """
    rows = int(np.sqrt(size))
    while size % rows:
        rows -= 1
    return size // rows, rows


def _cuts(n: int, parts: int) -> list[int]:
    """Where ``parts`` near-equal pieces of ``n`` start, and ``n`` at the end (``array_split``'s cut)."""
    q, r = divmod(n, parts)
    return [i * q + min(i, r) for i in range(parts + 1)]


class Block:
    """This rank's block of the grid: where it lies and who its four neighbours are (by hand).

    What :class:`mpicomm.CartGrid` works out (``block_slices``, ``neighbors``), written out for the
    hand-written exchange, :func:`exchange_ghosts`; the same cut and the same neighbours.

    Args:
        ny: Interior rows of the whole grid.
        nx: Interior columns of the whole grid.
        rank: This rank in the group.
        size: Ranks in the group.

    Raises:
        ValueError: more rows or columns of ranks than interior rows or columns.
    """

    def __init__(self, ny: int, nx: int, rank: int, size: int) -> None:
        py, px = process_grid(size)
        if py > ny or px > nx:
            raise ValueError(
                f"Block: a {ny}x{nx} grid cannot be cut into {py}x{px} blocks; expected at least "
                f"{py} rows and {px} columns"
            )
        iy, ix = divmod(rank, px)
        ys, xs = _cuts(ny, py), _cuts(nx, px)
        self.rows = slice(ys[iy], ys[iy + 1])  #: interior rows of the whole grid held here
        self.cols = slice(xs[ix], xs[ix + 1])  #: interior columns held here
        # neighbours' ranks; None at the fixed boundary (sendrecv then sends or receives nothing)
        self.up = rank - px if iy > 0 else None
        self.down = rank + px if iy < py - 1 else None
        self.left = rank - 1 if ix > 0 else None
        self.right = rank + 1 if ix < px - 1 else None


def initial_grid(ny: int, nx: int, seed: int = 0) -> np.ndarray:
    """The whole grid with its boundary: a hot top edge (1.0), cold other edges, random interior."""
    u = np.zeros((ny + 2, nx + 2))
    u[1:-1, 1:-1] = np.random.default_rng(seed).random((ny, nx))
    u[0, :] = 1.0
    return u


def jacobi(u: np.ndarray) -> None:
    """One Jacobi step of the heat equation on the interior of ``u`` (ghosts or boundary around it)."""
    u[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:])


def exchange_ghosts(u: np.ndarray, block: Block, group: mpicomm.ProcessGroup | None = None) -> None:
    """Fill ``u``'s ghost layer with the neighbours' edges by hand: four ``sendrecv`` calls.

    Each call sends one edge one way and receives the opposite ghost edge from the other way, so no
    rank waits for another in a cycle. The columns are strided views, sent and received in place.
    The corners are left as they are (a 5-point stencil does not read them);
    :meth:`mpicomm.CartGrid.exchange_halos` does all of it, corners too, in one call.

    Args:
        u: This rank's block with one ghost layer, shape ``(rows + 2, cols + 2)``.
        block: Where the block lies and its neighbours.
        group: The process group; ``None`` for the world.
    """
    b = block
    mpicomm.sendrecv(u[1:-1, -2], u[1:-1, 0], dst=b.right, src=b.left, group=group, tag=1)  # east
    mpicomm.sendrecv(u[1:-1, 1], u[1:-1, -1], dst=b.left, src=b.right, group=group, tag=2)  # west
    mpicomm.sendrecv(u[-2, 1:-1], u[0, 1:-1], dst=b.down, src=b.up, group=group, tag=3)  # south
    mpicomm.sendrecv(u[1, 1:-1], u[-1, 1:-1], dst=b.up, src=b.down, group=group, tag=4)  # north


def solve(ny: int, nx: int, steps: int, seed: int = 0) -> tuple[tuple[slice, ...], np.ndarray]:
    """Run ``steps`` Jacobi steps on the world's ranks; return where this rank's block lies and its interior.

    Rank 0 builds the whole grid; ``scatter_blocks`` gives every rank its block with one layer around
    it (the neighbours' cells, or the fixed boundary at the grid's edges); then each step fills the
    ghost layer with ``exchange_halos`` and updates the interior.

    Args:
        ny: Interior rows of the whole grid.
        nx: Interior columns of the whole grid.
        steps: Jacobi steps.
        seed: Seed of the random initial interior.

    Returns:
        The slices of the whole interior that this rank holds, and its ``(rows, cols)`` interior after
        the steps.

    Example:
        >>> where, mine = solve(8, 6, steps=3)
        >>> np.array_equal(mine, check_reference(8, 6, 3)[where])
        True
    """
    grid = mpicomm.CartGrid((0, 0), periodic=False)  # as square as the world allows: 8 ranks, 4 x 2
    whole = initial_grid(ny, nx, seed) if grid.group.rank() == 0 else None
    u = grid.scatter_blocks(whole, width=1)  # the block and one layer around it
    for _ in range(steps):
        grid.exchange_halos(u)
        jacobi(u)
    return grid.block_slices((ny, nx)), u[1:-1, 1:-1]


def check_reference(ny: int, nx: int, steps: int, seed: int = 0) -> np.ndarray:
    """The interior after ``steps`` Jacobi steps of the whole grid in one process."""
    u = initial_grid(ny, nx, seed)
    for _ in range(steps):
        jacobi(u)
    return u[1:-1, 1:-1]


def check(ny: int = 24, nx: int = 32, steps: int = 50, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Solve on all ranks and return this rank's block and the single-process answer for it.

    The same arithmetic in the same order on every point, so the two are equal bit for bit.

    Example:
        >>> mine, want = check(12, 10, steps=5)
        >>> np.array_equal(mine, want)
        True
    """
    where, mine = solve(ny, nx, steps, seed)
    return mine, check_reference(ny, nx, steps, seed)[where]
