"""KJTAllToAll's plans: what a call of a given shape computes once, kept in small bounded caches.

A :class:`Layout` follows from the splits alone. A :class:`SendPlan` follows from this rank's shape
(stride or VBE strides, dtypes, weights): the counts message's fixed part and where the counts go. A
:class:`RecvPlan` follows from the shape every source announces in the counts message: receive
counts and displacements of the lengths, the output stride, and the recat index of the rows. Only
what depends on the lengths themselves (value counts, the value recat index) is computed per call.

The counts message of KJTAllToAll has one int64 row per destination::

    [FLAGS, DTYPES, SPLITS, STRIDE, rows of key 0 .. maxk-1, INLINE, TOTAL, values of key 0 .. maxk-1,
     lengths 0 .. cap-1]

where ``maxk`` is the largest split (keys of a smaller split are padded with 0). Everything before
TOTAL is the *shape* of the call; a receiver that has seen the same shape bytes before, checked,
reuses its :class:`RecvPlan`. The value counts are checked whenever they change
(:mod:`mpicomm.jagged.repeat` keeps what follows from them). A sender whose batch slots for every
destination fit in the ``cap`` words of a row sets INLINE and sends its lengths there, cast to
int64: when every source does, no rank sends lengths in a second message (``cap`` is 0 past 100 or
so ranks, where the counts message would grow too much).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from itertools import accumulate
from typing import Any, Generic, TypeVar

import numpy as np

from .. import _mpi
from ..core.control import memory_bound
from ..errors import CommunicationError, CrossRankMismatchError
from .placement import _gather_index, _row_type, indexed_types
from .wire import _DTYPES, _FLAGS, _SPLITS, _VBE, _disagree, _exclusive_cumsum, _segment_index

__all__ = ["Layout", "Lru", "RecvPlan", "SendPlan", "starts"]

_STRIDE, _ROWS0 = 3, 4
#: Words of a counts-message row for lengths sent inline: at most ``_INLINE_MAX``, and at most
#: ``_INLINE_BUDGET`` words in the whole message (the Alltoall costs about the same up to there).
_INLINE_MAX, _INLINE_BUDGET = 64, 1024
_FIXED = _SPLITS + 1  # the columns every rank must send alike
#: A FLAGS bit: the sender hands device memory to a CUDA-aware MPI, so every rank must take the
#: blocking path (CUDA-aware MPIs do not take device memory in non-blocking collectives).
_DIRECT = 4

K = TypeVar("K")
V = TypeVar("V")


class Lru(Generic[K, V]):
    """A dict that keeps the ``capacity`` most recently used entries, calling ``drop`` on the rest.

    Example:
        >>> cache: Lru[str, int] = Lru(2)
        >>> cache.put("a", 1); cache.put("b", 2); cache.get("a"); cache.put("c", 3)
        1
        >>> cache.values()
        [1, 3]
    """

    __slots__ = ("_data", "_last", "capacity", "drop")

    def __init__(self, capacity: int, drop: Any = None) -> None:
        self._data: OrderedDict[K, V] = OrderedDict()
        self._last: tuple[Any, V | None] = (object(), None)  # the most recent entry: one compare
        self.capacity, self.drop = capacity, drop

    def get(self, key: K) -> V | None:
        """The entry for ``key`` (now the most recently used), or None."""
        last, value = self._last
        if key == last:
            return value
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
            self._last = (key, value)
        return value

    def put(self, key: K, value: V) -> None:
        """Insert ``key``, evicting the least recently used entry past the capacity."""
        self._data[key] = value
        self._last = (key, value)
        while len(self._data) > self.capacity:
            _, old = self._data.popitem(last=False)
            if self.drop is not None:
                self.drop(old)

    def values(self) -> list[V]:
        """The entries, least recently used first."""
        return list(self._data.values())

    def __len__(self) -> int:
        return len(self._data)


class Layout:
    """What a KJTAllToAll computes once from its splits, stagger and this rank.

    Attributes:
        size: The group size.
        nkeys: The keys of every input (``sum(splits)``).
        maxk: The largest split: the counts message has ``maxk`` row and value slots per destination.
        mine: This rank's split (the keys it receives).
        order: Source order of the output (the stagger); ``position`` is its inverse.
        perm: For each output cell (key, source position), the (source, key) cell it comes from.
    """

    def __init__(self, splits: list[int], stagger: int, rank: int) -> None:
        size = len(splits)
        self.size, self.nkeys, self.maxk = size, sum(splits), max(splits, default=0)
        self.inline_col = _ROWS0 + self.maxk
        self.total_col, self.values0 = self.inline_col + 1, self.inline_col + 2
        self.lengths0 = self.values0 + self.maxk
        self.cap = max(0, min(_INLINE_MAX, _INLINE_BUDGET // size - self.lengths0))
        self.width = self.lengths0 + self.cap
        self.bounds = _exclusive_cumsum(np.asarray(splits, dtype=np.int64))
        self.uniform = len(set(splits)) <= 1
        #: Picks each destination's first key (and the end) out of the nkeys + 1 key offsets.
        by_step = self.uniform and self.maxk > 0
        self.dest_index: slice | np.ndarray = slice(None, None, self.maxk) if by_step else self.bounds
        dest = np.repeat(np.arange(size, dtype=np.int64), splits)
        slot = dest * self.width + np.arange(self.nkeys, dtype=np.int64) - self.bounds[dest]
        self.row_slots, self.value_slots = slot + _ROWS0, slot + self.values0
        self.key_range = slice(int(self.bounds[rank]), int(self.bounds[rank + 1]))
        self.mine = splits[rank]
        n = size // stagger
        self.order = np.array([x + n * y for x in range(n) for y in range(stagger)], dtype=np.int64)
        self.position = np.argsort(self.order)
        self.in_order = bool(np.array_equal(self.order, np.arange(size)))
        nk = self.mine
        self.perm = (self.order[None, :] * nk + np.arange(nk)[:, None]).reshape(-1)
        self.identity = bool(np.array_equal(self.perm, np.arange(self.perm.size)))
        # the output cell of each (source, key) cell, as a small label for a stable radix argsort
        label = np.uint16 if self.perm.size < 1 << 16 else np.int64
        self.cell_of = np.empty(self.perm.size, dtype=label)
        self.cell_of[self.perm] = np.arange(self.perm.size)
        self.bound = memory_bound()
        self.rank, self.zeros = rank, [0] * size
        self.ones = [int(s != rank) for s in range(size)]  # a type from each peer; this rank copies locally
        # counts checked against the bound one by one cannot wrap an int64 sum over all of them
        self.sums_exact = size * max(nk, 1) * self.bound < 1 << 63

    def recv(self, out: np.ndarray, types: list[Any], base: Any) -> list[Any]:
        """Alltoallw's receive arguments: one of each indexed type at ``out``, or nothing without keys."""
        if types:
            return [out, (self.ones, self.zeros), types]
        return [out, (self.zeros, self.zeros), [base] * self.size]

    def empty_header(self) -> np.ndarray:
        """A zeroed counts message."""
        return np.zeros((self.size, self.width), dtype=np.int64)


