"""MPI derived datatypes that describe a numpy view's strides, so that MPI reads and writes it in place.

A view such as ``u[:, 0]`` (a column), ``a[:, ::2]`` or ``a.T`` is a regular lattice of elements: one
``MPI_Type_create_hvector`` per dimension, nested from the innermost out (a contiguous innermost run
becomes one ``MPI_Type_contiguous`` block), describes it exactly. Negative strides put the first
element above the lowest address; an ``MPI_Type_create_hindexed`` of one block shifts the type so that
the message starts at the lowest byte the view touches. For messages counted in dim-0 rows
(``all_to_all_single``, ``all_gather_into_tensor``), one row is described and
``MPI_Type_create_resized`` gives it the extent of dim 0's stride.

Each datatype is committed once and kept in a bounded cache keyed by (dtype, shape, strides); the
oldest is freed when the cache is full (MPI lets a freed datatype finish the messages that use it), and
the rest when MPI finalizes (an attribute on ``MPI_COMM_SELF`` whose delete callback clears the cache:
MPI deletes those attributes first thing in ``MPI_Finalize``).
Views whose elements overlap (a zero stride, ``as_strided`` tricks) cannot be received into; callers
use a contiguous temporary for them (:func:`regular`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from .. import _mpi

__all__ = ["CACHE_SIZE", "clear", "regular", "rows", "span", "whole"]

#: How many derived datatypes stay committed; the least recently used is freed beyond this.
CACHE_SIZE = 128

_CACHE: OrderedDict[tuple[Any, ...], Any] = OrderedDict()


def span(x: np.ndarray) -> tuple[int, int]:
    """The lowest byte address ``x`` touches and the number of bytes up to its highest.

    Example:
        >>> import numpy as np
        >>> a = np.zeros((3, 4))
        >>> span(a[:, 1])[1]
        72
    """
    low = high = 0
    for n, s in zip(x.shape, x.strides, strict=True):
        if n > 1:
            if s < 0:
                low += (n - 1) * s
            else:
                high += (n - 1) * s
    start = int(x.__array_interface__["data"][0])
    return start + low, high - low + x.itemsize


def regular(x: np.ndarray) -> bool:
    """Whether no two elements of ``x`` share memory (so MPI may receive into it through a datatype).

    A sufficient test: sorted by stride, each dimension steps past everything the inner ones cover.
    Interleaved layouts that pass no such test go through a temporary instead (rare and still right).

    Example:
        >>> import numpy as np
        >>> a = np.zeros((4, 6))
        >>> regular(a[:, ::2]), regular(a.T), regular(np.broadcast_to(a[0], (3, 6)))
        (True, True, False)
    """
    dims = sorted((abs(s), n) for n, s in zip(x.shape, x.strides, strict=True) if n > 1)
    covered = x.itemsize
    for step, n in dims:
        if step < covered:
            return False
        covered = step * (n - 1) + covered
    return True


def _dims(x: np.ndarray) -> list[tuple[int, int]]:
    """(length, byte stride) per dimension, without length-1 dims and with C-mergeable dims merged."""
    dims: list[tuple[int, int]] = []
    for n, s in zip(x.shape, x.strides, strict=True):
        if n == 1:
            continue
        dims.append((n, s))
    merged: list[tuple[int, int]] = []
    for n, s in reversed(dims):
        if merged and s == merged[-1][0] * merged[-1][1]:
            inner_n, inner_s = merged.pop()
            merged.append((n * inner_n, inner_s))
        else:
            merged.append((n, s))
    merged.reverse()
    return merged


def _build(elem: Any, itemsize: int, dims: list[tuple[int, int]]) -> Any:
    """The uncommitted nested type of ``dims`` over ``elem``, starting at the first element."""
    t = elem
    made = []
    for n, s in reversed(dims):
        t = t.Create_contiguous(n) if t is elem and s == itemsize else t.Create_hvector(n, 1, s)
        made.append(t)
    for inner in made[:-1]:
        inner.Free()  # a type built from another keeps what it needs
    return t


def _cached(key: tuple[Any, ...], make: Any) -> Any:
    dt = _CACHE.get(key)
    if dt is not None:
        _CACHE.move_to_end(key)
        return dt
    if not _Finalize.hooked:
        _hook_finalize()
    dt = make()
    dt.Commit()
    _CACHE[key] = dt
    while len(_CACHE) > CACHE_SIZE:
        _, old = _CACHE.popitem(last=False)
        old.Free()
    return dt


def _whole_type(elem: Any, x: np.ndarray, shift: int) -> Any:
    t = _build(elem, x.itemsize, _dims(x))
    if t is elem:
        t = elem.Create_contiguous(1)
    if shift:
        shifted = t.Create_hindexed([1], [shift])
        t.Free()
        t = shifted
    return t


def whole(x: np.ndarray, elem: Any, readonly: bool) -> list[Any]:
    """The mpi4py message ``[memory, 1, datatype]`` that reads or writes ``x`` where it lies.

    Args:
        x: Any numpy array with at least one element (a non-contiguous view is the point).
        elem: The MPI datatype of one element.
        readonly: True for a send buffer (``x`` may be read-only).

    Returns:
        A buffer specification for mpi4py calls.
    """
    low, nbytes = span(x)
    start = int(x.__array_interface__["data"][0])
    shift = start - low
    key = ("whole", x.dtype, x.shape, x.strides)
    dt = _cached(key, lambda: _whole_type(elem, x, shift))
    return [_mpi.MPI.buffer.fromaddress(low, nbytes, readonly), 1, dt]


def rows(x: np.ndarray, elem: Any, readonly: bool) -> tuple[Any, Any] | None:
    """``(memory, row datatype)`` for messages counted in dim-0 rows, or None if dim 0 steps backwards.

    The row datatype's extent is dim 0's stride, so ``count`` rows at displacement ``d`` (in rows) are
    rows ``d .. d + count - 1`` of ``x``.

    Args:
        x: An array with at least one dimension and one element.
        elem: The MPI datatype of one element.
        readonly: True for a send buffer.

    Returns:
        The memory starting at row 0 and the row type, or None when a row is not regular or dim 0's
        stride is not positive (the caller then copies).
    """
    step = x.strides[0]
    row = x[0]
    if step <= 0 or (x.shape[0] > 1 and not regular(x)):
        return None
    low, nbytes = span(row)
    start = int(x.__array_interface__["data"][0])
    if low != start:
        return None  # a row that steps backwards; rare enough to copy
    total = step * (x.shape[0] - 1) + nbytes

    def make() -> Any:
        t = _build(elem, x.itemsize, _dims(row))
        if t is elem:
            t = elem.Create_contiguous(1)
        resized = t.Create_resized(0, step)
        t.Free()
        return resized

    dt = _cached(("rows", x.dtype, x.shape[1:], x.strides), make)
    return _mpi.MPI.buffer.fromaddress(start, total, readonly), dt


class _Finalize:
    hooked = False


def _hook_finalize() -> None:
    """Free the cached datatypes at ``MPI_Finalize``, before MPI stops taking calls."""
    MPI = _mpi.MPI
    keyval = MPI.Comm.Create_keyval(delete_fn=lambda *_: clear())
    MPI.COMM_SELF.Set_attr(keyval, True)
    _Finalize.hooked = True


def clear() -> None:
    """Free every cached datatype (before ``MPI_Finalize``, or in tests)."""
    while _CACHE:
        _, dt = _CACHE.popitem()
        dt.Free()


def cached() -> int:
    """How many derived datatypes are committed now."""
    return len(_CACHE)
