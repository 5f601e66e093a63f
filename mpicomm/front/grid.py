"""``CartGrid``: a Cartesian grid of ranks whose calls fill ghost layers, and cut and join global arrays.

The data paths are :mod:`mpicomm.dense.cart` (the grid, the halo exchange) and
:mod:`mpicomm.dense.blocks` (scatter and gather of blocks); each call goes through the front door
(:func:`~mpicomm.front.door.front_door`), so numpy arrays, torch CPU tensors and cupy arrays (staged
through host memory) are taken alike, and the watchdog bounds each call by the grid's group timeout.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.groups import ProcessGroup
from ..core.work import Work
from ..dense import blocks, cart
from ..errors import ArgumentError, ArgumentTypeError
from .door import BOTH, READ, front_door

__all__ = ["CartGrid"]

_exchange = front_door("exchange_halos", {"u": BOTH}, validated=False)(cart.exchange_halos)
# ``out`` is copied down as well as up where it is staged: a rank that does not write it keeps its values
_scatter = front_door("scatter_blocks", {"global_array": READ, "out": BOTH}, validated=False)(
    blocks.scatter_blocks
)
_gather = front_door("gather_blocks", {"local": READ, "out": BOTH}, validated=False)(blocks.gather_blocks)


class CartGrid:
    """A Cartesian grid of the ranks of a group, as PETSc's DMDA or mpi4py's ``Create_cart`` makes one.

    Every member of ``group`` makes it, with the same arguments (a collective call). Grid rank r is
    group rank r (no reordering); coordinates are row-major, as MPI's. The grid has its own
    communicator, an ``mpi4py.MPI.Cartcomm`` (``grid.group.comm``), so its messages never meet
    another group's.

    Each rank holds a block: its share of a global array, cut along every axis as
    ``numpy.array_split`` cuts (the first ``n % dims[a]`` blocks along axis ``a`` hold one more cell),
    usually with ``width`` ghost layers on every side. :meth:`exchange_halos` fills the ghost layers
    from the neighbours, corners included; :meth:`scatter_blocks` and :meth:`gather_blocks` move
    blocks between one rank's global array and every rank.

    Args:
        dims: Ranks along each axis; a 0 is filled as ``MPI_Dims_create`` fills it (as square as the
            group size allows; ``(0, 0)`` on 8 ranks gives ``(4, 2)``).
        periodic: Whether the grid wraps around: one bool for every axis, or one per axis.
        group: The ranks of the grid; ``None`` for the world.

    Raises:
        ArgumentTypeError: ``dims`` is not a list of ints, or ``periodic`` not bools.
        ArgumentError: ``dims`` whose product is not the group size (or whose nonzero entries do not
            divide it), negative entries, or ``periodic`` of another length.
        CrossRankMismatchError: the ranks passed different ``dims`` or ``periodic``.
        GroupError: this rank is not a member of ``group``.

    Example:
        >>> import numpy as np, mpicomm
        >>> grid = mpicomm.CartGrid((0, 0), periodic=True)
        >>> int(np.prod(grid.dims)) == mpicomm.get_world_size(), len(grid.coords)
        (True, 2)
    """

    __slots__ = ("_geo",)

    def __init__(self, dims: Any, periodic: Any = False, group: ProcessGroup | None = None) -> None:
        self._geo = cart.make(dims, periodic, group, "CartGrid")

    @property
    def dims(self) -> tuple[int, ...]:
        """Ranks along each axis, zeros filled."""
        return self._geo.dims

    @property
    def periodic(self) -> tuple[bool, ...]:
        """Whether each axis wraps around."""
        return self._geo.periodic

    @property
    def coords(self) -> tuple[int, ...]:
        """This rank's coordinates in the grid."""
        return self._geo.coords

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self._geo.dims)

    @property
    def group(self) -> ProcessGroup:
        """The grid's own process group, for ``group=`` of any mpicomm call (``group.comm``, a Cartcomm)."""
        return self._geo.group

    def neighbors(self, axis: int) -> tuple[int | None, int | None]:
        """The world ranks of this rank's neighbours along ``axis``: ``(lower, upper)``.

        ``None`` where there is none (the edge of a non-periodic axis), which :func:`mpicomm.sendrecv`
        takes as "no peer". A periodic axis one rank wide gives this rank itself on both sides.

        Raises:
            ArgumentTypeError: ``axis`` is not an int.
            ArgumentError: ``axis`` is out of range.

        Example:
            >>> import mpicomm
            >>> grid = mpicomm.CartGrid((0,), periodic=False)
            >>> lower, upper = grid.neighbors(0)
            >>> lower == (None if grid.coords[0] == 0 else mpicomm.get_rank() - 1)
            True
        """
        a = self._axis(axis, "CartGrid.neighbors")
        geo = self._geo
        ranks = geo.group.ranks
        lo, hi = geo.lower[a], geo.upper[a]
        return (None if lo == geo.null else ranks[lo]), (None if hi == geo.null else ranks[hi])

    def block_slices(self, shape: Any, width: int = 0) -> tuple[slice, ...]:
        """The part of a global array of ``shape`` that this rank's block holds (``array_split``'s cut).

        Args:
            shape: The global array's shape; with ``width``, including a frame of ``width`` layers
                around the part that is cut.
            width: Ghost layers the block carries on each side.

        Returns:
            One slice per axis, into the global array.

        Raises:
            ArgumentTypeError: ``shape`` is not a sequence of ints.
            ArgumentError: ``shape`` has another number of axes than the grid, or an axis shorter than
                the grid's ranks along it.

        Example:
            >>> import mpicomm
            >>> grid = mpicomm.CartGrid((1,))
            >>> grid.block_slices((10,)), grid.block_slices((12,), width=1)
            ((slice(0, 10, None),), (slice(0, 12, None),))
        """
        fn = "CartGrid.block_slices"
        if not isinstance(shape, (list, tuple)) or not all(
            isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in shape
        ):
            raise ArgumentTypeError(f"{fn}: shape is {shape!r}; expected a tuple of ints")
        w = blocks._check_width(width, fn)
        if len(shape) != self.ndim or any(n - 2 * w < d for n, d in zip(shape, self.dims, strict=True)):
            raise ArgumentError(
                f"{fn}: shape is {tuple(shape)} (width {w}); expected {self.ndim} axes, each at least "
                f"as long as the grid's ranks along it {self.dims} plus 2 * width"
            )
        return blocks.block_slices(self._geo, tuple(int(n) for n in shape), self.coords, w)

    def exchange_halos(self, u: Any, width: int = 1, async_op: bool = False) -> Work | None:
        """Fill the ghost layers of ``u`` on every axis from the neighbours' blocks, corners included.

        ``u`` is this rank's block with ``width`` ghost layers on every side of every axis: its
        interior is ``u[w:-w, w:-w, ...]``. The ghost layers are filled axis by axis (PETSc's box
        stencil): the last axis first, then each earlier one with faces that span the ghost layers
        already filled, so that the corners (a 9-point stencil's diagonal neighbours) arrive too. At
        the edges of a non-periodic axis the ghost layers are left as they are (a fixed boundary).

        ========  ===================================  =======================================
        rank      sends (one axis)                     receives
        ========  ===================================  =======================================
        any       ``u[w:2w]`` down, ``u[-2w:-w]`` up   ``u[-w:]`` from above, ``u[:w]`` from below
        ========  ===================================  =======================================

        Contiguous faces (whole rows of a C-ordered block) travel in place; strided ones (columns)
        through an MPI subarray datatype (up to 16 KiB, of a C-contiguous block) or a buffer the grid
        keeps per layout, whichever MPICH moves faster. Every dtype, any strides (a view of a larger
        array), numpy arrays, torch CPU tensors and cupy arrays are taken. Neighbours' blocks must
        have the same sizes along the axes they share (the grid's cut, :meth:`block_slices`).

        Args:
            u: This rank's block with its ghost layers, written in place.
            width: Ghost layers on each side (the stencil's reach).
            async_op: Return a :class:`~mpicomm.Work`. It comes back completed: the exchange runs
                before the call returns (its axes depend on each other through the corners).

        Returns:
            A completed Work with ``async_op``, else None.

        Raises:
            ArgumentTypeError: ``u`` is not an array, or ``width`` not an int.
            ArgumentError: ``u`` read-only, of another number of axes than the grid, or with fewer
                than ``width`` interior cells along an axis.
            CommunicationError: a neighbour's face had another size than this rank's ghost layer.

        Example:
            >>> import numpy as np, mpicomm
            >>> grid = mpicomm.CartGrid((1, 1), periodic=True)  # one rank: its own neighbour
            >>> u = np.zeros((4, 5))
            >>> u[1:-1, 1:-1] = np.arange(6.0).reshape(2, 3)
            >>> grid.exchange_halos(u)
            >>> u
            array([[5., 3., 4., 5., 3.],
                   [2., 0., 1., 2., 0.],
                   [5., 3., 4., 5., 3.],
                   [2., 0., 1., 2., 0.]])
        """
        out: Work | None = _exchange(u, width, async_op, self._geo.group, self._geo)
        return out

    def scatter_blocks(
        self, global_array: Any, src: int | None = None, width: int = 0, out: Any = None
    ) -> Any:
        """Cut ``global_array`` on ``src`` into the grid's blocks and give each rank its own.

        The blocks may be uneven: each axis is cut as ``numpy.array_split`` cuts it. With ``width``,
        ``global_array`` carries a frame of ``width`` layers around the part that is cut (a fixed
        boundary, say), and each rank gets its block with the ``width`` layers around it: its
        neighbours' cells or the frame, ready for the first :meth:`exchange_halos`.

        ========  =====================================  ===================================
        rank      gives                                  gets
        ========  =====================================  ===================================
        ``src``   ``global_array``, shape ``(n, m)``     ``global_array[block_slices(...)]``
        others    nothing (``None``)                     their own block
        ========  =====================================  ===================================

        Args:
            global_array: The whole array on ``src``; ignored (may be None) elsewhere.
            src: World rank that holds it; None for the grid's rank 0.
            width: Ghost layers around each block (and the frame around the cut part).
            out: This rank's block to write into (a numpy array, torch CPU tensor or cupy array); None
                for a new numpy array.

        Returns:
            This rank's block: ``out`` when given, else a new numpy array.

        Raises:
            ArgumentTypeError: an argument of the wrong type.
            ArgumentError: ``global_array`` of another number of axes than the grid or with fewer
                cells than ranks along an axis, ``out`` of the wrong shape, or ranks that passed
                different ``src`` or ``width`` (raised on every rank alike).

        Example:
            >>> import numpy as np, mpicomm
            >>> grid = mpicomm.CartGrid((0,))
            >>> whole = np.arange(10.0) if mpicomm.get_rank() == 0 else None
            >>> mine = grid.scatter_blocks(whole, src=0)
            >>> bool((mine == np.arange(10.0)[grid.block_slices((10,))]).all())
            True
        """
        got = _scatter(global_array, out, src, width, self._geo.group, self._geo)
        return out if got is None else got

    def gather_blocks(self, local: Any, dst: int | None = None, width: int = 0, out: Any = None) -> Any:
        """Put every rank's block together into the whole array on ``dst``.

        The inverse of :meth:`scatter_blocks`: each rank gives its block (with ``width`` ghost layers
        on every side, which are left out), the blocks cut as ``numpy.array_split`` cuts; ``dst``
        gets the whole array of their insides (without a frame).

        Args:
            local: This rank's block, with its ghost layers.
            dst: World rank that gets the whole array; None for the grid's rank 0.
            width: Ghost layers around each block.
            out: The whole array to write into on ``dst`` (a numpy array, torch CPU tensor or cupy
                array; ignored elsewhere); None for a new numpy array.

        Returns:
            On ``dst`` the whole array (``out`` when given); None elsewhere.

        Raises:
            ArgumentTypeError: an argument of the wrong type, or blocks of different dtypes.
            ArgumentError: blocks that are not the shares of one array, ``out`` of the wrong shape,
                or ranks that passed different ``dst`` or ``width`` (raised on every rank alike).

        Example:
            >>> import numpy as np, mpicomm
            >>> grid = mpicomm.CartGrid((0, 0))
            >>> mine = np.arange(12.0).reshape(3, 4)[grid.block_slices((3, 4))]
            >>> whole = grid.gather_blocks(mine, dst=0)
            >>> whole is None or bool((whole == np.arange(12.0).reshape(3, 4)).all())
            True
        """
        got = _gather(local, out, dst, width, self._geo.group, self._geo)
        return out if got is None and out is not None and self.group.rank() == self._root(dst) else got

    def _root(self, rank: int | None) -> int:
        return 0 if rank is None else self._geo.group._index.get(rank, -1)

    def _axis(self, axis: object, fn: str) -> int:
        if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
            raise ArgumentTypeError(f"{fn}: axis is {axis!r}; expected an int")
        if not -self.ndim <= axis < self.ndim:
            raise ArgumentError(f"{fn}: axis is {axis}; expected 0 <= axis < {self.ndim} (the grid's axes)")
        return int(axis) % self.ndim

    def __repr__(self) -> str:
        geo = self._geo
        return f"<CartGrid dims {geo.dims}, periodic {geo.periodic}: coords {geo.coords} of {geo.group!r}>"
