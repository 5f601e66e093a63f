"""The jagged all-to-all: ``jagged_all_to_all`` for jagged arrays and ``KJTAllToAll`` for keyed ones.

Both run in two steps, as torchrec's ``KJTAllToAll`` does: one ``Alltoall`` of int64 counts (every
label's counts in one message), then the data, all posted before the call returns. The counts
message also carries fingerprints of the dtypes, flags and splits, so ranks that disagree about them
get the same :class:`~mpicomm.CrossRankMismatchError` on every rank instead of a hang or garbage,
even without validation mode. ``KJTAllToAll`` moves large data with ``Ialltoallw`` and indexed
receive datatypes that put each (source, key) segment in its final (key, source) place; small data
with ``Ialltoallv`` and a vectorised numpy gather (the recat) in ``wait()``.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from . import _mpi, validation
from .buffers import as_int_list, check_array, datatype, displacements, row_size, send_view
from .comm import ProcessGroup, resolve, warn_non_member
from .errors import ArgumentError, ArgumentTypeError, CrossRankMismatchError, GroupError
from .keyed import KeyedJaggedArray
from .work import Work, completed

__all__ = ["JaggedResult", "KJTAllToAll", "KJTAllToAllAwaitable", "KeyedJaggedArray", "jagged_all_to_all"]

# Per-destination int64 fields of the counts message.
_ROWS, _VALUES, _STRIDE, _FLAGS, _DTYPES, _SPLITS, _TOTAL = range(7)
_HEADER = 7


class _Placement:
    """Above this many values per rank (on average), MPI places the segments itself (no recat copy)."""

    min_values = 16384


_VBE, _WEIGHTED = 1, 2


class JaggedResult(NamedTuple):
    """What :func:`jagged_all_to_all` received: source 0's rows first, then source 1's, and so on."""

    lengths: np.ndarray
    values: np.ndarray
    splits: list[int]


def _fingerprint(*parts: object) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode())


def _exclusive_cumsum(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _segment_index(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Indices that gather ``counts[i]`` items from ``starts[i]`` for each i in turn (counts >= 0).

    Example:
        >>> _segment_index(np.array([5, 0, 2]), np.array([2, 0, 3])).tolist()
        [5, 6, 2, 3, 4]
    """
    if counts.size == 0:
        return np.empty(0, dtype=np.int64)
    ends = np.cumsum(counts, dtype=np.int64)
    return np.repeat(starts - (ends - counts), counts) + np.arange(int(ends[-1]), dtype=np.int64)


def _check_lengths(lengths: object, fn: str) -> np.ndarray:
    lens = send_view(check_array(lengths, fn, "lengths"))
    if lens.ndim != 1:
        raise ArgumentError(f"{fn}: lengths has shape {lens.shape}; expected a 1-D array")
    if lens.dtype.kind not in "iu":
        raise ArgumentTypeError(f"{fn}: lengths has dtype {lens.dtype}; expected an integer dtype")
    if lens.size and lens.min() < 0:
        raise ArgumentError(f"{fn}: lengths has a negative entry {lens.min()}; expected >= 0")
    return lens


def _check_values(values: object, fn: str, arg: str = "values") -> np.ndarray:
    vals = send_view(check_array(values, fn, arg))
    if vals.ndim == 0:
        raise ArgumentError(f"{fn}: {arg} is 0-dimensional; expected at least one dimension")
    return vals


def _exchange_header(g: ProcessGroup, header: np.ndarray, fn: str) -> np.ndarray:
    """Alltoall the per-destination counts; raise on every rank if the fingerprints disagree."""
    received = np.empty_like(header)
    g.internal.Alltoall([header, _mpi.MPI.INT64_T], [received, _mpi.MPI.INT64_T])
    agreed = received[:, _FLAGS : _SPLITS + 1]  # the columns every rank must send alike
    if (agreed != agreed[0]).any():
        _disagree(received, fn)
    return received


