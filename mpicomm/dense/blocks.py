"""A global array on one rank, cut into the blocks of a Cartesian grid, and put back together.

The cut is ``numpy.array_split``'s along every axis (the first ``n % dims`` blocks hold one more
cell), so any shape whose axes are at least as long as the grid's works. With ``width`` the blocks
carry ghost layers: :func:`scatter_blocks` hands each rank its block and the ``width`` layers
around it from the global array (a global array with a frame of ``width`` around the part that is
cut), ready for the first :meth:`~mpicomm.CartGrid.exchange_halos`; :func:`gather_blocks` takes
the blocks with their layers and keeps the insides.

Both calls first exchange one small row of ints per rank (``MPI_Allgather``): shapes, dtype, root,
width and whether the rank's own checks passed. Every rank then checks every rank's share, so a
mistake on one rank raises on all of them, with the same message, before any data moves; then one
``MPI_Scatterv`` or ``MPI_Gatherv`` moves the blocks, packed in rank order on the root.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.buffers import check_array, check_output, datatype
from ..core.groups import resolve, root_rank
from ..errors import ArgumentError, ArgumentTypeError, CrossRankMismatchError, DtypeMismatchError
from .cart import Geometry, block_bounds

__all__ = ["block_slices", "gather_blocks", "scatter_blocks"]

# A row's fields before its two shapes: failed, root, width, the data's dtype, out's dtype.
_FAILED, _ROOT, _WIDTH, _DTYPE, _OUT_DTYPE, _HEAD = 0, 1, 2, 3, 4, 5


def block_slices(
    grid: Geometry, shape: tuple[int, ...], coords: tuple[int, ...], width: int = 0
) -> tuple[slice, ...]:
    """The part of a global array of ``shape`` that the block at ``coords`` holds, with ``width`` layers.

    ``shape`` is the whole global array's, frame included: ``width`` layers around the part that is cut.
    """
    out = []
    for n, parts, c in zip(shape, grid.dims, coords, strict=True):
        lo, hi = block_bounds(n - 2 * width, parts, c)
        out.append(slice(lo, hi + 2 * width))
    return tuple(out)


def _coords(grid: Geometry) -> list[tuple[int, ...]]:
    """Every grid rank's coordinates (row-major: the grid was made without reordering)."""
    size = int(np.prod(grid.dims))
    return [
        tuple(int(c) for c in cs) for cs in zip(*np.unravel_index(np.arange(size), grid.dims), strict=True)
    ]


def _dtype_code(dtype: np.dtype[Any], fn: str, arg: str) -> int:
    text = dtype.str.encode()
    if len(text) > 8 or np.dtype(dtype.str) != dtype:
        raise ArgumentTypeError(
            f"{fn}: {arg} has dtype {dtype}; expected a dtype numpy names by its str (no fields)"
        )
    return int.from_bytes(text.ljust(8, b"\0"), "little", signed=True)


def _dtype_of(code: int) -> np.dtype[Any]:
    return np.dtype(int(code).to_bytes(8, "little", signed=True).rstrip(b"\0").decode())


def _check_width(width: object, fn: str) -> int:
    if not isinstance(width, (int, np.integer)) or isinstance(width, bool):
        raise ArgumentTypeError(f"{fn}: width is {width!r}; expected an int >= 0 (ghost layers on each side)")
    if width < 0:
        raise ArgumentError(f"{fn}: width is {width}; expected an int >= 0 (ghost layers on each side)")
    return int(width)


def _check_ndim(x: np.ndarray, grid: Geometry, fn: str, arg: str) -> None:
    if x.ndim != len(grid.dims):
        raise ArgumentError(
            f"{fn}: {arg} has {x.ndim} axes (shape {x.shape}); expected {len(grid.dims)}, one per axis of "
            f"the grid (dims {grid.dims})"
        )


def _rows(g: Any, fn: str, row: np.ndarray, failure: Exception | None, root_arg: str) -> np.ndarray:
    """Every rank's row (one ``MPI_Allgather``); a rank's failed checks raise there and on the others."""
    rows = np.empty((g.size(), row.size), np.int64)
    g.comm.Allgather(row, rows)
    if failure is not None:
        raise failure
    bad = np.flatnonzero(rows[:, _FAILED])
    if bad.size:
        raise ArgumentError(
            f"{fn}: world rank {g.ranks[int(bad[0])]} refused its arguments (its error says why); "
            "nothing was sent"
        )
    for field, name in ((_ROOT, root_arg), (_WIDTH, "width")):
        values = rows[:, field]
        if (values != values[0]).any():
            told = [g.ranks[v] for v in values.tolist()] if field == _ROOT else values.tolist()
            shown = ", ".join(f"rank {g.ranks[i]}: {v}" for i, v in enumerate(told))
            raise CrossRankMismatchError(
                f"{fn}: the ranks passed different {name} ({shown}); expected the same on every rank"
            )
    return rows


