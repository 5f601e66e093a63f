"""The jagged all-to-all: ``jagged_all_to_all`` for jagged arrays and ``KJTAllToAll`` for keyed ones.

Both run in two steps, as torchrec's ``KJTAllToAll`` does: one ``Alltoall`` of int64 counts (every
label's counts in one message), then the data, all posted before the call returns. The counts
message also carries fingerprints of the dtypes, flags and splits, so ranks that disagree about them
get the same :class:`~mpicomm.CrossRankMismatchError` on every rank instead of a hang or garbage,
even without validation mode. ``KJTAllToAll`` also sends the counts of every key in that message, so
each rank knows every (source, key) segment before the data moves: it then receives with
``Ialltoallw`` and indexed datatypes that put each segment in its final (key, source) place, or, for
small data, with ``Ialltoallv`` and a vectorised numpy gather (the recat) in ``wait()``.
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

# Per-destination int64 fields of the counts message. The first three must be equal on every rank.
# KJTAllToAll appends, per destination, the batch slots and then the value counts of each of that
# destination's keys, both padded to the largest split: the receiver learns every (source, key)
# segment from this one message.
_FLAGS, _DTYPES, _SPLITS, _ROWS, _VALUES, _STRIDE, _TOTAL = range(7)
_HEADER = 7


class _Placement:
    """From this many values per rank (on average), MPI places the segments itself (no recat copy).

    Below it, one ``Ialltoallv`` per array and a numpy gather; measured on MPICH the two paths meet
    at a few hundred values per rank, and above that the placed path wins by more and more.
    """

    min_values = 1024


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
    """Alltoall the per-destination counts; raise on every rank if the fingerprints disagree.

    Every rank sees every rank's fingerprint columns, so comparing them with its own is enough: if
    any two ranks differ, every rank sees a row unlike its own and raises.
    """
    received = np.empty_like(header)
    g.internal.Alltoall([header, _mpi.MPI.INT64_T], [received, _mpi.MPI.INT64_T])
    if received[:, : _SPLITS + 1].tobytes() != header[:, : _SPLITS + 1].tobytes():
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
        self._plan = _Plan(self.splits, self.stagger, g.rank)
        self._fp = _fingerprint(self.splits, self.stagger)
        self._agreed = g.size == 1
        self._templates: dict[tuple[int, int, int], np.ndarray] = {}
        self._fingerprints: dict[tuple[Any, ...], int] = {}
        self._rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, kja: KeyedJaggedArray) -> KJTAllToAllAwaitable:
        """Start the exchange of ``kja``; the returned handle's ``wait()`` gives this rank's output.

        The first call on a KJTAllToAll also checks, with one small ``Allreduce``, that every rank
        built it with the same splits and stagger (so call it on every rank of the group).

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
        flags, fp = self._describe(kja)
        if validation._Flag.on:
            dtypes = self._dtypes(kja)
            agree = {"splits": self.splits, "stagger": self.stagger, "keys": kja.keys(), "dtypes": dtypes}
            validation.check(g, fn, {**agree, "weighted": bool(flags & _WEIGHTED), "vbe": bool(flags & _VBE)})
        nkeys = len(kja._keys)
        if nkeys != self._plan.nkeys:
            raise ArgumentError(
                f"{fn}: the KeyedJaggedArray has {nkeys} keys; expected {self._plan.nkeys}, "
                f"the sum of splits {self.splits}"
            )
        if g.size == 1:
            return KJTAllToAllAwaitable(completed(), [kja])
        if not self._agreed:
            self._agree()
        return self._start(kja, flags, fp)

    def _agree(self) -> None:
        """Check once that every rank has the same splits and stagger (the counts message's width)."""
        mine = np.array([self._fp, -self._fp], dtype=np.int64)
        both = np.empty_like(mine)
        self.group.internal.Allreduce([mine, _mpi.MPI.INT64_T], [both, _mpi.MPI.INT64_T], op=_mpi.MPI.MAX)
        if both[0] != -both[1]:
            raise CrossRankMismatchError(
                f"KJTAllToAll: ranks disagree about splits or stagger (this rank: splits {self.splits}, "
                f"stagger {self.stagger}); expected the same on every rank"
            )
        self._agreed = True

    def _describe(self, kja: KeyedJaggedArray) -> tuple[int, int]:
        """The flags (VBE, weighted) and the dtype fingerprint of ``kja`` for the counts message."""
        w = kja.weights()
        flags = (_VBE if kja.variable_stride_per_key() else 0) | (_WEIGHTED if w is not None else 0)
        v, lens = kja.values(), kja.lengths()
        key = (lens.dtype, v.dtype, v.shape[1:], None if w is None else (w.dtype, w.shape[1:]))
        fp = self._fingerprints.get(key)
        if fp is None:
            fp = self._fingerprints[key] = _fingerprint(*self._dtypes(kja))
        return flags, fp

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
        """Exchange the counts (per destination and per key), then post the data messages."""
        header, rows, values = self._counts(kja, flags, fp)
        got = _exchange_header(self.group, header, "KJTAllToAll")
        # every rank sees every rank's total, so every rank takes the same path
        total = int(got[:, _TOTAL].sum())
        if row_size(kja.values()) and total >= _Placement.min_values * self._plan.size:
            return self._start_in_place(kja, header, got, rows, values, flags)
        return self._start_gather(kja, header, got, flags)

    def _counts(
        self, kja: KeyedJaggedArray, flags: int, fp: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The counts message, and where each destination's rows and values start in ``kja``."""
        plan = self._plan
        if flags & _VBE:
            spk = np.asarray(kja.stride_per_key(), dtype=np.int64)
            key_rows = _exclusive_cumsum(spk)
            header = self._template(flags, fp, -1)
            header[:, _STRIDE] = kja.stride()
            header.reshape(-1)[plan.row_slots] = spk
            rows = key_rows[plan.bounds]
            np.subtract(rows[1:], rows[:-1], out=header[:, _ROWS])
        else:  # everything about rows follows from the stride: cached with the template
            key_rows, rows = self._key_rows(kja.stride())
            header = self._template(flags, fp, kja.stride())
        key_values = kja.offsets()[key_rows]
        header.reshape(-1)[plan.value_slots] = key_values[1:] - key_values[:-1]
        values = key_values[plan.bounds]
        np.subtract(values[1:], values[:-1], out=header[:, _VALUES])
        header[:, _TOTAL] = kja.values().shape[0]
        return header, rows, values

    def _key_rows(self, stride: int) -> tuple[np.ndarray, np.ndarray]:
        """Where each key's rows start, and each destination's, for ``stride`` slots per key."""
        cached = self._rows.get(stride)
        if cached is None:
            key_rows = np.arange(self._plan.nkeys + 1, dtype=np.int64) * stride
            cached = self._rows[stride] = (key_rows, key_rows[self._plan.bounds])
        return cached

    def _template(self, flags: int, fp: int, stride: int) -> np.ndarray:
        """A fresh header with the columns fixed by these flags, dtypes and stride (-1: VBE) filled in."""
        template = self._templates.get((flags, fp, stride))
        if template is None:
            plan = self._plan
            template = np.zeros((plan.size, plan.width), dtype=np.int64)
            template[:, _FLAGS], template[:, _DTYPES], template[:, _SPLITS] = flags, fp, self._fp
            if stride >= 0:
                template[:, _STRIDE] = stride
                template.reshape(-1)[plan.row_slots] = stride
                rows = self._key_rows(stride)[1]
                template[:, _ROWS] = rows[1:] - rows[:-1]
            if len(self._templates) >= 64:
                self._templates.clear()
            self._templates[(flags, fp, stride)] = template
        fresh: np.ndarray = template.copy()
        return fresh

    def _output(
        self,
        kja: KeyedJaggedArray,
        got: np.ndarray,
        lengths: np.ndarray,
        values: np.ndarray,
        weights: np.ndarray | None,
        flags: int,
    ) -> KeyedJaggedArray:
        """This rank's output from arrays already in (key, source) order."""
        plan = self._plan
        strides = plan.rows(got) if flags & _VBE else None
        keys = kja._keys[plan.key_range]
        return _keyed(keys, lengths, values, weights, got[:, _STRIDE], strides, plan.order)

    def _start_gather(
        self, kja: KeyedJaggedArray, header: np.ndarray, got: np.ndarray, flags: int
    ) -> KJTAllToAllAwaitable:
        """Small exchanges: one Ialltoallv per array into (source, key) order, one gather each in wait()."""
        g, plan = self.group, self._plan
        lens, vals, w = send_view(kja.lengths()), send_view(kja.values()), kja.weights()
        recv_rows, recv_values = got[:, _ROWS], got[:, _VALUES]
        recv = [np.empty(int(recv_rows.sum()), dtype=lens.dtype)]
        recv.append(np.empty((int(recv_values.sum()), *vals.shape[1:]), dtype=vals.dtype))
        requests = [
            _alltoallv(g, lens, header[:, _ROWS], recv[0], recv_rows),
            _alltoallv(g, vals, header[:, _VALUES], recv[1], recv_values),
        ]
        if w is not None:
            w = send_view(w)
            recv.append(np.empty((recv[1].shape[0], *w.shape[1:]), dtype=w.dtype))
            requests.append(_alltoallv(g, w, header[:, _VALUES], recv[2], recv_values))
        # the gather indices depend only on the counts: build them while the data moves
        rows, vidx = _recat_index(plan.rows(got), plan.values(got), plan.order)
        out: list[KeyedJaggedArray] = []

        def finish() -> None:
            lengths, values, weights = _apply(
                rows, vidx, recv[0], recv[1], recv[2] if w is not None else None
            )
            out.append(self._output(kja, got, lengths, values, weights, flags))

        work = Work(requests, keep=(kja, header, recv), finish=finish)
        return KJTAllToAllAwaitable(work, out)

    def _start_in_place(
        self,
        kja: KeyedJaggedArray,
        header: np.ndarray,
        got: np.ndarray,
        rows: np.ndarray,
        values: np.ndarray,
        flags: int,
    ) -> KJTAllToAllAwaitable:
        """Large exchanges: MPI writes every (source, key) segment straight to its (key, source) place.

        One Ialltoallw per array, whose receive datatype for each source is an indexed type listing
        where that source's segments go. There is no recat copy at all.
        """
        g, plan = self.group, self._plan
        lens, vals, w = send_view(kja.lengths()), send_view(kja.values()), kja.weights()
        seg, at, totals = _key_major(plan.segments(got), plan.order, plan.position)
        arrays = [(lens, header[:, _ROWS], rows, 0), (vals, header[:, _VALUES], values, 1)]
        if w is not None:
            arrays.append((send_view(w), header[:, _VALUES], values, 1))
        recv, requests, types = [], [], []
        for x, sent, first, a in arrays:
            out_x, request, made = _place(
                g, x, sent, first, [s[a] for s in seg], [s[a] for s in at], totals[a]
            )
            recv.append(out_x)
            requests.append(request)
            types += made
        out: list[KeyedJaggedArray] = []

        def finish() -> None:
            for t in types:
                t.Free()
            out.append(self._output(kja, got, recv[0], recv[1], recv[2] if w is not None else None, flags))

        work = Work(requests, keep=(kja, header, arrays, recv), finish=finish)
        return KJTAllToAllAwaitable(work, out)


class _Plan:
    """What a KJTAllToAll computes once from its splits: where each key's counts go in the header.

    The counts message has one row per destination: the fixed columns, then ``maxk`` batch-slot
    counts and ``maxk`` value counts (``maxk`` = the largest split), one per key of that destination.
    """

    def __init__(self, splits: list[int], stagger: int, rank: int) -> None:
        size = len(splits)
        self.size, self.nkeys, self.maxk = size, sum(splits), max(splits, default=0)
        self.width = _HEADER + 2 * self.maxk
        self.bounds = _exclusive_cumsum(np.asarray(splits, dtype=np.int64))
        dest = np.repeat(np.arange(size, dtype=np.int64), splits)
        slot = dest * self.width + _HEADER + np.arange(self.nkeys, dtype=np.int64) - self.bounds[dest]
        self.row_slots, self.value_slots = slot, slot + self.maxk
        self.key_range = slice(int(self.bounds[rank]), int(self.bounds[rank + 1]))
        self.mine = splits[rank]
        n = size // stagger
        self.order = np.array([x + n * y for x in range(n) for y in range(stagger)], dtype=np.int64)
        self.position = np.argsort(self.order)  # column of source s in the output order

    def segments(self, got: np.ndarray) -> np.ndarray:
        """``[source, 0 or 1, key]``: batch slots (0) and values (1) of this rank's segments."""
        return got[:, _HEADER:].reshape(self.size, 2, self.maxk)[:, :, : self.mine]

    def rows(self, got: np.ndarray) -> np.ndarray:
        """Batch slots of segment (source, key) for this rank's keys, from the received counts."""
        return self.segments(got)[:, 0]

    def values(self, got: np.ndarray) -> np.ndarray:
        """Values of segment (source, key) for this rank's keys, from the received counts."""
        return self.segments(got)[:, 1]


def _key_major(
    seg: np.ndarray, order: np.ndarray, position: np.ndarray
) -> tuple[list[list[list[int]]], list[list[list[int]]], list[int]]:
    """Sizes and output starts of segments ``seg[s, a, k]`` laid out by key, then source in ``order``.

    ``a`` counts separate arrays (rows, values) laid out independently, each in its own output.

    Returns:
        ``seg`` and the starts as nested lists ``[s][a][k]`` (MPI's indexed-type arguments), and
        each array's total.

    Example:
        >>> seg, at, total = _key_major(np.array([[[1, 2]], [[3, 4]]]), np.arange(2), np.arange(2))
        >>> at, total        # source 0's key 0 at 0, key 1 at 4; source 1's at 1 and 6
        ([[[0, 4]], [[1, 6]]], [10])
    """
    size, arrays, nl = seg.shape
    ordered = seg[order].transpose(1, 2, 0).reshape(arrays, nl * size)
    ends = np.cumsum(ordered, axis=1)
    at = (ends - ordered).reshape(arrays, nl, size)[:, :, position].transpose(2, 0, 1)
    totals = ends[:, -1].tolist() if nl else [0] * arrays
    return seg.tolist(), at.tolist(), totals


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


def _place(
    g: ProcessGroup,
    x: np.ndarray,
    sent: np.ndarray,
    first: np.ndarray,
    seg: list[list[int]],
    at: list[list[int]],
    total: int,
) -> tuple[np.ndarray, Any, list[Any]]:
    """Post an Ialltoallw of ``x`` whose segment (s, k) of ``seg[s][k]`` rows lands at ``at[s][k]``.

    ``sent[d]`` rows of ``x`` from row ``first[d]`` go to rank d.

    Returns:
        The output array, the request and the datatypes to free once it completes.
    """
    base = _row_type(x.dtype, row_size(x))
    size = len(seg)
    out = np.empty((total, *x.shape[1:]), dtype=x.dtype)
    if seg and seg[0]:
        types = [base.Create_indexed(seg[s], at[s]).Commit() for s in range(size)]
        made, recv_counts = types, [1] * size
    else:
        types, made, recv_counts = [base] * size, [], [0] * size
    row_bytes = x.itemsize * row_size(x)
    send_at = (first[:-1] * row_bytes).tolist()
    request = g.internal.Ialltoallw(
        [x, (sent.tolist(), send_at), [base] * size],
        [out, (recv_counts, [0] * size), types],
    )
    return out, request, made


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
