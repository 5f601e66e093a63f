"""What repeats between KJTAllToAll calls of one shape that also have the same per-key value counts.

The plans of ``mpicomm.jagged.plan`` follow from the shape of a call (batch sizes, dtypes,
splits). These follow from its value counts as well: a ``Sent`` (this rank's counts message,
ready to send, and its value counts and displacements per destination) by this rank's per-key
value offsets (and its lengths, when they travel inline), and an ``Arrived`` (the checked value
counts of every source, their displacements, the recat index and the indexed datatypes that place
the values) by the value columns of the counts message received. Features of a fixed size (every
length 1, or a fixed pooling factor) and repeated batches find both; a call with new counts makes
and checks them as the first call did, in a small bounded cache held by its shape's plan.
"""

from __future__ import annotations

import weakref
from operator import sub
from typing import TYPE_CHECKING, Any

import numpy as np

from .placement import indexed_types
from .plan import Layout, RecvPlan, SendPlan, free_types, segments_by_key, starts, value_counts, value_index
from .wire import check_kjt_claims

if TYPE_CHECKING:
    from .keyed import KeyedJaggedArray

__all__ = ["Arrived", "Sent", "arriving", "int32_counts", "sending"]

#: Received values up to which an :class:`Arrived` keeps its recat index (an int64 index of 32 KiB).
_INDEX_MAX = 4096


class Sent:
    """This rank's side of a call: its counts message and its values per destination.

    Attributes:
        header: The counts message, sent as it is (nothing writes it once it is made).
        bounds: Where each destination's values start, and the end.
        counts, starts: Values to each destination and where they start (Alltoallv's arguments).
        peers: ``counts`` with 0 for this rank, whose own values the placed path copies locally.
        mine: Where this rank's own values start, and how many there are.
        byte_starts: ``starts`` in bytes (Alltoallw's displacements).
        hot: The repeat of the last call that sent this message (see ``mpicomm.jagged.kjt``).
    """

    __slots__ = ("bounds", "byte_starts", "c32", "counts", "header", "hot", "mine", "peers", "starts")

    def __init__(
        self,
        send: SendPlan,
        layout: Layout,
        key_values: np.ndarray,
        lengths: np.ndarray | None,
        nvalues: int,
    ) -> None:
        header = send.header_keys(layout, key_values, nvalues)
        if lengths is not None:  # they fit: see SendPlan.inline_slots
            header[:, layout.inline_col] = 1
            header.reshape(-1)[send.inline_slots] = lengths
        self.header = header
        self.bounds: list[int] = key_values[layout.dest_index].tolist()
        self.starts = self.bounds[:-1]
        self.counts = list(map(sub, self.bounds[1:], self.starts))
        me = layout.rank
        self.mine = (self.starts[me], self.counts[me])
        self.peers = [0 if d == me else c for d, c in enumerate(self.counts)]
        self.byte_starts = [d * send.value_bytes for d in self.starts]
        self.c32 = int32_counts(self.counts, self.starts)
        #: The last call's repeat (``mpicomm.jagged.kjt``): what follows from a counts message
        #: received with this one, checked, kept with its bytes; None until a call can use one.
        self.hot: Any = None


