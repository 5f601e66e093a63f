"""``jagged_all_to_all``: consecutive rows of a jagged array to each rank, counts first."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate, pairwise
from typing import Any, NamedTuple

import numpy as np

from .. import _mpi
from ..core import cmpi, validation
from ..core.arrays import Array
from ..core.buffers import _DATATYPES, as_int_list, datatype, displacements, row_size
from ..core.control import memory_bound
from ..core.groups import ProcessGroup, resolve, warn_non_member
from ..core.work import Work
from ..errors import ArgumentError, ArgumentTypeError, CommunicationError
from .device import int_stats, is_device, namespace, to_host, xp_take
from .jagged_array import cumulative
from .keyed import _exact_total
from .plan import _DIRECT
from .wire import (
    _DTYPES,
    _FLAGS,
    _HEADER,
    _INLINE,
    _JAGGED_WORDS,
    _ROWS,
    _SPLITS,
    _TOTAL,
    _VALUES,
    _alltoallv,
    _check_claims,
    _check_lengths,
    _check_values,
    _disagree,
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
    it will receive; then one blocking ``Alltoallv`` each moves the lengths and the values (two
    ``Ialltoallv`` with ``async_op``). Rows from rank 0 come
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
    if type(values) is np.ndarray and async_op is False and not validation._Flag.on:
        # the C call (int64 lengths, a dtype seen before): every check, both MPI calls, the results
        fp = _C_FINGERPRINTS.get((values.dtype, values.shape[1:]))
        if fp is not None:
            got = cmpi.jagged(
                values,
                lengths,
                send_splits,
                fp,
                memory_bound(),
                _DATATYPES,
                _mpi.MPI.INT64_T,
                g.internal,
                _EMPTY,
            )
            if type(got) is tuple:
                return _RESULT(JaggedResult, got)
            if got is not NotImplemented:  # counts it leaves to this path, after the counts message
                return _after_counts(g, lengths, values, list(send_splits), got, fp, fn)
    if (
        type(values) is np.ndarray
        and values.flags.c_contiguous
        and values.ndim
        and not values.dtype.hasobject
    ):
        vals = values  # the common case, checked inline
    else:
        vals = _check_values(values, fn)
    if (
        type(lengths) is np.ndarray
        and lengths.flags.c_contiguous
        and lengths.ndim == 1
        and lengths.dtype.kind in "iu"
    ):
        lens = lengths
    else:
        lens = _check_lengths(lengths, fn, cheap=True)
    if type(send_splits) is list and {*map(type, send_splits)} <= _INT:
        splits = send_splits  # a list of Python ints, checked for negatives below
        if splits and min(splits) < 0:
            raise ArgumentError(
                f"{fn}: send_splits has a negative entry {min(splits)} in {splits}; expected >= 0"
            )
    else:
        if isinstance(send_splits, (str, bytes)) or not isinstance(send_splits, (list, tuple, np.ndarray)):
            raise ArgumentTypeError(
                f"{fn}: send_splits is {send_splits!r}; expected a list of {g.size()} ints"
            )
        splits = as_int_list(send_splits, fn, "send_splits")
    n = g.size()
    if len(splits) != n:
        raise ArgumentError(f"{fn}: send_splits has {len(splits)} entries; expected {n} (the group size)")
    if sum(splits) != lens.size:
        raise ArgumentError(
            f"{fn}: send_splits sums to {sum(splits)}; expected {lens.size}, the rows in lengths"
        )
    sent = _values_per_rank(lens, splits, fn)
    if sum(sent) != vals.shape[0]:
        raise ArgumentError(
            f"{fn}: lengths sum to {sum(sent)}; expected {vals.shape[0]}, the values along dim 0"
        )
    key = (lens.dtype, vals.dtype, vals.shape[1:])
    fp = _FINGERPRINTS.get(key)
    if fp is None:
        fp = _FINGERPRINTS[key] = _fingerprint(str(lens.dtype), _dtype_tag(vals.dtype), vals.shape[1:])
        if lens.dtype == np.int64 and not vals.dtype.hasobject:  # the C call's kind (its datatypes cached)
            datatype(lens.dtype)
            datatype(vals.dtype)
            _C_FINGERPRINTS[key[1:]] = fp
    if validation._Flag.on:
        dtypes = (str(lens.dtype), _dtype_tag(vals.dtype), vals.shape[1:])
        validation.check(g, fn, {"lengths dtype, values dtype, value shape": dtypes})
    row = row_size(vals)
    item_bytes = (lens.itemsize, vals.itemsize * row)
    # the counts message: one row of _WIDE int64 words per destination, its lengths inline if they fit
    pad = _PAD
    if not async_op and lens.size <= _PYTHON_ROWS and max(splits, default=0) <= _INLINE:
        every, rows, i = lens.tolist(), [], 0
        for r, v in zip(splits, sent, strict=True):
            rows.append([0, fp, 0, r, v, 0, _IN_HEADER, *every[i : i + r], *pad[r:]])
            i += r
    else:
        mode = _NONBLOCKING if async_op else _BLOCKING
        rows = [[0, fp, 0, r, v, 0, mode, *pad] for r, v in zip(splits, sent, strict=True)]
    return _move(g, lens, vals, splits, sent, np.array(rows, dtype=np.int64), fp, item_bytes, fn, async_op)


_INT = frozenset((int,))
#: The counts message's dtype fingerprint per (lengths dtype, values dtype, value shape).
_FINGERPRINTS: dict[tuple[Any, ...], int] = {}
#: The same for int64 lengths, per (values dtype, value shape): the calls the C module serves once
#: the Python path has met their dtypes (and cached their MPI datatypes).
_C_FINGERPRINTS: dict[tuple[Any, ...], int] = {}
_EMPTY = np.empty
#: Lengths up to this many rows are summed per destination in Python (numpy's per-call cost is
#: larger there); longer ones with numpy.
_PYTHON_ROWS = 64
# Up to _INLINE rows per destination have their lengths ride in the counts message itself, after
# its _HEADER words: when every sender's rows fit, the lengths need no ``Alltoallv`` of their own
# (one collective fewer: the call is then the counts ``Alltoall`` and one ``Alltoallv``, as the raw
# two-step). Every message is _WIDE words a destination, whatever the path.
_WIDE = _JAGGED_WORDS
_PAD = [0] * _INLINE
# How the rows move, in each sender's _TOTAL word; every rank takes the largest word it receives,
# so all ranks make the same MPI calls (a blocking collective never matches a non-blocking one, so
# one rank's async_op makes every rank post Ialltoallv, and the blocking ones wait at once).
_MODE = _TOTAL
_IN_HEADER, _BLOCKING, _NONBLOCKING = 0, 1, 2
_MODES = frozenset((_IN_HEADER, _BLOCKING, _NONBLOCKING))


def _values_per_rank(lens: np.ndarray, splits: list[int], fn: str) -> list[int]:
    """The values each destination gets (exact Python ints); refuses negative or wrapping lengths."""
    if lens.size <= _PYTHON_ROWS:
        every = lens.tolist()
        if every and min(every) < 0:
            raise ArgumentError(f"{fn}: lengths has a negative entry {min(every)}; expected >= 0")
        out, i = [], 0
        for s in splits:
            out.append(sum(every[i : i + s]))
            i += s
        if sum(out) >= 2**63:
            raise ArgumentError(
                f"{fn}: lengths describe {sum(out)} values in all, past int64; expected a total below "
                "2**63 (numpy's sum would wrap it)"
            )
        return out
    if lens.min() < 0:
        raise ArgumentError(f"{fn}: lengths has a negative entry {lens.min()}; expected >= 0")
    _exact_total(lens, fn, "lengths")
    cum = _exclusive_cumsum(lens)
    ends: list[int] = cum[list(accumulate(splits, initial=0))].tolist()
    return [b - a for a, b in pairwise(ends)]


def _move(
    g: ProcessGroup,
    lens: np.ndarray,
    vals: np.ndarray,
    splits: list[int],
    sent: list[int],
    header: np.ndarray,
    fp: int,
    item_bytes: tuple[int, int],
    fn: str,
    async_op: bool,
) -> JaggedResult | Work:
    """The counts ``Alltoall``, then the rows: blocking calls, or ``Ialltoallv`` if any rank is async.

    Blocking: one ``Alltoallv`` of the values, and one of the lengths unless they came inline.
    The counts message from C (:mod:`mpicomm.core.cmpi`) where it is bound; the rows through mpi4py.
    """
    comm, i64 = g.internal, _mpi.MPI.INT64_T
    got = np.empty_like(header)
    if cmpi.alltoall(header, got, i64, comm) is NotImplemented:
        comm.Alltoall([header, i64], [got, i64])
    return _rows(g, lens, vals, splits, sent, got, fp, item_bytes, fn, async_op)


def _after_counts(
    g: ProcessGroup, lens: np.ndarray, vals: np.ndarray, splits: list[int], got: np.ndarray, fp: int, fn: str
) -> JaggedResult | Work:
    """Finish a call the C module began: it checked the arguments and sent the counts message."""
    sent = _values_per_rank(lens, splits, fn)
    item_bytes = (lens.itemsize, vals.itemsize * row_size(vals))
    return _rows(g, lens, vals, splits, sent, got, fp, item_bytes, fn, False)


def _rows(
    g: ProcessGroup,
    lens: np.ndarray,
    vals: np.ndarray,
    splits: list[int],
    sent: list[int],
    got: np.ndarray,
    fp: int,
    item_bytes: tuple[int, int],
    fn: str,
    async_op: bool,
) -> JaggedResult | Work:
    """Check the counts message received (untrusted), then move the lengths and the values."""
    comm = g.internal
    rows = got.tolist()
    for r in rows:  # the first three words are equal on every rank (flags, dtypes, splits)
        if r[_FLAGS] != 0 or r[_DTYPES] != fp or r[_SPLITS] != 0:
            _disagree(got, fn)
    recv_rows, recv_vals = [r[_ROWS] for r in rows], [r[_VALUES] for r in rows]
    modes = {r[_MODE] for r in rows}
    mode = max(modes)
    total_rows, total_vals = sum(recv_rows), sum(recv_vals)
    if (
        min(recv_rows) < 0
        or min(recv_vals) < 0
        or total_rows * item_bytes[0] + total_vals * item_bytes[1] > memory_bound()
    ):
        _check_claims(got, fn, item_bytes)
    if not modes <= _MODES:
        raise CommunicationError(f"{fn}: a rank sent an unknown mode {mode}: a corrupted message")
    out_v = np.empty((total_vals, *vals.shape[1:]), dtype=vals.dtype)
    if mode == _IN_HEADER:
        out_l = _inline_lengths(rows, lens.dtype, fn)
    else:
        out_l = np.empty(total_rows, dtype=lens.dtype)
    row = item_bytes[1] // vals.itemsize if vals.itemsize else row_size(vals)
    sc, rc = (sent, recv_vals) if row == 1 else ([c * row for c in sent], [c * row for c in recv_vals])
    if mode == _NONBLOCKING:
        requests = [
            _alltoallv(g, lens, splits, out_l, recv_rows),
            _alltoallv(g, vals, sent, out_v, recv_vals),
        ]
        if async_op:
            return Work(requests, keep=(lens, vals), result=[out_l, out_v, recv_rows])
        _mpi.MPI.Request.Waitall(requests)
        return _RESULT(JaggedResult, (out_l, out_v, recv_rows))
    dv = datatype(vals.dtype)
    if mode == _BLOCKING:
        _blocking_alltoallv(comm, lens, splits, out_l, recv_rows, datatype(lens.dtype))
    _blocking_alltoallv(comm, vals, sc, out_v, rc, dv)
    return _RESULT(JaggedResult, (out_l, out_v, recv_rows))


def _inline_lengths(rows: list[list[int]], dtype: np.dtype[Any], fn: str) -> np.ndarray:
    """The lengths every source sent inside its counts message, checked against its value count."""
    flat: list[int] = []
    for source, r in enumerate(rows):
        k = r[_ROWS]
        seg = r[_HEADER : _HEADER + k]
        if k > _INLINE or (seg and min(seg) < 0) or sum(seg) != r[_VALUES]:
            raise CommunicationError(
                f"{fn}: rank {source} sends {k} rows of lengths {seg} for {r[_VALUES]} values; expected at "
                f"most {_INLINE} non-negative lengths that add up to the values: a corrupted message or a "
                "rank that does not run mpicomm"
            )
        flat += seg
    try:
        return np.array(flat, dtype=dtype)
    except OverflowError:
        raise CommunicationError(
            f"{fn}: the lengths received do not fit their dtype {dtype}: a corrupted message"
        ) from None


def _blocking_alltoallv(
    comm: Any, send: np.ndarray, sc: list[int], recv: np.ndarray, rc: list[int], dt: Any
) -> None:
    """One blocking ``Alltoallv`` of elements.

    mpi4py's call on the count lists: building the int32 arrays the C call takes costs more than
    mpi4py's parsing of W-long lists (2.6 against 3.3 us a call on one rank, same run).
    """
    sd, rd = list(accumulate(sc, initial=0)), list(accumulate(rc, initial=0))
    sd.pop()
    rd.pop()
    comm.Alltoallv([send, (sc, sd), dt], [recv, (rc, rd), dt])


_RESULT = tuple.__new__


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
    header = np.zeros((g.size(), _WIDE), dtype=np.int64)  # the host path's width: a mix fails cleanly
    header[:, _MODE] = _BLOCKING
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