class RecvPlan:
    """What the receiver derives from the shape the sources announced (checked once, then reused).

    Attributes:
        counts, displs: Batch slots from each source and where they start, in (source, key) order.
        total: All batch slots received.
        stride: The output's stride; ``table`` its VBE ``[key][source]`` table (None without VBE).
        rows_sk: Batch slots of segment (source, key).
        row_index: The gather that puts received lengths in (key, source) order (None: already).
        inline: Every source sent its lengths in the counts message; ``inline_index`` then picks
            them out of the flattened message in (key, source) order.
        arrived: What follows from the value counts (:mod:`mpicomm.jagged.repeat`), by those counts.
    """

    __slots__ = (
        "__weakref__",
        "_types",
        "arrived",
        "counts",
        "device_rows",
        "displs",
        "inline",
        "inline_index",
        "row_index",
        "rows_sk",
        "stride",
        "table",
        "total",
    )

    def __init__(self, layout: Layout, got: np.ndarray, vbe: bool, fn: str = "KJTAllToAll") -> None:
        rows_sk = np.ascontiguousarray(got[:, _ROWS0 : _ROWS0 + layout.mine])
        self.rows_sk = rows_sk
        self.counts = rows_sk.sum(axis=1).tolist()
        self.displs = starts(self.counts)
        self.total = sum(self.counts)
        if vbe:
            table = rows_sk.T[:, layout.order]
            self.stride = int(table.sum(axis=1).max()) if table.size else 0
            self.table: list[list[int]] | None = table.tolist()
        else:
            self.stride, self.table = int(got[:, _STRIDE].sum()), None
        self.row_index = None if layout.identity else _gather_index(rows_sk.reshape(-1), layout.perm)
        self.inline = _inline_sources(got, layout, self.counts, fn)
        self.inline_index: np.ndarray | None = None
        if self.inline:  # source s's lengths start at word s * width + lengths0 of the message
            first = np.arange(layout.size, dtype=np.int64) * layout.width + layout.lengths0
            at = _segment_index(first, rows_sk.sum(axis=1))
            self.inline_index = at if self.row_index is None else at[self.row_index]
        self.arrived: Lru[bytes, Any] = Lru(_ARRIVED, _free)
        self._types: list[Any] | None = None
        #: The row index on a device, as (device id, array), made by the device path on first use.
        self.device_rows: tuple[int, Any] | None = None

    def row_types(self, layout: Layout, base: Any) -> list[Any]:
        """Per source, the indexed datatype that puts its lengths in place (made once, freed with the plan).

        Empty when this rank has no keys (nothing to place).
        """
        if self._types is None:
            self._types = indexed_types(base, *_segments_by_key(self.rows_sk, layout))
            weakref.finalize(self, free_types, self._types)
        return self._types

    def free(self) -> None:
        """Free the datatypes now (an evicted plan; requests still using them complete normally)."""
        if self._types:
            free_types(self._types)
            self._types.clear()
        for arrived in self.arrived.values():
            arrived.free()


