"""``jagged_all_to_all``: consecutive rows of a jagged array to each rank, counts first."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .. import _mpi
from ..core import validation
from ..core.arrays import Array
from ..core.buffers import as_int_list, datatype, displacements, row_size
from ..core.groups import ProcessGroup, resolve, warn_non_member
from ..core.work import Work
from ..errors import ArgumentError, ArgumentTypeError
from .device import int_stats, is_device, namespace, to_host, xp_take
from .jagged_array import cumulative
from .plan import _DIRECT
from .wire import (
    _DTYPES,
    _FLAGS,
    _HEADER,
    _ROWS,
    _VALUES,
    _alltoallv,
    _check_lengths,
    _check_values,
    _dtype_tag,
    _exchange_header,
    _exclusive_cumsum,
    _fingerprint,
)

__all__ = ["JaggedResult", "jagged_all_to_all", "jagged_all_to_all_direct"]


class JaggedResult(NamedTuple):
    """What :func:`jagged_all_to_all` received: source 0's rows first, then source 1's, and so on."""

    lengths: Array
    values: Array
    splits: list[int]


def jagged_all_to_all(
    values: Array,
    lengths: Array,
    send_splits: Sequence[int],
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> JaggedResult | Work | None:
    """Send consecutive rows of a jagged array to each rank; receive the rows every rank sends here.

    Row i has ``lengths[i]`` values. The first ``send_splits[0]`` rows go to rank 0, the next
    ``send_splits[1]`` to rank 1, and so on. One ``Alltoall`` of int64 counts tells every rank what
    it will receive; then two ``Ialltoallv`` move the lengths and the values. Rows from rank 0 come
    first in the result, then rows from rank 1, and so on. Two ranks, particles as rows:

    ======  ==================  ===========  ==============================  ================
    rank    lengths             send_splits  received lengths                received splits
    ======  ==================  ===========  ==============================  ================
    0       [2, 1, 1]           [1, 2]       [2, 3]  (rank 0's, rank 1's)    [1, 1]
    1       [3, 0]              [1, 1]       [1, 1, 0]                       [2, 1]
    ======  ==================  ===========  ==============================  ================

    Args:
        values: The concatenated rows along dim 0 (trailing dimensions travel along).
        lengths: Row lengths, an integer 1-D array summing to ``values.shape[0]``.
        send_splits: Rows to send to each group rank.
        group: The process group; ``None`` for the world.
        async_op: Return a Work (its ``result()`` is ``[lengths, values, splits]``) after the counts
            step, while the rows are still moving.

    Returns:
        A :class:`JaggedResult` ``(lengths, values, splits)`` with ``splits[s]`` the rows received from
        rank s; a Work if ``async_op``; None on a rank outside ``group``.

    Raises:
        ArgumentTypeError: non-arrays, non-integer lengths or splits.
        ArgumentError: wrong number of splits, sums that do not match, negative entries.
        CrossRankMismatchError: ranks send different dtypes or value shapes (on every rank).

    Example:
        >>> import numpy as np, mpicomm
        >>> from mpicomm import jagged_all_to_all
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> lengths = np.arange(w)                        # row j (j values, all 10 * r + j) goes to rank j
        >>> values = np.repeat(10 * r + np.arange(w), lengths)
        >>> got = jagged_all_to_all(values, lengths, [1] * w)
        >>> got.lengths.tolist() == [r] * w
        True
        >>> got.values.tolist() == [10 * s + r for s in range(w) for _ in range(r)]
        True
    """
    fn = "jagged_all_to_all"
    g = resolve(group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    vals, lens = _check_values(values, fn), _check_lengths(lengths, fn)
    if isinstance(send_splits, (str, bytes)) or not isinstance(send_splits, (list, tuple, np.ndarray)):
        raise ArgumentTypeError(f"{fn}: send_splits is {send_splits!r}; expected a list of {g.size()} ints")
    splits = as_int_list(send_splits, fn, "send_splits")
    if len(splits) != g.size():
        raise ArgumentError(
            f"{fn}: send_splits has {len(splits)} entries; expected {g.size()} (the group size)"
        )
    if sum(splits) != lens.size:
        raise ArgumentError(
            f"{fn}: send_splits sums to {sum(splits)}; expected {lens.size}, the rows in lengths"
        )
    cum = _exclusive_cumsum(lens)
    if cum[-1] != vals.shape[0]:
        raise ArgumentError(
            f"{fn}: lengths sum to {cum[-1]}; expected {vals.shape[0]}, the values along dim 0"
        )
    dtypes = (str(lens.dtype), _dtype_tag(vals.dtype), vals.shape[1:])
    if validation._Flag.on:
        validation.check(g, fn, {"lengths dtype, values dtype, value shape": dtypes})
    bounds = _exclusive_cumsum(np.asarray(splits, dtype=np.int64))
    header = np.zeros((g.size(), _HEADER), dtype=np.int64)
    header[:, _ROWS] = splits
    header[:, _VALUES] = np.diff(cum[bounds])
    header[:, _DTYPES] = _fingerprint(*dtypes)
    got = _exchange_header(g, header, fn, (lens.itemsize, vals.itemsize * row_size(vals)))
    recv_rows, recv_vals = got[:, _ROWS], got[:, _VALUES]
    out_l = np.empty(int(recv_rows.sum()), dtype=lens.dtype)
    out_v = np.empty((int(recv_vals.sum()), *vals.shape[1:]), dtype=vals.dtype)
    requests = [
        _alltoallv(g, lens, header[:, _ROWS], out_l, recv_rows),
        _alltoallv(g, vals, header[:, _VALUES], out_v, recv_vals),
    ]
    result = JaggedResult(out_l, out_v, recv_rows.tolist())
    if async_op:
        return Work(requests, keep=(lens, vals), result=list(result))
    _mpi.MPI.Request.Waitall(requests)
    return result


def jagged_all_to_all_direct(
    values: Any,
    lengths: Any,
    send_splits: Sequence[int],
    group: ProcessGroup | None,
    mpi_view: Callable[[Any], Any],
    ready: Callable[[], None],
) -> JaggedResult | Any:
    """:func:`jagged_all_to_all` of device arrays handed to a CUDA-aware MPI (blocking).

    The counts message carries the direct flag, so every rank takes the blocking path (a CUDA-aware
    MPI does not take device memory in non-blocking collectives) or all raise one error; then one
    blocking ``Alltoallv`` each of lengths and values on the device memory. Only the value count
    per destination (one number per rank) comes to the host. Anything unusual (validation mode, a
    rank outside the group, an argument the host code refuses) returns ``NotImplemented``: the
    staged path then runs the host code, which serves the call or raises its error.

    Args:
        values: The concatenated rows, a device array.
        lengths: Row lengths, a device array.
        send_splits: Rows to send to each group rank.
        group: The process group; ``None`` for the world.
        mpi_view: Makes a device array something mpi4py passes to MPI as a device pointer.
        ready: Waits for the work queued on the caller's current stream (before MPI reads).

    Returns:
        The :class:`JaggedResult` of device arrays, or ``NotImplemented``.
    """
    fn = "jagged_all_to_all"
    g = resolve(group, fn)
    if g.comm is None or validation._Flag.on or not _plain(values, lengths):
        return NotImplemented
    try:
        splits = as_int_list(send_splits, fn, "send_splits")
    except (ArgumentError, ArgumentTypeError):
        return NotImplemented
    if len(splits) != g.size() or sum(splits) != lengths.size or min(splits, default=0) < 0:
        return NotImplemented
    if lengths.size and int_stats(lengths)[0] < 0:
        return NotImplemented
    bounds = _exclusive_cumsum(np.asarray(splits, dtype=np.int64))
    ends = to_host(xp_take(cumulative(lengths, np.int64), bounds))  # size + 1 numbers
    if int(ends[-1]) != values.shape[0]:
        return NotImplemented
    header = np.zeros((g.size(), _HEADER), dtype=np.int64)
    header[:, _FLAGS] = _DIRECT
    header[:, _ROWS] = splits
    header[:, _VALUES] = np.diff(ends)
    header[:, _DTYPES] = _fingerprint(str(lengths.dtype), _dtype_tag(values.dtype), values.shape[1:])
    got = _exchange_header(g, header, fn, (lengths.itemsize, values.itemsize * row_size(values)))
    xp = namespace(values)
    out_l = xp.empty(int(got[:, _ROWS].sum()), dtype=lengths.dtype)
    out_v = xp.empty((int(got[:, _VALUES].sum()), *values.shape[1:]), dtype=values.dtype)
    ready()
    for send, sent, recv, received in ((lengths, _ROWS, out_l, _ROWS), (values, _VALUES, out_v, _VALUES)):
        row = row_size(send)
        sc, rc = [c * row for c in header[:, sent].tolist()], [c * row for c in got[:, received].tolist()]
        dt = datatype(send.dtype)
        g.internal.Alltoallv(
            [mpi_view(send), (sc, displacements(sc)), dt], [mpi_view(recv), (rc, displacements(rc)), dt]
        )
    return JaggedResult(out_l, out_v, got[:, _ROWS].tolist())


def _plain(values: Any, lengths: Any) -> bool:
    """Device arrays the host code would take: values with a dim, 1-D integer lengths."""
    return (
        is_device(values)
        and is_device(lengths)
        and values.ndim >= 1
        and not values.dtype.hasobject
        and lengths.ndim == 1
        and lengths.dtype.kind in "iu"
    )