def _disagree(received: np.ndarray, fn: str) -> None:
    """Raise the mismatch error for the first column of ``received`` whose ranks disagree."""
    what = {_FLAGS: "weights or VBE", _DTYPES: "dtypes or value shapes", _SPLITS: "splits or stagger"}
    for column, name in what.items():
        col = received[:, column]
        if (col != col[0]).any():
            bad = int(np.flatnonzero(col != col[0])[0])
            raise CrossRankMismatchError(
                f"{fn}: ranks disagree about {name}: rank 0 and rank {bad} differ; expected the same on "
                "every rank (set MPICOMM_VALIDATE=1 to see the values)"
            )


def _alltoallv(g: ProcessGroup, send: np.ndarray, send_rows: Any, recv: np.ndarray, recv_rows: Any) -> Any:
    """Post one Ialltoallv of whole dim-0 rows (the counts are W-long lists: plain Python is fastest)."""
    row = row_size(send)
    sc = send_rows.tolist() if isinstance(send_rows, np.ndarray) else list(send_rows)
    rc = recv_rows.tolist() if isinstance(recv_rows, np.ndarray) else list(recv_rows)
    if row != 1:
        sc, rc = [c * row for c in sc], [c * row for c in rc]
    dt = datatype(send.dtype)
    return g.internal.Ialltoallv([send, (sc, displacements(sc)), dt], [recv, (rc, displacements(rc)), dt])