#: Value-count plans a receive plan keeps (:mod:`mpicomm.jagged.repeat`).
_ARRIVED = 4


def _free(plan: Any) -> None:
    plan.free()


def _inline_sources(got: np.ndarray, layout: Layout, counts: list[int], fn: str) -> bool:
    """Whether every source sent its lengths inline; checks the INLINE flags and their batch slots.

    Raises:
        CommunicationError: a flag other than 0 or 1, or more inline lengths than a row holds.
    """
    flags = got[:, layout.inline_col]
    inline = flags == 1
    if not (inline | (flags == 0)).all():
        bad = int(np.flatnonzero(~(inline | (flags == 0)))[0])
        raise CommunicationError(
            f"{fn}: rank {bad} sends the inline flag {int(flags[bad])}; expected 0 or 1: a "
            "corrupted message or a rank that does not run mpicomm"
        )
    over = inline & (np.asarray(counts, dtype=np.int64) > layout.cap)
    if over.any():
        bad = int(np.flatnonzero(over)[0])
        raise CommunicationError(
            f"{fn}: rank {bad} sends {counts[bad]} batch slots inline; expected at most "
            f"{layout.cap}: a corrupted message or a rank that does not run mpicomm"
        )
    return bool(inline.all())


def starts(counts: list[int]) -> list[int]:
    """Where each of ``counts`` starts in their concatenation (MPI's displacements).

    Example:
        >>> starts([3, 0, 2])
        [0, 3, 3]
    """
    out = list(accumulate(counts, initial=0))
    out.pop()
    return out


def _segments_by_key(sizes: np.ndarray, layout: Layout) -> tuple[list[list[int]], list[list[int]]]:
    """``sizes[s, k]`` and where segment (s, k) starts when segments are laid out by key, then source.

    Example:
        >>> lay = Layout([2, 0], 1, 0)
        >>> _segments_by_key(np.array([[1, 2], [3, 4]]), lay)  # key 0: s0 at 0, s1 at 1; key 1 at 4, 6
        ([[1, 2], [3, 4]], [[0, 4], [1, 6]])
    """
    ordered = (sizes if layout.in_order else sizes[layout.order]).T  # [key, source position]
    at = np.cumsum(ordered).reshape(ordered.shape) - ordered
    return sizes.tolist(), (at.T if layout.in_order else at.T[layout.position]).tolist()