def _check_out_dtypes(rows: np.ndarray, code: int, fn: str, ranks: list[int], whose: str) -> None:
    """Every ``out`` given has the data's dtype (checked on every rank alike, from the rows)."""
    outs = rows[:, _OUT_DTYPE]
    bad = np.flatnonzero((outs != -1) & (outs != code))  # -1: no out on that rank
    if bad.size:
        i = int(bad[0])
        raise DtypeMismatchError(
            f"{fn}: out has dtype {_dtype_of(int(outs[i]))} on world rank {ranks[i]}; expected "
            f"{_dtype_of(code)}, {whose}"
        )


def _row(nd: int) -> np.ndarray:
    return np.full(_HEAD + 2 * nd, -1, np.int64)


def scatter_blocks(
    global_array: Any,
    out: Any = None,
    src: int | None = None,
    width: int = 0,
    group: Any = None,
    grid: Any = None,
) -> np.ndarray | None:
    """Cut ``global_array`` (on ``src``) into the grid's blocks, one to each rank (``scatter_blocks``).

    Args:
        global_array: The whole array, on ``src`` (ignored elsewhere).
        out: This rank's block to write into, or None for a new array.
        src: World rank of the root; None for the grid's rank 0.
        width: Ghost layers around each block (and the frame around the global array's cut part).
        group: The grid's group.
        grid: The grid.

    Returns:
        This rank's block when ``out`` is None, else None (it is in ``out``).
    """
    fn = "CartGrid.scatter_blocks"
    geo: Geometry = grid
    g = resolve(group, fn)
    nd, me = len(geo.dims), g.rank()
    row, failure = _row(nd), None
    x = y = None
    try:
        root = root_rank(g, src, None, fn, "src")
        w = _check_width(width, fn)
        row[_FAILED:_DTYPE] = 0, root, w
        if me == root:
            x = check_array(global_array, fn, "global_array")
            _check_ndim(x, geo, fn, "global_array")
            short = [a for a in range(nd) if x.shape[a] - 2 * w < geo.dims[a]]
            if short:
                a = short[0]
                raise ArgumentError(
                    f"{fn}: global_array has shape {x.shape}: {x.shape[a] - 2 * w} cells along axis {a} "
                    f"inside its frame of width {w}; expected at least {geo.dims[a]}, one per rank of the "
                    "grid "
                    "along that axis"
                )
            row[_DTYPE] = _dtype_code(x.dtype, fn, "global_array")
            row[_HEAD : _HEAD + nd] = x.shape
        if out is not None:
            y = check_output(out, fn, "out")
            _check_ndim(y, geo, fn, "out")
            row[_OUT_DTYPE] = _dtype_code(y.dtype, fn, "out")
            row[_HEAD + nd :] = y.shape
    except (ArgumentError, ArgumentTypeError) as exc:
        row[_FAILED], failure = 1, exc
    rows = _rows(g, fn, row, failure, "src")
    root, w = int(rows[0, _ROOT]), int(rows[0, _WIDTH])
    shape = tuple(int(n) for n in rows[root, _HEAD : _HEAD + nd])
    dtype = _dtype_of(int(rows[root, _DTYPE]))
    coords = _coords(geo)
    shares = [block_slices(geo, shape, c, w) for c in coords]
    sizes = [tuple(s.stop - s.start for s in share) for share in shares]
    for i, r in enumerate(rows):
        if r[_HEAD + nd] >= 0 and tuple(r[_HEAD + nd :].tolist()) != sizes[i]:
            raise ArgumentError(
                f"{fn}: out has shape {tuple(r[_HEAD + nd :].tolist())} on world rank {g.ranks[i]}; expected "
                f"{sizes[i]}, its block of global_array's {shape} (width {w})"
            )
    _check_out_dtypes(rows, int(rows[root, _DTYPE]), fn, g.ranks, "global_array's")
    dt = datatype(dtype)
    counts = [int(np.prod(s)) for s in sizes]
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
    send = None  # read on the root only
    if x is not None:  # the shares packed in rank order (they overlap where width > 0)
        send = [np.concatenate([x[share].ravel() for share in shares]), (counts, displs), dt]
    into = y if y is not None and y.flags.c_contiguous else np.empty(sizes[me], dtype)
    g.comm.Scatterv(send, [into, dt], root=root)
    if y is None:
        return into
    if into is not y:
        np.copyto(y, into)
    return None


