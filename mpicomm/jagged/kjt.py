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

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _mpi
from ..core import validation
from ..core.buffers import as_int_list, row_size, send_view
from ..core.calls import collective
from ..core.groups import ProcessGroup, resolve
from ..core.work import Work, completed
from ..errors import ArgumentError, ArgumentTypeError, CrossRankMismatchError, GroupError
from .keyed import KeyedJaggedArray
from .placement import _apply, _key_major, _keyed, _place, _recat_index
from .wire import (
    _DTYPES,
    _FLAGS,
    _HEADER,
    _ROWS,
    _SPLITS,
    _STRIDE,
    _TOTAL,
    _VALUES,
    _VBE,
    _WEIGHTED,
    _alltoallv,
    _exchange_header,
    _exclusive_cumsum,
    _fingerprint,
)

__all__ = ["KJTAllToAll", "KJTAllToAllAwaitable"]


class _Placement:
    """From this many values per rank (on average), MPI places the segments itself (no recat copy).

    Below it, one ``Ialltoallv`` per array and a numpy gather; measured on MPICH the two paths meet
    at a few hundred values per rank, and above that the placed path wins by more and more.
    """

    min_values = 1024


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

    Two call forms: torchrec's positional order ``KJTAllToAll(pg, splits, device=None, stagger=1)``
    (``pg`` may be None for the world; ``device`` is accepted and not used), and mpicomm's
    ``KJTAllToAll(splits, group=None, stagger=1)``. torchrec's ``awaitable.wait().wait()`` chain
    works too: the first ``wait()`` already gives the KeyedJaggedArray, whose ``wait()`` returns itself.

    Args:
        pg: The process group (torchrec's first argument), or the splits (mpicomm's form).
        splits: Keys per destination rank; the same on every rank.
        device: Accepted for torchrec compatibility: None or a device name such as ``"cpu"``.
        stagger: Source-order stagger; must divide the group size.
        group: The process group, by keyword (mpicomm's form).

    Raises:
        ArgumentTypeError: splits or stagger are not integers, or a ``device`` that is a number.
        ArgumentError: ``len(splits)`` is not the group size, a negative split, a bad stagger, no
            splits, or a group given twice.
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
        >>> pg = mpicomm.init()                        # torchrec's order, and its wait().wait()
        >>> KJTAllToAll(pg, [1] * w, None)(kja).wait().wait() == out
        True
    """

    def __init__(
        self,
        pg: ProcessGroup | Sequence[int] | None = None,
        splits: Sequence[int] | None = None,
        device: Any = None,
        stagger: int = 1,
        *,
        group: ProcessGroup | None = None,
    ) -> None:
        fn = "KJTAllToAll"
        group, splits = _call_form(pg, splits, device, group, fn)
        g = resolve(group, fn)
        if g.comm is None:
            raise GroupError(f"{fn}: this rank is not a member of group {g.name}; expected a member rank")
        if isinstance(splits, (str, bytes)) or not isinstance(splits, (list, tuple, np.ndarray)):
            raise ArgumentTypeError(f"{fn}: splits is {splits!r}; expected a list of {g.size()} ints")
        self.splits = as_int_list(splits, fn, "splits")
        if len(self.splits) != g.size():
            raise ArgumentError(
                f"{fn}: splits has {len(self.splits)} entries; expected {g.size()} (the group size)"
            )
        if isinstance(stagger, bool) or not isinstance(stagger, (int, np.integer)):
            raise ArgumentTypeError(f"{fn}: stagger is {stagger!r}; expected a positive int")
        if stagger < 1 or g.size() % stagger:
            raise ArgumentError(
                f"{fn}: stagger is {stagger}; expected a positive divisor of {g.size()} (the group size)"
            )
        self.group, self.stagger = g, int(stagger)
        self._plan = _Plan(self.splits, self.stagger, g.rank())
        self._fp = _fingerprint(self.splits, self.stagger)
        self._agreed = g.size() == 1
        self._templates: dict[tuple[int, int, int], np.ndarray] = {}
        self._fingerprints: dict[tuple[Any, ...], int] = {}
        self._rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @collective("KJTAllToAll", group_of=lambda bound: bound["self"].group)
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
        if g.size() == 1:
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


def _call_form(
    pg: ProcessGroup | Sequence[int] | None,
    splits: Sequence[int] | None,
    device: Any,
    group: ProcessGroup | None,
    fn: str,
) -> tuple[ProcessGroup | None, Sequence[int]]:
    """``(group, splits)`` from torchrec's ``(pg, splits, device)`` or mpicomm's ``(splits, group=)``."""
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        raise ArgumentTypeError(
            f"{fn}: device is {device!r}; expected None or a device name (torchrec's order is pg, splits, "
            f"device, stagger: write stagger={device} by keyword)"
        )
    if isinstance(splits, ProcessGroup) and not isinstance(pg, ProcessGroup):
        pg, splits = splits, pg  # mpicomm's earlier positional form: KJTAllToAll(splits, group)
    if isinstance(pg, ProcessGroup) or (pg is None and splits is not None):
        if pg is not None and group is not None:
            raise ArgumentError(f"{fn}: the group is given twice (pg and group=); expected one of them")
        if splits is None:
            raise ArgumentError(f"{fn}: no splits given; expected KJTAllToAll(pg, splits)")
        return (group if pg is None else pg), splits
    if splits is not None:
        raise ArgumentTypeError(
            f"{fn}: pg is {pg!r}; expected a mpicomm.ProcessGroup or None before splits (torchrec's order), "
            "or KJTAllToAll(splits, group=...)"
        )
    if pg is None:
        raise ArgumentError(f"{fn}: no splits given; expected KJTAllToAll(pg, splits) or KJTAllToAll(splits)")
    return group, pg


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