def jagged_all_to_all(
    values: np.ndarray,
    lengths: np.ndarray,
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
        >>> from mpicomm.jagged import jagged_all_to_all
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
        raise ArgumentTypeError(f"{fn}: send_splits is {send_splits!r}; expected a list of {g.size} ints")
    splits = as_int_list(send_splits, fn, "send_splits")
    if len(splits) != g.size:
        raise ArgumentError(
            f"{fn}: send_splits has {len(splits)} entries; expected {g.size} (the group size)"
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
    dtypes = (str(lens.dtype), vals.dtype.str, vals.shape[1:])
    if validation._Flag.on:
        validation.check(g, fn, {"lengths dtype, values dtype, value shape": dtypes})
    bounds = _exclusive_cumsum(np.asarray(splits, dtype=np.int64))
    header = np.zeros((g.size, _HEADER), dtype=np.int64)
    header[:, _ROWS] = splits
    header[:, _VALUES] = np.diff(cum[bounds])
    header[:, _DTYPES] = _fingerprint(*dtypes)
    got = _exchange_header(g, header, fn)
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


class KJTAllToAllAwaitable:
    """The pending output of a :class:`KJTAllToAll` call; :meth:`wait` returns it.

    The counts have been exchanged and the data messages posted when you get this handle, so work
    done before :meth:`wait` overlaps the transfer.
    """

    __slots__ = ("_out", "_work")

    def __init__(self, work: Work, out: list[KeyedJaggedArray]) -> None:
        self._work, self._out = work, out

    def wait(self) -> KeyedJaggedArray:
        """Block until the data has arrived, reorder it, and return this rank's KeyedJaggedArray."""
        self._work.wait()
        return self._out[0]

    def is_completed(self) -> bool:
        """Whether the data has arrived (never blocks)."""
        return self._work.is_completed()

    def __repr__(self) -> str:
        return f"<mpicomm.KJTAllToAllAwaitable {'completed' if self._work.is_completed() else 'pending'}>"


class KJTAllToAll:
    """Redistribute a KeyedJaggedArray by key: ``splits[r]`` consecutive keys go to rank r.

    Every rank holds the same keys in the same order, each with its own batch. Rank r receives its
    keys from every rank, and its output puts the batch slots **by key, then by source rank**
    (torchrec's recat); its stride is the sum of the source strides. torchrec's docstring example,
    keys ``[A, B, C]``, ``splits=[2, 1]``, values made concrete (a cell is one batch slot's row):

    ========  =======================================  =============================================
    rank      input (keys A, B, C; 3 slots each)        output
    ========  =======================================  =============================================
    0         A: [100] [] [101,102]                     A: [100] [] [101,102] [103] [104] []
              B: [] [200] [201]                         B: [] [200] [201] [] [202] [203,204]
              C: [300] [301] []
    1         A: [103] [104] []                         C: [300] [301] [] [302] [303] []
              B: [] [202] [203,204]
              C: [302] [303] []
    ========  =======================================  =============================================

    Also handled: different batch sizes per rank, variable batch per key
    (``stride_per_key_per_rank``), weights, ranks with 0 keys (they still get the stride), and
    ``stagger`` > 1 (source order ``[x + (W // stagger) * y for x in range(W // stagger) for y in
    range(stagger)]``, for table-wise-row-wise sharding). At world size 1 nothing is sent and the
    input is returned.

    Args:
        splits: Keys per destination rank; the same on every rank.
        group: The process group; ``None`` for the world.
        stagger: Source-order stagger; must divide the group size.

    Raises:
        ArgumentTypeError: splits or stagger are not integers.
        ArgumentError: ``len(splits)`` is not the group size, a negative split, a bad stagger.
        GroupError: this rank is not in ``group``.

    Example:
        >>> import numpy as np, mpicomm
        >>> from mpicomm.jagged import KJTAllToAll, KeyedJaggedArray
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> keys = [f"k{i}" for i in range(w)]         # one key per rank, one slot per key
        >>> kja = KeyedJaggedArray(keys, np.full(w, 10 * r), lengths=np.ones(w, dtype=np.int64))
        >>> out = KJTAllToAll([1] * w)(kja).wait()
        >>> out.keys() == [f"k{r}"], out.stride() == w, out.values().tolist() == [10 * s for s in range(w)]
        (True, True, True)
    """

    def __init__(self, splits: Sequence[int], group: ProcessGroup | None = None, stagger: int = 1) -> None:
        fn = "KJTAllToAll"
        g = resolve(group, fn)
        if g.comm is None:
            raise GroupError(f"{fn}: this rank is not a member of group {g.name}; expected a member rank")
        if isinstance(splits, (str, bytes)) or not isinstance(splits, (list, tuple, np.ndarray)):
            raise ArgumentTypeError(f"{fn}: splits is {splits!r}; expected a list of {g.size} ints")
        self.splits = as_int_list(splits, fn, "splits")
        if len(self.splits) != g.size:
            raise ArgumentError(
                f"{fn}: splits has {len(self.splits)} entries; expected {g.size} (the group size)"
            )
        if isinstance(stagger, bool) or not isinstance(stagger, (int, np.integer)):
            raise ArgumentTypeError(f"{fn}: stagger is {stagger!r}; expected a positive int")
        if stagger < 1 or g.size % stagger:
            raise ArgumentError(
                f"{fn}: stagger is {stagger}; expected a positive divisor of {g.size} (the group size)"
            )
        self.group, self.stagger = g, int(stagger)
        n = g.size // self.stagger
        self._order = np.array([x + n * y for x in range(n) for y in range(self.stagger)], dtype=np.int64)
        self._bounds = _exclusive_cumsum(np.asarray(self.splits, dtype=np.int64))
        self._fp = _fingerprint(self.splits, self.stagger)
        self._templates: dict[tuple[int, int], np.ndarray] = {}
        self._fingerprints: dict[tuple[Any, ...], int] = {}

    def __call__(self, kja: KeyedJaggedArray) -> KJTAllToAllAwaitable:
        """Start the exchange of ``kja``; the returned handle's ``wait()`` gives this rank's output.

        Raises:
            ArgumentTypeError: ``kja`` is not a KeyedJaggedArray.
            ArgumentError: its number of keys is not ``sum(splits)``.
            CrossRankMismatchError: ranks disagree about splits, stagger, dtypes, weights or VBE
                (always checked) or keys (validation mode); raised on every rank.
        """
        fn, g = "KJTAllToAll", self.group
        if not isinstance(kja, KeyedJaggedArray):
            raise ArgumentTypeError(
                f"{fn}: the input is a {type(kja).__qualname__}; expected a KeyedJaggedArray"
            )
        w = kja.weights()
        flags = (_VBE if kja.variable_stride_per_key() else 0) | (_WEIGHTED if w is not None else 0)
        v, lens = kja.values(), kja.lengths()
        key = (lens.dtype, v.dtype, v.shape[1:], None if w is None else (w.dtype, w.shape[1:]))
        fp = self._fingerprints.get(key)
        if fp is None:
            fp = self._fingerprints[key] = _fingerprint(*self._dtypes(kja))
        if validation._Flag.on:
            dtypes = self._dtypes(kja)
            agree = {"splits": self.splits, "stagger": self.stagger, "keys": kja.keys(), "dtypes": dtypes}
            validation.check(
                g, fn, {**agree, "weighted": w is not None, "vbe": kja.variable_stride_per_key()}
            )
        nkeys = len(kja.keys())
        if nkeys != int(self._bounds[-1]):
            raise ArgumentError(
                f"{fn}: the KeyedJaggedArray has {nkeys} keys; expected {int(self._bounds[-1])}, "
                f"the sum of splits {self.splits}"
            )
        if g.size == 1:
            return KJTAllToAllAwaitable(completed(), [kja])
        return self._start(kja, flags, fp)

    @staticmethod
    def _dtypes(kja: KeyedJaggedArray) -> tuple[Any, ...]:
        """What ranks must agree on about the arrays: dtypes and trailing shapes."""
        v, w = kja.values(), kja.weights()
        return (
            str(kja.lengths().dtype),
            v.dtype.str,
            v.shape[1:],
            None if w is None else (w.dtype.str, w.shape[1:]),
        )

    def _start(self, kja: KeyedJaggedArray, flags: int, fp: int) -> KJTAllToAllAwaitable:
        g, b = self.group, self._bounds
        if flags & _VBE:
            spk = np.asarray(kja.stride_per_key(), dtype=np.int64)
            rows = _exclusive_cumsum(spk)[b]
            bounds = np.asarray(kja.offset_per_key(), dtype=np.int64)[b]
        else:
            spk = None
            rows = b * kja.stride()
            bounds = kja.offsets()[rows]
        header = self._template(flags, fp)
        np.subtract(rows[1:], rows[:-1], out=header[:, _ROWS])
        np.subtract(bounds[1:], bounds[:-1], out=header[:, _VALUES])
        header[:, _STRIDE] = kja.stride()
        header[:, _TOTAL] = kja.values().shape[0]
        got = _exchange_header(g, header, "KJTAllToAll")
        # every rank sees every rank's total, so every rank takes the same path
        if row_size(kja.values()) and int(got[:, _TOTAL].sum()) >= _Placement.min_values * g.size:
            if spk is None:
                spk = np.full(len(kja.keys()), kja.stride(), dtype=np.int64)
            return self._start_in_place(kja, header, got, spk, flags)
        return self._start_gather(kja, header, got, spk, flags)

    def _template(self, flags: int, fp: int) -> np.ndarray:
        """A fresh header with the columns that are fixed for these flags and dtypes filled in."""
        template = self._templates.get((flags, fp))
        if template is None:
            template = np.zeros((self.group.size, _HEADER), dtype=np.int64)
            template[:, _FLAGS], template[:, _DTYPES], template[:, _SPLITS] = flags, fp, self._fp
            self._templates[(flags, fp)] = template
        fresh: np.ndarray = template.copy()
        return fresh

    def _start_gather(
        self, kja: KeyedJaggedArray, header: np.ndarray, got: np.ndarray, spk: np.ndarray | None, flags: int
    ) -> KJTAllToAllAwaitable:
        """Small exchanges: Ialltoallv into (source, key) order, then one gather per array in wait()."""
        g, b = self.group, self._bounds
        lens, vals, w = kja.lengths(), send_view(kja.values()), kja.weights()
        nl = self.splits[g.rank]
        recv = [np.empty(int(got[:, _ROWS].sum()), dtype=lens.dtype)]
        recv.append(np.empty((int(got[:, _VALUES].sum()), *vals.shape[1:]), dtype=vals.dtype))
        requests = [
            _alltoallv(g, send_view(lens), header[:, _ROWS], recv[0], got[:, _ROWS]),
            _alltoallv(g, vals, header[:, _VALUES], recv[1], got[:, _VALUES]),
        ]
        if w is not None:
            w = send_view(w)
            recv.append(np.empty((recv[1].shape[0], *w.shape[1:]), dtype=w.dtype))
            requests.append(_alltoallv(g, w, header[:, _VALUES], recv[2], got[:, _VALUES]))
        if spk is not None:  # VBE
            recv.append(np.empty(nl * g.size, dtype=np.int64))
            requests.append(_alltoallv(g, spk, self.splits, recv[-1], [nl] * g.size))
        out: list[KeyedJaggedArray] = []
        keys = kja.keys()[b[g.rank] : b[g.rank + 1]]

        def finish() -> None:
            strides = recv[-1].reshape(g.size, nl) if flags & _VBE else None
            weights = recv[2] if w is not None else None
            out.append(_recat(keys, recv[0], recv[1], weights, got[:, _STRIDE], strides, self._order))

        work = Work(requests, keep=(kja, header, spk, recv), finish=finish)
        return KJTAllToAllAwaitable(work, out)

    def _start_in_place(
        self, kja: KeyedJaggedArray, header: np.ndarray, got: np.ndarray, spk: np.ndarray, flags: int
    ) -> KJTAllToAllAwaitable:
        """Large exchanges: MPI writes every (source, key) segment straight to its (key, source) place.

        One more small Alltoallv brings the per-key counts; then one Ialltoallw per array, whose
        receive datatype for each source is an indexed type listing where that source's segments
        go. There is no recat copy at all.
        """
        g, b, me = self.group, self._bounds, self.group.rank
        nl, vbe = self.splits[me], bool(flags & _VBE)
        per_key = np.diff(np.asarray(kja.offset_per_key(), dtype=np.int64))
        send = np.ascontiguousarray(np.stack([per_key, spk], axis=1) if vbe else per_key[:, None])
        width = send.shape[1]
        counts = np.empty((g.size, nl, width), dtype=np.int64)
        _alltoallv(g, send, self.splits, counts, [nl] * g.size).Wait()
        values_sk = counts[:, :, 0]
        rows_sk = counts[:, :, 1] if vbe else np.repeat(got[:, _STRIDE][:, None], nl, axis=1)
        lens, vals, w = send_view(kja.lengths()), send_view(kja.values()), kja.weights()
        arrays = [(lens, header[:, _ROWS], rows_sk), (vals, header[:, _VALUES], values_sk)]
        if w is not None:
            arrays.append((send_view(w), header[:, _VALUES], values_sk))
        recv, requests, types = [], [], []
        for x, sent, seg in arrays:
            out_x, request, made = _place(g, x, sent, seg, self._order)
            recv.append(out_x)
            requests.append(request)
            types += made
        out: list[KeyedJaggedArray] = []
        keys = kja.keys()[b[me] : b[me + 1]]

        def finish() -> None:
            for t in types:
                t.Free()
            weights = recv[2] if w is not None else None
            if not vbe:
                stride = int(got[:, _STRIDE].sum())
                out.append(KeyedJaggedArray._trusted(keys, recv[1], recv[0], weights, stride, None))
                return
            table = rows_sk.T[:, self._order]
            stride = int(table.sum(axis=1).max()) if nl else 0
            out.append(KeyedJaggedArray._trusted(keys, recv[1], recv[0], weights, stride, table.tolist()))

        work = Work(requests, keep=(kja, header, counts, arrays, recv), finish=finish)
        return KJTAllToAllAwaitable(work, out)


def _place(
    g: ProcessGroup, x: np.ndarray, sent: np.ndarray, seg: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray, Any, list[Any]]:
    """Post an Ialltoallw of ``x`` whose segment (s, k) of ``seg[s, k]`` rows lands in (key, source) order.

    Returns:
        The output array, the request and the datatypes to free once it completes.
    """
    nl = seg.shape[1]
    row, elem = row_size(x), datatype(x.dtype)
    base = elem if row == 1 else elem.Create_contiguous(row).Commit()
    made = [] if row == 1 else [base]
    position = np.argsort(order)  # column of source s in the output order
    ordered = seg[order, :].T  # (key, output column)
    start = _exclusive_cumsum(ordered.reshape(-1))
    displs = start[:-1].reshape(nl, seg.shape[0])[:, position].T  # (source, key)
    out = np.empty((int(start[-1]), *x.shape[1:]), dtype=x.dtype)
    if nl:
        types = [
            base.Create_indexed(seg[s].tolist(), displs[s].tolist()).Commit() for s in range(seg.shape[0])
        ]
        made += types
        recv_counts = [1] * seg.shape[0]
    else:
        types, recv_counts = [base] * seg.shape[0], [0] * seg.shape[0]
    send_bytes = _exclusive_cumsum(np.asarray(sent, dtype=np.int64))[:-1] * (row * x.itemsize)
    request = g.internal.Ialltoallw(
        [x, (np.asarray(sent).tolist(), send_bytes.tolist()), [base] * seg.shape[0]],
        [out, (recv_counts, [0] * seg.shape[0]), types],
    )
    return out, request, made


#: Row permutations of the recat, by (keys, segment rows, source order); None for the identity.
_ROW_PERMS: dict[tuple[int, bytes, bytes], np.ndarray | None] = {}


def _row_permutation(nk: int, seg: np.ndarray, order: np.ndarray) -> np.ndarray | None:
    """Source rows in output order, for segments of ``seg[s, k]`` rows (cached: the layout repeats)."""
    key = (nk, seg.tobytes(), order.tobytes())
    if key in _ROW_PERMS:
        return _ROW_PERMS[key]
    flat = seg.reshape(-1)
    perm = (order[None, :] * nk + np.arange(nk)[:, None]).reshape(-1)
    rows: np.ndarray | None = None
    if nk and not np.array_equal(perm, np.arange(perm.size)):
        rows = _segment_index(_exclusive_cumsum(flat)[:-1][perm], flat[perm])
    if len(_ROW_PERMS) >= 256:
        _ROW_PERMS.clear()
    _ROW_PERMS[key] = rows
    return rows


def _recat(
    keys: list[str],
    lengths: np.ndarray,
    values: np.ndarray,
    weights: np.ndarray | None,
    stride_per_rank: np.ndarray,
    strides: np.ndarray | None,
    order: np.ndarray,
) -> KeyedJaggedArray:
    """Reorder the received ``(source, key)`` segments into ``(key, source)`` order with one gather each.

    ``strides[s, k]`` (VBE) or ``stride_per_rank[s]`` is the number of batch slots of segment (s, k).
    The row permutation depends only on that layout, which repeats from call to call, so it is
    cached; the values follow their rows through one gather index built from the lengths.
    """
    nk = len(keys)
    seg = strides if strides is not None else np.repeat(stride_per_rank[:, None], nk, axis=1)
    rows = _row_permutation(nk, seg, order)
    if rows is not None:
        starts = _exclusive_cumsum(lengths)[rows]
        lengths = lengths[rows]
        vidx = _segment_index(starts, lengths)
        values = values[vidx]
        weights = None if weights is None else weights[vidx]
    if strides is None:
        return KeyedJaggedArray._trusted(keys, values, lengths, weights, int(stride_per_rank.sum()), None)
    table = strides.T[:, order]
    stride = int(table.sum(axis=1).max()) if nk else 0
    return KeyedJaggedArray._trusted(keys, values, lengths, weights, stride, table.tolist())