def int32_counts(counts: list[int], displs: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
    """Counts and displacements as the int32 arrays the C ``alltoallv`` takes; None past int32.

    Made once per cached :class:`Sent` or :class:`Arrived`, so a repeated call passes them to C
    as they are (mpi4py parses two Python lists per side on every call instead).

    Example:
        >>> [a.tolist() for a in int32_counts([3, 4], [0, 3])]
        [[3, 4], [0, 3]]
    """
    if max(counts, default=0) + max(displs, default=0) >= 2**31:
        return None
    return np.array(counts, dtype=np.int32), np.array(displs, dtype=np.int32)


def sending(send: SendPlan, layout: Layout, kja: KeyedJaggedArray) -> Sent:
    """The :class:`Sent` of a host call of the KeyedJaggedArray ``kja`` (numpy arrays).

    Served from ``send.sent`` when this rank sent the same per-key value offsets (and, inline, the
    same lengths) in a recent call of this shape. Inline, the lengths alone are the key (they fix
    the offsets, and the values match their sum): a new array of repeated lengths costs one bytes
    copy, not its offsets.
    """
    lengths = kja._lengths
    if send.inline_slots is not None:
        key = lengths.tobytes()
        sent: Sent | None = send.sent.get(key)
        if sent is None:
            key_values = kja._wide_offsets()[send.key_index]
            sent = Sent(send, layout, key_values, lengths, kja._values.shape[0])
            send.sent.put(key, sent)
        return sent
    key_values = kja._wide_offsets()[send.key_index]
    key = key_values.tobytes()
    sent = send.sent.get(key)
    if sent is None:
        sent = Sent(send, layout, key_values, None, kja._values.shape[0])
        send.sent.put(key, sent)
    return sent


class Arrived:
    """What this rank receives in a call, from the value counts of the counts message (checked).

    Attributes:
        values_sk: Values of segment (source, key) (a copy of the message's columns).
        counts, displs: Values from each source and where they start (Alltoallv's arguments).
        total: Values received in all.
        everyone: The values all ranks hold together (every rank takes the same path from it).
    """

    __slots__ = (
        "__weakref__",
        "_index",
        "_types",
        "c32",
        "counts",
        "displs",
        "everyone",
        "total",
        "values_sk",
    )

    def __init__(self, values_sk: np.ndarray, counts: list[int], total: int, everyone: int) -> None:
        self.values_sk, self.counts, self.total, self.everyone = values_sk, counts, total, everyone
        self.displs = starts(counts)
        self.c32 = int32_counts(counts, self.displs)
        self._index: np.ndarray | None = None
        self._types: list[tuple[Any, list[Any]]] = []

    def index(self, layout: Layout) -> np.ndarray | None:
        """The gather that puts the received values in (key, source) order (None: already are)."""
        if layout.identity:
            return None
        if self._index is not None:
            return self._index
        index = value_index(self.values_sk, layout, self.total)
        if self.total <= _INDEX_MAX:
            self._index = index
        return index

    def types(self, layout: Layout, base: Any) -> list[Any]:
        """Per source, the indexed datatype of ``base`` rows that places its values (made once)."""
        for made_for, made in self._types:
            if made_for == base:
                return made
        made = indexed_types(base, *segments_by_key(self.values_sk, layout))
        self._types.append((base, made))
        weakref.finalize(self, free_types, made)
        return made

    def free(self) -> None:
        """Free the datatypes now (an evicted plan; requests still using them complete normally)."""
        for _, made in self._types:
            free_types(made)
        self._types.clear()


def arriving(
    recv: RecvPlan, layout: Layout, got: np.ndarray, item_bytes: tuple[int, int], fn: str
) -> Arrived:
    """The :class:`Arrived` of the counts message ``got``, checked the first time its counts are seen.

    Args:
        recv: The receive plan of ``got``'s shape (it holds the cache).
        layout: The exchange's layout.
        got: The counts message received.
        item_bytes: Bytes of one length, and of one row of values and weights together.
        fn: The public function, for messages.

    Raises:
        CommunicationError: value counts no real peer sends.
    """
    key = got[:, layout.total_col : layout.values0 + layout.mine].tobytes()
    arrived: Arrived | None = recv.arrived.get(key)
    if arrived is None:
        values_sk, counts, total = value_counts(got, layout, fn)
        totals = got[:, layout.total_col].tolist()
        check_kjt_claims(totals, counts, item_bytes, recv.total, total, fn)
        arrived = Arrived(values_sk.copy(), counts, total, sum(totals))
        recv.arrived.put(key, arrived)
    return arrived