class SendPlan:
    """What a call with this rank's shape (strides, dtypes, weights) computes once.

    Attributes:
        template: The counts message with everything but the value counts filled in.
        fixed: The bytes every received row's FLAGS, DTYPES and SPLITS must equal.
        key_index: Picks each key's first value offset (and the end) out of ``kja.offsets()``.
        row_counts, row_displs: Batch slots (lengths) sent to each destination and where they start.
        types: MPI datatypes of one row of lengths, values and weights (None without weights).
        recv: The receive plans seen with this send plan, by the shape bytes of the counts message.
        inline_slots: Where each length goes in the flattened counts message when this rank sends
            its lengths inline (``inline`` asked for and every destination's slots fit), else None.
        sent: This rank's counts messages and value displacements (:mod:`mpicomm.jagged.repeat`).
    """

    __slots__ = (
        "fixed", "inline_slots", "item_bytes", "key_index", "key_rows", "placeable", "recv", "row_bytes",
        "row_counts", "row_counts_peers", "row_displs", "row_self", "sent", "template", "types",
        "value_bytes",
    )  # fmt: skip

    def __init__(self, layout: Layout, key_rows: np.ndarray, flags: int, fp: int, splits_fp: int,
                 stride: int, types: tuple[Any, Any, Any], inline: bool = False) -> None:  # fmt: skip
        template = layout.empty_header()
        template[:, _FLAGS], template[:, _DTYPES], template[:, _SPLITS] = flags, fp, splits_fp
        template[:, _STRIDE] = stride
        template.reshape(-1)[layout.row_slots] = key_rows[1:] - key_rows[:-1]
        self.template, self.fixed = template, template[:, :_FIXED].tobytes()
        step = int(key_rows[1] - key_rows[0]) if key_rows.size > 1 else 0
        uniform_rows = step > 0 and np.array_equal(key_rows, np.arange(key_rows.size) * step)
        self.key_index: slice | np.ndarray = slice(None, None, step) if uniform_rows else key_rows
        self.key_rows = key_rows  # where each key's lengths start (and the end)
        rows = key_rows[layout.bounds]
        self.row_counts, self.row_displs = (rows[1:] - rows[:-1]).tolist(), rows[:-1].tolist()
        self.row_bytes = [d * types[0].Get_size() for d in self.row_displs]  # Alltoallw's displacements
        me = layout.rank
        self.row_self = (self.row_displs[me], self.row_counts[me])
        self.row_counts_peers = [0 if d == me else c for d, c in enumerate(self.row_counts)]
        self.types = types
        self.placeable = True  # values with a non-empty row: the placed path can take them
        self.value_bytes = 0  # bytes of one row of values
        self.item_bytes = (8, 8)  # bytes of one length, and of one row of values and weights together
        self.recv: Lru[bytes, RecvPlan] = Lru(8, RecvPlan.free)
        self.sent: Lru[bytes, Any] = Lru(_ARRIVED)
        self.inline_slots: np.ndarray | None = None
        if inline and max(self.row_counts, default=0) <= layout.cap:
            counts = rows[1:] - rows[:-1]
            dest = np.repeat(np.arange(layout.size, dtype=np.int64), counts)
            first = dest * layout.width + layout.lengths0 - rows[:-1][dest]
            self.inline_slots = first + np.arange(int(rows[-1] - rows[0]), dtype=np.int64) + rows[0]

    def free(self) -> None:
        """Free the datatypes of every receive plan (an evicted send plan)."""
        for plan in self.recv.values():
            plan.free()

    def header(self, layout: Layout, offsets: np.ndarray, nvalues: int) -> tuple[np.ndarray, np.ndarray]:
        """This call's counts message and each key's value offsets (``nkeys + 1``, from ``offsets``)."""
        key_values = offsets[self.key_index]
        return self.header_keys(layout, key_values, nvalues), key_values

    def header_keys(self, layout: Layout, key_values: np.ndarray, nvalues: int) -> np.ndarray:
        """This call's counts message from each key's value offsets (``nkeys + 1`` int64 on the host)."""
        header = self.template.copy()
        if layout.uniform:
            shape = (layout.size, layout.maxk)
            np.subtract(key_values[1:].reshape(shape), key_values[:-1].reshape(shape),
                        out=header[:, layout.values0 : layout.lengths0])  # fmt: skip
        else:
            header.reshape(-1)[layout.value_slots] = key_values[1:] - key_values[:-1]
        header[:, layout.total_col] = nvalues
        out: np.ndarray = header
        return out

    def receive(self, layout: Layout, got: np.ndarray, fn: str) -> RecvPlan:
        """The receive plan for the shape in ``got``, checking it the first time it is seen.

        Raises:
            CrossRankMismatchError: the sources disagree with this rank about flags, dtypes or splits.
            CommunicationError: row counts no real peer sends.
        """
        key = got[:, : layout.total_col].tobytes()
        plan = self.recv.get(key)
        if plan is None:
            if got[:, :_FIXED].tobytes() != self.fixed:
                _disagree_direct(got[:, _FLAGS], fn)
                _disagree(got, fn)
                raise CrossRankMismatchError(f"{fn}: a rank disagrees with this one about weights, VBE, "
                                             "dtypes or splits; expected the same on every rank")  # fmt: skip
            vbe = bool(self.template[0, _FLAGS] & _VBE)
            _check_rows(got, layout, vbe, fn)
            plan = RecvPlan(layout, got, vbe, fn)
            self.recv.put(key, plan)
        return plan


