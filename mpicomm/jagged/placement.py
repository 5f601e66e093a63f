"""Putting received (source, key) segments in (key, source) order: MPI indexed types or a numpy gather."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.buffers import datatype
from .keyed import KeyedJaggedArray
from .wire import (
    _exclusive_cumsum,
    _segment_index,
)

#: Committed MPI datatypes for one row of each (dtype, row length): made once, kept for the process.
_ROW_TYPES: dict[tuple[np.dtype[Any], int], Any] = {}


def _row_type(dtype: np.dtype[Any], row: int) -> Any:
    elem = datatype(dtype)
    if row == 1:
        return elem
    made = _ROW_TYPES.get((dtype, row))
    if made is None:
        made = _ROW_TYPES[(dtype, row)] = elem.Create_contiguous(row).Commit()
    return made


def indexed_types(base: Any, seg: list[list[int]], at: list[list[int]]) -> list[Any]:
    """Per source s, a committed indexed type of blocks ``seg[s]`` at ``at[s]`` (no types: no keys)."""
    if not (seg and seg[0]):
        return []
    return [base.Create_indexed(seg[s], at[s]).Commit() for s in range(len(seg))]


#: Recat indices by (segment rows, source order): the cell order and the row index, which repeat from
#: call to call; (None, None) when the order is already right.
_RECAT: dict[tuple[Any, ...], tuple[np.ndarray | None, np.ndarray | None]] = {}


def _recat_index(
    rows_sk: np.ndarray, values_sk: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Gather indices that put (source, key) segments of rows and of values in (key, source) order.

    ``rows_sk[s, k]`` batch slots and ``values_sk[s, k]`` values make up segment (s, k). The row
    index depends only on the slots, so it is cached; the value index is built from the
    per-segment value counts (no pass over the lengths).

    Returns:
        The row index and the value index, or (None, None) when the order is already right.

    Example:
        >>> rows, vidx = _recat_index(np.array([[1, 1], [1, 1]]), np.array([[2, 0], [1, 3]]), np.arange(2))
        >>> rows.tolist(), vidx.tolist()     # key 0 of source 0, key 0 of source 1, key 1 of ...
        ([0, 2, 1, 3], [0, 1, 2, 3, 4, 5])
    """
    key = (rows_sk.shape, np.ascontiguousarray(rows_sk).tobytes(), order.tobytes())
    cached = _RECAT.get(key)
    if cached is None:
        nk = rows_sk.shape[1]
        perm = (order[None, :] * nk + np.arange(nk)[:, None]).reshape(-1)
        if np.array_equal(perm, np.arange(perm.size)):
            cached = (None, None)
        else:
            cached = (perm, _gather_index(rows_sk.reshape(-1), perm))
        if len(_RECAT) >= 256:
            _RECAT.clear()
        _RECAT[key] = cached
    perm, rows = cached
    if perm is None or rows is None:
        return None, None
    return rows, _gather_index(values_sk.reshape(-1), perm)


def _gather_index(sizes: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """The index that reads segments of ``sizes`` (laid end to end) in the order ``perm``."""
    return _segment_index(_exclusive_cumsum(sizes)[:-1][perm], sizes[perm])


def _apply(
    rows: np.ndarray | None,
    vidx: np.ndarray | None,
    lengths: np.ndarray,
    values: np.ndarray,
    weights: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Gather lengths by ``rows`` and values and weights by ``vidx`` (both None: unchanged)."""
    if rows is None or vidx is None:
        return lengths, values, weights
    return lengths[rows], values[vidx], None if weights is None else weights[vidx]


def _recat(
    keys: list[str],
    lengths: np.ndarray,
    values: np.ndarray,
    weights: np.ndarray | None,
    stride_per_rank: np.ndarray,
    strides: np.ndarray | None,
    order: np.ndarray,
) -> KeyedJaggedArray:
    """Reorder received ``(source, key)`` segments into ``(key, source)`` order (a pure function).

    ``strides[s, k]`` (VBE) or ``stride_per_rank[s]`` is the number of batch slots of segment
    (s, k). This is the gather path's reorder fed with what MPI delivers; the value counts per
    segment, which KJTAllToAll has from the counts message, are summed from the lengths here.
    """
    nk, size = len(keys), stride_per_rank.shape[0]
    seg = strides if strides is not None else np.repeat(stride_per_rank[:, None], nk, axis=1)
    ends = np.cumsum(seg.reshape(-1))
    cum = _exclusive_cumsum(lengths)
    values_sk = (cum[ends] - cum[ends - seg.reshape(-1)]).reshape(size, nk)
    rows, vidx = _recat_index(seg, values_sk, order)
    lengths, values, weights = _apply(rows, vidx, lengths, values, weights)
    return _keyed(keys, lengths, values, weights, stride_per_rank, strides, order)


def _keyed(
    keys: list[str],
    lengths: np.ndarray,
    values: np.ndarray,
    weights: np.ndarray | None,
    stride_per_rank: np.ndarray,
    strides: np.ndarray | None,
    order: np.ndarray,
) -> KeyedJaggedArray:
    """The output KeyedJaggedArray from arrays already in (key, source) order.

    Its stride is the sum of the source strides, or under VBE (``strides[s, k]`` slots) the largest
    per-key total, with the ``[key][source]`` table in source ``order``.
    """
    if strides is None:
        return KeyedJaggedArray._trusted(keys, values, lengths, weights, int(stride_per_rank.sum()), None)
    table = strides.T[:, order]
    stride = int(table.sum(axis=1).max()) if table.size else 0
    return KeyedJaggedArray._trusted(keys, values, lengths, weights, stride, table.tolist())
