"""Builders of the halo comparisons: ``sendrecv`` against mpi4py's ``Sendrecv``, and in-place ghost cells.

- ``sendrecv``: a ring (every rank sends right and receives from the left), contiguous arrays.
- ``sendrecv_edge``: a non-periodic line, the edge ranks' call: rank 0 receives nothing
  (``src=None``), the last rank sends nothing (``dst=None``); at 2 ranks both ranks are edges.
- ``halo_column`` and ``halo_row``: one ghost-cell exchange on a ring, in place on a strided view
  (the column ``u[:, 1]`` sent, ``u[:, 0]`` received, of a ``(count, 4)`` array; the row ``u[1]``
  and ``u[0]`` of a ``(4, count)`` array) against what a user writes without mpicomm's strided
  path: ``np.ascontiguousarray`` of the edge, a contiguous ``Sendrecv``, and a copy back.
"""

from __future__ import annotations

from functools import partial

import numpy as np

import mpicomm

from .harness import Buffers, Contender, Env, _data

#: Columns of the array whose ghost column is exchanged (its stride is this many elements).
WIDTH = 4


def _ring(e: Env) -> tuple[int, int]:
    return (e.rank + 1) % e.n, (e.rank - 1) % e.n


def _sendrecv(e: Env, c: int, who: str, m: Buffers) -> Contender:
    """Ring: send ``c`` float32 right, receive ``c`` from the left."""
    x = m.take("x", c, partial(_data, c, e.rank))
    y = m.take("y", c)
    right, left = _ring(e)
    if who == "mpicomm":
        return partial(mpicomm.sendrecv, x, y, right, left), [y]
    return partial(e.comm.Sendrecv, x, right, 0, y, left, 0), [y]


def _sendrecv_edge(e: Env, c: int, who: str, m: Buffers) -> Contender:
    """A non-periodic line: no left neighbour on rank 0, no right one on the last rank."""
    x = m.take("x", c, partial(_data, c, e.rank))
    y = m.take("y", c)
    right = e.rank + 1 if e.rank + 1 < e.n else None
    left = e.rank - 1 if e.rank > 0 else None
    if who == "mpicomm":
        return partial(mpicomm.sendrecv, x, y, right, left), [y]
    null = int(_null())
    to, frm = null if right is None else right, null if left is None else left
    return partial(e.comm.Sendrecv, x, to, 0, y, frm, 0), [y]


def _null() -> int:
    from mpi4py import MPI  # loaded by now: the harness started MPI

    return int(MPI.PROC_NULL)


def _grid(e: Env, c: int, m: Buffers, column: bool) -> np.ndarray:
    """The array whose ghost column (or row) is exchanged: (c, WIDTH) or (WIDTH, c)."""
    shape = (c, WIDTH) if column else (WIDTH, c)
    if m.shared:
        key = "col" if column else "row"
        u = m.arrays.get(key)
        if u is None or u.shape != shape:
            u = m.arrays[key] = np.zeros(shape, np.float32)
        return u
    return _data(c * WIDTH, e.rank).reshape(shape)


def _halo(e: Env, c: int, who: str, m: Buffers, column: bool) -> Contender:
    u = _grid(e, c, m, column)
    send, ghost = (u[:, 1], u[:, 0]) if column else (u[1], u[0])
    right, left = _ring(e)
    if who == "mpicomm":
        return partial(mpicomm.sendrecv, send, ghost, right, left), [u]
    comm = e.comm

    def packed() -> None:
        edge = np.ascontiguousarray(send)
        got = np.empty(ghost.shape, ghost.dtype)
        comm.Sendrecv(edge, right, 0, got, left, 0)
        ghost[...] = got

    return packed, [u]


def _halo_column(e: Env, c: int, who: str, m: Buffers) -> Contender:
    """Ghost column ``u[:, 0]`` (stride WIDTH elements) received, interior column ``u[:, 1]`` sent."""
    return _halo(e, c, who, m, True)


def _halo_row(e: Env, c: int, who: str, m: Buffers) -> Contender:
    """Ghost row ``u[0]`` received, interior row ``u[1]`` sent (both contiguous in C order)."""
    return _halo(e, c, who, m, False)