def _disagree_direct(flags: np.ndarray, fn: str) -> None:
    """Raise if some ranks hand device memory to MPI directly and others do not."""
    direct = (flags & _DIRECT) != 0
    if direct.any() and not direct.all():
        raise CrossRankMismatchError(
            f"{fn}: ranks {np.flatnonzero(direct).tolist()} pass device arrays to a CUDA-aware MPI and "
            f"ranks {np.flatnonzero(~direct).tolist()} do not; expected device arrays on every rank, or "
            "MPICOMM_CUDA_AWARE=0 to stage them through host memory (staged ranks mix with host ranks)"
        )


def _check_rows(got: np.ndarray, layout: Layout, vbe: bool, fn: str) -> None:
    """Refuse announced batch slots that no real peer sends, before anything is allocated for them."""
    rows = got[:, _ROWS0 : _ROWS0 + layout.mine]
    strides = got[:, _STRIDE]
    _check_counts(rows, layout, fn, "batch slots")
    _check_counts(strides[:, None], layout, fn, "stride")
    if not vbe and (rows != strides[:, None]).any():
        bad = int(np.flatnonzero((rows != strides[:, None]).any(axis=1))[0])
        raise CommunicationError(
            f"{fn}: rank {bad} announces stride {int(strides[bad])} but batch slots "
            f"{rows[bad].tolist()} for this rank's keys; expected the stride for every key: a corrupted "
            "message or a rank that does not run mpicomm"
        )


def _check_counts(counts: np.ndarray, layout: Layout, fn: str, what: str) -> tuple[list[int], int]:
    """``counts[s, k]`` from source s summed per source, and the total, once each is known to fit.

    Raises:
        CommunicationError: a negative count, or counts past this node's memory.
    """
    if counts.size == 0:
        return [0] * counts.shape[0], 0
    # as uint64 a negative count is huge: one reduction checks both ends
    fits = int(np.maximum.reduce(counts.view(np.uint64), axis=None)) <= layout.bound
    if fits and layout.sums_exact:
        per_source: list[int] = np.add.reduce(counts, axis=1).tolist()
        total = sum(per_source)
        if total <= layout.bound:
            return per_source, total
    exact = np.sum(counts.astype(object), axis=1)
    suspect = ((counts < 0) | (counts > layout.bound)).any(axis=1) | (exact > layout.bound)
    if fits and sum(exact) <= layout.bound:  # only when the int64 sums could have wrapped
        return [int(c) for c in exact], int(sum(exact))
    raise CommunicationError(
        f"{fn}: the ranks claim to send {exact.tolist()} {what} here (first suspect: rank "
        f"{int(np.argmax(suspect))}); expected non-negative counts within this node's memory "
        f"({layout.bound} bytes): a corrupted message or a rank that does not run mpicomm"
    )