def gather_blocks(
    local: Any,
    out: Any = None,
    dst: int | None = None,
    width: int = 0,
    group: Any = None,
    grid: Any = None,
) -> np.ndarray | None:
    """Put the grid's blocks together on ``dst`` (``CartGrid.gather_blocks``).

    Args:
        local: This rank's block, with ``width`` ghost layers on every side (not gathered).
        out: The whole array to write into on ``dst`` (ignored elsewhere), or None for a new array.
        dst: World rank of the root; None for the grid's rank 0.
        width: Ghost layers around each block.
        group: The grid's group.
        grid: The grid.

    Returns:
        The whole array on ``dst`` when ``out`` is None; None elsewhere, and where ``out`` was given.
    """
    fn = "CartGrid.gather_blocks"
    geo: Geometry = grid
    g = resolve(group, fn)
    nd, me = len(geo.dims), g.rank()
    row, failure = _row(nd), None
    x = y = None
    try:
        root = root_rank(g, dst, None, fn, "dst")
        w = _check_width(width, fn)
        row[_FAILED:_DTYPE] = 0, root, w
        x = check_array(local, fn, "local")
        _check_ndim(x, geo, fn, "local")
        thin = [a for a in range(nd) if x.shape[a] < 2 * w]
        if thin:
            raise ArgumentError(
                f"{fn}: local has shape {x.shape}; expected at least 2 * width = {2 * w} cells along axis "
                f"{thin[0]} (its ghost layers)"
            )
        row[_DTYPE] = _dtype_code(x.dtype, fn, "local")
        row[_HEAD : _HEAD + nd] = x.shape
        if out is not None and me == root:
            y = check_output(out, fn, "out")
            _check_ndim(y, geo, fn, "out")
            row[_OUT_DTYPE] = _dtype_code(y.dtype, fn, "out")
            row[_HEAD + nd :] = y.shape
    except (ArgumentError, ArgumentTypeError) as exc:
        row[_FAILED], failure = 1, exc
    rows = _rows(g, fn, row, failure, "dst")
    root, w = int(rows[0, _ROOT]), int(rows[0, _WIDTH])
    shape, sizes = _whole(geo, rows, w, fn, g.ranks)
    codes = rows[:, _DTYPE]
    if (codes != codes[root]).any():
        i = int(np.flatnonzero(codes != codes[root])[0])
        raise DtypeMismatchError(
            f"{fn}: local has dtype {_dtype_of(int(codes[i]))} on world rank {g.ranks[i]}; expected "
            f"{_dtype_of(int(codes[root]))}, the root's"
        )
    dtype = _dtype_of(int(codes[root]))
    _check_out_dtypes(rows, int(codes[root]), fn, g.ranks, "the blocks'")
    wanted = tuple(rows[root, _HEAD + nd :].tolist())
    if wanted[0] >= 0 and wanted != shape:
        raise ArgumentError(
            f"{fn}: out has shape {wanted} on world rank {g.ranks[root]}; expected {shape}, the blocks' whole"
        )
    if x is None:  # for mypy: every rank has passed its checks by now
        raise AssertionError("unreachable")
    inner = np.ascontiguousarray(x[tuple(slice(w, n - w) for n in x.shape)])
    dt = datatype(dtype)
    counts = [int(np.prod(s)) for s in sizes]
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
    if me != root:
        g.comm.Gatherv([inner, dt], None, root=root)
        return None
    flat = np.empty(sum(counts), dtype)
    g.comm.Gatherv([inner, dt], [flat, (counts, displs), dt], root=root)
    whole = y if y is not None else np.empty(shape, dtype)
    for c, size, at, count in zip(_coords(geo), sizes, displs, counts, strict=True):
        whole[block_slices(geo, shape, c)] = flat[at : at + count].reshape(size)
    return whole if y is None else None


def _whole(
    geo: Geometry, rows: np.ndarray, w: int, fn: str, ranks: list[int]
) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """The whole array's shape from every rank's block, each block checked to be its share of it."""
    nd = len(geo.dims)
    inner = rows[:, _HEAD : _HEAD + nd] - 2 * w
    coords = _coords(geo)
    strides = [int(np.prod(geo.dims[a + 1 :])) for a in range(nd)]
    # along each axis: the blocks of the ranks on the line through grid rank 0
    shape = tuple(int(sum(inner[c * strides[a], a] for c in range(geo.dims[a]))) for a in range(nd))
    sizes = []
    for i, c in enumerate(coords):
        want = tuple(hi - lo for lo, hi in (block_bounds(shape[a], geo.dims[a], c[a]) for a in range(nd)))
        if tuple(inner[i].tolist()) != want:
            raise ArgumentError(
                f"{fn}: local has shape {tuple(rows[i, _HEAD : _HEAD + nd].tolist())} on world rank "
                f"{ranks[i]} "
                f"(width {w}); expected {tuple(n + 2 * w for n in want)}, its block of the whole {shape} "
                "(numpy.array_split's cut along every axis)"
            )
        sizes.append(want)
    return shape, sizes