def value_counts(got: np.ndarray, layout: Layout, fn: str) -> tuple[np.ndarray, list[int], int]:
    """This call's value counts of segment (source, key), checked; their sums per source; the total.

    Raises:
        CommunicationError: a negative count, or counts past this node's memory.
    """
    values_sk = got[:, layout.values0 : layout.values0 + layout.mine]
    # the common case of _check_counts, inline: counts that fit, sums that cannot wrap
    fits = layout.mine and int(np.maximum.reduce(values_sk.view(np.uint64), axis=None)) <= layout.bound
    if fits and layout.sums_exact:
        per_source: list[int] = np.add.reduce(values_sk, axis=1).tolist()
        total = sum(per_source)
        if total <= layout.bound:
            return values_sk, per_source, total
    return (values_sk, *_check_counts(values_sk, layout, fn, "values"))


def value_index(values_sk: np.ndarray, layout: Layout, total: int) -> np.ndarray:
    """The gather that puts ``total`` values received in (source, key) order in (key, source) order.

    Up to :data:`RADIX_MAX` values, each value is labelled with its output cell and a stable sort
    of the labels (a radix sort for up to 65,535 cells) is the gather: two numpy calls. Past it,
    the segment starts are repeated over their values (fewer passes over the data).

    Example:
        >>> lay = Layout([2, 0], 1, 0)  # two sources, two keys here: cells s0k0 s0k1 s1k0 s1k1
        >>> value_index(np.array([[1, 2], [3, 0]]), lay, 6).tolist()   # out: s0k0 s1k0 s0k1 (s1k1)
        [0, 3, 4, 5, 1, 2]
    """
    if total > RADIX_MAX:
        return _gather_index(values_sk.reshape(-1), layout.perm)
    labels = layout.cell_of.repeat(values_sk.reshape(-1))
    index: np.ndarray = labels.argsort(kind="stable")  # the method: a third cheaper than np.argsort
    return index


#: Where :func:`value_index` changes method (measured: the radix sort is 4x faster at 256 values,
#: even at 4,096, and 1.7x slower at 16,384).
RADIX_MAX = 4096


def segments_by_key(values_sk: np.ndarray, layout: Layout) -> tuple[list[list[int]], list[list[int]]]:
    """Per source, its segments' value counts and their output starts (MPI indexed-type arguments)."""
    return _segments_by_key(values_sk, layout)


def datatypes(lengths: np.ndarray, values: np.ndarray, weights: np.ndarray | None) -> tuple[Any, Any, Any]:
    """The MPI datatypes of one row of each array (committed once per dtype and row length)."""
    row = _row_type(lengths.dtype, 1)
    vals = _row_type(values.dtype, _row_len(values))
    return row, vals, None if weights is None else _row_type(weights.dtype, _row_len(weights))


def _row_len(x: np.ndarray) -> int:
    n = 1
    for s in x.shape[1:]:
        n *= s
    return n


_SELF: list[Any] = []


def self_comm() -> Any:
    """The library's own duplicate of ``MPI.COMM_SELF`` (made on first use, kept for the process).

    The placed path copies this rank's own segments with one ``Sendrecv`` on it: a local copy
    through the receive datatype, on a communicator no user message can match.
    """
    if not _SELF:
        _SELF.append(_mpi.MPI.COMM_SELF.Dup())
    return _SELF[0]


def free_types(types: list[Any]) -> None:
    """Free derived datatypes (a no-op once MPI is finalized, or when they are freed already)."""
    if types and not _mpi.MPI.Is_finalized():
        for t in types:
            if t != _mpi.MPI.DATATYPE_NULL:
                t.Free()
