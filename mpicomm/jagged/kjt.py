"""The jagged all-to-all: ``jagged_all_to_all`` for jagged arrays and ``KJTAllToAll`` for keyed ones.

Both run in two steps, as torchrec's ``KJTAllToAll`` does: one ``Alltoall`` of int64 counts (every
label's counts in one message), then the data, all posted before the call returns. The counts
message also carries fingerprints of the dtypes, flags and splits, so ranks that disagree about them
get the same :class:`~mpicomm.CrossRankMismatchError` on every rank instead of a hang or garbage,
even without validation mode. ``KJTAllToAll`` also sends the counts of every key in that message, so
each rank knows every (source, key) segment before the data moves: it then receives with
``Alltoallw`` and indexed datatypes that put each segment in its final (key, source) place, or, for
small data, with ``Alltoallv`` and a vectorised numpy gather (the recat) in ``wait()``. Lengths of
few batch slots travel inline in the counts message (no message of their own). What repeats from
call to call (the counts message's template, displacements, recat indices, the lengths' datatypes)
comes from the plans of :mod:`mpicomm.jagged.plan`; what repeats with the same value counts (the
counts message itself, the value displacements, recat index and datatypes) from
:mod:`mpicomm.jagged.repeat`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .. import _mpi
from ..core import cmpi, validation
from ..core.buffers import as_int_list, row_size, send_view
from ..core.calls import collective
from ..core.control import PAYLOAD_ENV, memory_bound
from ..core.groups import ProcessGroup, resolve
from ..core.work import Work, completed
from ..errors import ArgumentError, ArgumentTypeError, CrossRankMismatchError, GroupError
from .device import to_host, xp_take
from .hot import Repeat
from .keyed import KeyedJaggedArray
from .plan import _DIRECT, _INLINE_MAX, Layout, Lru, RecvPlan, SendPlan, datatypes, self_comm
from .repeat import Arrived, Sent, arriving, sending
from .wire import _VBE, _WEIGHTED, _dtype_tag, _exclusive_cumsum, _fingerprint

__all__ = ["KJTAllToAll", "KJTAllToAllAwaitable"]


class _Placement:
    """From this many values per rank (on average), MPI places the segments itself (no recat copy).

    Below it, one ``Alltoallv`` per array and a numpy gather. Above it, the placed path wins by more
    and more (it also copies this rank's own segments locally, where MPI's path to itself is slow).
    Measured on MPICH, 2 ranks, 2 keys per rank: gather 28 / 45 / 59 us against placed 43 / 53 / 54
    us at 1024 / 4096 / 8192 values per rank.
    """

    min_values = 8192
    #: Send plans (distinct shapes of this rank's input) a KJTAllToAll keeps; each keeps 8 receive plans.
    plans = 16


class _Call(NamedTuple):
    """One exchange once its counts are known: what the data step of any path needs."""

    a2a: KJTAllToAll
    kja: KeyedJaggedArray
    send: SendPlan
    recv: RecvPlan
    arrived: Arrived
    sent: Sent
    got: np.ndarray  # the counts message received (inline lengths are gathered out of it)


class KJTAllToAllAwaitable:
    """The pending output of a :class:`KJTAllToAll` call; :meth:`wait` returns it.

    The counts have been exchanged and the data has moved when you get this handle: blocking MPI
    calls cost less than posting non-blocking ones and waiting, and MPI moves nothing between a post
    and its wait without a progress thread. :meth:`wait` does what is left, the recat of the gather
    path (work done before it does not delay the exchange).
    """

    __slots__ = ("_finish", "_out", "_work")

    def __init__(
        self, work: Work | None, out: list[KeyedJaggedArray], finish: Callable[[], None] | None = None
    ) -> None:
        self._work, self._out, self._finish = work, out, finish

    def wait(self) -> KeyedJaggedArray:
        """Block until the data has arrived, reorder it, and return this rank's KeyedJaggedArray."""
        if self._work is not None:
            self._work.wait()
        elif self._finish is not None:
            finish, self._finish = self._finish, None
            finish()
        return self._out[0]

    def is_completed(self) -> bool:
        """Whether the data has arrived (never blocks)."""
        return self._work.is_completed() if self._work is not None else True

    def __repr__(self) -> str:
        return f"<mpicomm.KJTAllToAllAwaitable {'completed' if self.is_completed() else 'pending'}>"


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

    #: The device data path (``mpicomm.front.jagged``'s subclass gives one): ``direct()`` says whether
    #: this rank hands device memory to MPI, ``start(call, placed, direct)`` moves a :class:`_Call`'s data.
    _device: Any = None
    #: The classes a call answers with. The front door's subclass names its own, which answer in the
    #: caller's array kind: every output is made in its class (no object changes class afterwards).
    _keyed: type[KeyedJaggedArray] = KeyedJaggedArray
    _awaitable: type[KJTAllToAllAwaitable] = KJTAllToAllAwaitable

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
        _check_plan_size(self.splits, fn)
        if isinstance(stagger, bool) or not isinstance(stagger, (int, np.integer)):
            raise ArgumentTypeError(f"{fn}: stagger is {stagger!r}; expected a positive int")
        if stagger < 1 or g.size() % stagger:
            raise ArgumentError(
                f"{fn}: stagger is {stagger}; expected a positive divisor of {g.size()} (the group size)"
            )
        self.group, self.stagger = g, int(stagger)
        self._layout = Layout(self.splits, self.stagger, g.rank())
        self._i64 = _mpi.MPI.INT64_T
        self._fp = _fingerprint(self.splits, self.stagger)
        self._agreed = g.size() == 1
        #: Send plans by this rank's shape; each holds the receive plans seen with it (see ``plan``).
        self._send: Lru[tuple[Any, ...], SendPlan] = Lru(_Placement.plans, SendPlan.free)

    @collective("KJTAllToAll", group_of=lambda bound: bound["self"].group)
    def __call__(self, kja: KeyedJaggedArray) -> KJTAllToAllAwaitable:
        """Start the exchange of ``kja``; the returned handle's ``wait()`` gives this rank's output.

        The first call on a KJTAllToAll also checks, with one small ``Allreduce``, that every rank
        built it with the same splits and stagger (so call it on every rank of the group). A call
        with the same shape as a recent one (batch sizes, dtypes, weights; the keys' names do not
        matter) reuses that call's plan: its counts message template, displacements and recat index.

        Raises:
            ArgumentTypeError: ``kja`` is not a KeyedJaggedArray.
            ArgumentError: its number of keys is not ``sum(splits)``.
            CrossRankMismatchError: ranks disagree about splits, stagger, dtypes, weights or VBE
                (always checked) or keys (validation mode); raised on every rank.
            CommunicationError: a peer announces counts that no real peer sends.
        """
        fn, g = "KJTAllToAll", self.group
        if not isinstance(kja, KeyedJaggedArray):
            raise ArgumentTypeError(
                f"{fn}: the input is a {type(kja).__qualname__}; expected a KeyedJaggedArray"
            )
        if validation._Flag.on:
            agree = {"splits": self.splits, "stagger": self.stagger, "keys": kja.keys()}
            vbe, weighted = kja.variable_stride_per_key(), kja._weights is not None
            # weights and VBE before dtypes: a rank without weights is named as such, not by the
            # weights' slot of the dtypes (the first field that differs is the one reported)
            validation.check(g, fn, {**agree, "weighted": weighted, "vbe": vbe, "dtypes": _dtypes(kja)})
        lay = self._layout
        if len(kja._keys) != lay.nkeys:
            raise ArgumentError(
                f"{fn}: the KeyedJaggedArray has {len(kja._keys)} keys; expected {lay.nkeys}, "
                f"the sum of splits {self.splits}"
            )
        if lay.size == 1:
            out = kja if isinstance(kja, self._keyed) else _as(self._keyed, kja)
            return self._awaitable(completed(), [out])
        device = type(kja._values) is not np.ndarray
        if device and self._device is None:
            raise ArgumentTypeError(
                f"{fn}: the KeyedJaggedArray holds device arrays; expected numpy arrays here "
                "(mpicomm.KJTAllToAll, the front door's, takes device arrays)"
            )
        if not self._agreed:
            self._agree()
        direct = device and self._device.direct()
        send = self._send_plan(kja, direct, device)
        if device:  # the key offsets only (nkeys + 1 numbers) come to the host
            key_values = to_host(xp_take(kja._wide_offsets(), send.key_index))
            sent = Sent(send, lay, key_values, None, kja._values.shape[0])
        else:
            sent = sending(send, lay, kja)
        hot = sent.hot
        if type(hot) is Repeat:  # the counts message (int64 words) lands in the repeat's buffer
            done = hot.fused(kja, sent.header, self._i64, g.internal)  # the whole call from C when it can
            if done is NotImplemented:
                if cmpi.alltoall(sent.header, hot.scratch, self._i64, g.internal) is NotImplemented:
                    g.internal.Alltoall([sent.header, self._i64], [hot.scratch, self._i64])
                if hot.got == hot.scratch.tobytes():  # the message checked last time, again
                    return self._awaitable(None, [hot.start(kja, g.internal)])
            elif done is not None:
                return self._awaitable(None, [done])
            got = hot.scratch.copy()  # another message: the general path keeps it
        else:
            got = np.empty(sent.header.shape, np.int64)
            if cmpi.alltoall(sent.header, got, self._i64, g.internal) is NotImplemented:
                g.internal.Alltoall([sent.header, self._i64], [got, self._i64])
        mark = got.tobytes()
        recv = send.receive(lay, got, fn)
        arrived = arriving(recv, lay, got, send.item_bytes, fn)
        # every rank sees every rank's total and direct flag, so every rank takes the same path
        placed = not direct and send.placeable and arrived.everyone >= _Placement.min_values * lay.size
        call = _Call(self, kja, send, recv, arrived, sent, got)
        if device:
            handle: KJTAllToAllAwaitable = self._device.start(call, placed, direct)
            return handle
        if placed:
            return self._start_in_place(call)
        handle = self._start_gather(call)
        # a repeat is made the second time in a row that a message comes (new counts every call
        # then cost one bytes copy, not a repeat each)
        sent.hot = (_repeat_of(call, mark) or mark) if hot == mark else mark
        return handle

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

    def _send_plan(self, kja: KeyedJaggedArray, direct: bool = False, device: bool = False) -> SendPlan:
        """The send plan of ``kja``'s shape: made on first use, then served from a bounded cache.

        ``direct``: this rank hands device memory to MPI (the flag travels in the counts message).
        ``device``: the arrays are device arrays (their lengths never travel inline).
        """
        w, v, lens = kja._weights, kja._values, kja._lengths
        vbe = None if kja._spkpr is None else tuple(kja.stride_per_key())
        wkey = None if w is None else (w.dtype, w.shape[1:])
        key = (kja._stride, vbe, lens.dtype, v.dtype, v.shape[1:], wkey, direct, device)
        plan = self._send.get(key)
        if plan is None:  # a new shape here
            flags = (_VBE if vbe is not None else 0) | (_WEIGHTED if w is not None else 0)
            flags |= _DIRECT if direct else 0
            if vbe is not None:
                key_rows = _exclusive_cumsum(np.asarray(vbe, dtype=np.int64))
            else:
                key_rows = np.arange(self._layout.nkeys + 1, dtype=np.int64) * kja._stride
            fp = _fingerprint(*_dtypes(kja))
            types = datatypes(lens, v, w)
            plan = SendPlan(self._layout, key_rows, flags, fp, self._fp, kja._stride, types, not device)
            plan.placeable = row_size(v) > 0
            plan.value_bytes = v.itemsize * row_size(v)
            plan.item_bytes = (
                lens.itemsize,
                plan.value_bytes + (0 if w is None else w.itemsize * row_size(w)),
            )
            self._send.put(key, plan)
        return plan

    def _start_gather(self, call: _Call) -> KJTAllToAllAwaitable:
        """Small exchanges: one Alltoallv per array into (source, key) order, one gather each in wait().

        The data moves before this returns: for these sizes the blocking calls cost less than
        posting non-blocking ones and waiting (measured on MPICH, 2 ranks, 1 KiB: about 8 us against
        10 us for lengths and values), and there is little transfer to overlap. Lengths that came
        inline in the counts message need no message of their own.
        """
        lay, kja, recv, arrived = self._layout, call.kja, call.recv, call.arrived
        vals, w = send_view(kja._values), kja._weights
        lens = recv_l = None
        if not recv.inline:
            lens = send_view(kja._lengths)
            recv_l = np.empty(recv.total, dtype=lens.dtype)
        recv_v = np.empty((arrived.total, *vals.shape[1:]), dtype=vals.dtype)
        recv_w = None
        if w is not None:
            w = send_view(w)
            recv_w = np.empty((arrived.total, *w.shape[1:]), dtype=w.dtype)
        self._moves(call, (lens, vals, w), (recv_l, recv_v, recv_w))
        index = arrived.index(lay)
        keys = kja._keys[lay.key_range]
        out: list[KeyedJaggedArray] = []

        def finish() -> None:
            values, weights = recv_v, recv_w
            if recv_l is None:
                lengths = _inline_lengths(call)
            else:
                lengths = recv_l if recv.row_index is None else recv_l[recv.row_index]
            if index is not None:
                values = values[index]
                weights = None if weights is None else weights[index]
            out.append(self._keyed._trusted(keys, values, lengths, weights, recv.stride, recv.table))

        return self._awaitable(None, out, finish)

    def _moves(self, call: _Call, src: tuple[Any, Any, Any], dst: tuple[Any, Any, Any]) -> None:
        """The gather path's messages: one blocking Alltoallv each of lengths, values and weights.

        ``src`` and ``dst`` are numpy arrays, pinned host views of device arrays (staged) or device
        arrays (direct): the same MPI calls whatever the memory, so that ranks may mix them. No
        lengths message when every source sent its lengths inline.
        """
        comm, (lt, vt, wt) = self.group.internal, call.send.types
        send, recv, arrived, sent = call.send, call.recv, call.arrived, call.sent
        if not recv.inline:
            rows = (send.row_counts, send.row_displs)
            comm.Alltoallv([src[0], rows, lt], [dst[0], (recv.counts, recv.displs), lt])
        sends, recvs = (sent.counts, sent.starts), (arrived.counts, arrived.displs)
        # from C for numpy arrays of one value a row whose counts fit int32 (mpi4py for device memory)
        mine, theirs = sent.c32, arrived.c32
        if type(src[1]) is not np.ndarray or send.value_bytes != src[1].itemsize:
            mine = theirs = None
        if (
            mine is None
            or theirs is None
            or cmpi.alltoallv(src[1], *mine, dst[1], *theirs, vt, comm) is NotImplemented
        ):
            comm.Alltoallv([src[1], sends, vt], [dst[1], recvs, vt])
        if src[2] is not None and (
            mine is None
            or theirs is None
            or type(src[2]) is not np.ndarray
            or src[2].ndim != 1
            or cmpi.alltoallv(src[2], *mine, dst[2], *theirs, wt, comm) is NotImplemented
        ):
            comm.Alltoallv([src[2], sends, wt], [dst[2], recvs, wt])

    def _start_in_place(self, call: _Call, into: tuple[Any, Any, Any] | None = None) -> KJTAllToAllAwaitable:
        """Large exchanges: MPI writes every (source, key) segment straight to its (key, source) place.

        ``into``: receive arrays to fill (the staged path's pinned buffers) instead of new ones.

        One blocking Alltoallw per array, whose receive datatype for each source is an indexed type listing
        where that source's segments go. There is no recat copy of the values at all. The lengths'
        types come from the receive plan (lengths sent inline are gathered out of the counts message
        instead); the values' from the value counts' plan, shared by the weights when both have the
        same row type.
        """
        lay, comm, kja = self._layout, self.group.internal, call.kja
        send, recv, arrived, sent = call.send, call.recv, call.arrived, call.sent
        vals, w = send_view(kja._values), kja._weights
        lt, vt, wt = send.types
        value_types = arrived.types(lay, vt)
        recv_l: Any  # None when every source sent its lengths inline
        if into is None:
            recv_v = np.empty((arrived.total, *vals.shape[1:]), dtype=vals.dtype)
            recv_l = None if recv.inline else np.empty(recv.total, dtype=kja._lengths.dtype)
        else:
            recv_l, recv_v = into[0], into[1]
        posts = []  # (send, receive) of each Alltoallw
        local: list[tuple[Any, ...]] = [(vals, sent.mine, vt, recv_v, value_types)]
        if not recv.inline:
            lens = send_view(kja._lengths)
            row_types = recv.row_types(lay, lt)
            rows = [lens, (send.row_counts_peers, send.row_bytes), [lt] * lay.size]
            posts.append((rows, lay.recv(recv_l, row_types, lt)))
            local.append((lens, send.row_self, lt, recv_l, row_types))
        values = [vals, (sent.peers, sent.byte_starts), [vt] * lay.size]
        posts.append((values, lay.recv(recv_v, value_types, vt)))
        recv_w = None
        if w is not None:
            w = send_view(w)
            weight_types = value_types if wt == vt else arrived.types(lay, wt)
            recv_w = np.empty((arrived.total, *w.shape[1:]), dtype=w.dtype) if into is None else into[2]
            w_at = sent.byte_starts if wt == vt else [d * w.itemsize * row_size(w) for d in sent.starts]
            weights = [w, (sent.peers, w_at), [wt] * lay.size]
            posts.append((weights, lay.recv(recv_w, weight_types, wt)))
            local.append((w, sent.mine, wt, recv_w, weight_types))
        # Blocking calls, on every rank alike (host, staged and placed-staged ranks mix in one exchange,
        # and a blocking collective never matches a non-blocking one): they cost less than posting and
        # waiting (~3 us of 20 at 64 KiB on MPICH), and MPI moves nothing between a post and its wait
        # without a progress thread anyway.
        for s, r in posts:
            comm.Alltoallw(s, r)
        me = lay.rank
        for x, (first, count), dt, dest, types in local:
            if types:  # MPI's own path to this rank is far slower than a local copy (see _Placement)
                self_comm().Sendrecv([x[first : first + count], count, dt], 0, 0, [dest, 1, types[me]], 0, 0)
        keys = kja._keys[lay.key_range]
        lengths = _inline_lengths(call) if recv_l is None else recv_l
        out = [self._keyed._trusted(keys, recv_v, lengths, recv_w, recv.stride, recv.table)]
        return self._awaitable(None, out)


def _repeat_of(call: _Call, got: bytes) -> Repeat | None:
    """The repeat of a host gather call that just ran (``got``: its message's bytes), or None.

    None when later calls could not use one (see :class:`~mpicomm.jagged.hot.Repeat`).
    """
    kja, lay, arrived, mine = call.kja, call.a2a._layout, call.arrived, call.sent.c32
    w, theirs = kja._weights, arrived.c32
    if (
        not call.recv.inline
        or mine is None
        or theirs is None
        or call.send.value_bytes != kja._values.itemsize
        or (w is not None and w.ndim != 1)
    ):
        return None
    index = arrived.index(lay)  # kept by the Arrived up to _INDEX_MAX values
    if index is not None and arrived._index is None:
        return None
    return Repeat(
        got,
        call.got,
        (mine, theirs),
        index,
        _inline_lengths(call),
        call,
        (arrived.total, *kja._values.shape[1:]),
    )


def _inline_lengths(call: _Call) -> np.ndarray:
    """The lengths every source sent inline, out of the counts message, in (key, source) order."""
    lengths: np.ndarray = call.got.reshape(-1)[call.recv.inline_index]
    dtype = call.kja._lengths.dtype
    return lengths if lengths.dtype == dtype else lengths.astype(dtype)


def _check_plan_size(splits: list[int], fn: str) -> None:
    """Refuse splits whose plan (int64 words per key and per counts-message slot) would pass the cap.

    Raises:
        ArgumentError: more keys than the payload cap holds plans for.
    """
    words = 4 * sum(splits) + len(splits) * (2 * max(splits, default=0) + 6 + _INLINE_MAX)
    if 8 * words > memory_bound():
        raise ArgumentError(
            f"{fn}: splits {splits} ask for {sum(splits)} keys, whose plan needs {8 * words} bytes; expected "
            f"at most {memory_bound()} bytes (the payload cap, {PAYLOAD_ENV}): one entry per key of the "
            "KeyedJaggedArrays it will exchange"
        )


def _as(cls: type[KeyedJaggedArray], kja: KeyedJaggedArray) -> KeyedJaggedArray:
    """``kja``'s arrays in a new array of class ``cls`` (the front door's, given a host array)."""
    return cls._trusted(kja._keys, kja._values, kja._lengths, kja._weights, kja._stride, kja._spkpr)


def _dtypes(kja: KeyedJaggedArray) -> tuple[Any, ...]:
    """What ranks must agree on about the arrays: dtypes and trailing shapes (of the arrays inside).

    The arrays themselves, not the accessors: the front door's subclass answers those in the
    caller's kind (torch), and hands its arrays to this class's calls as they are.
    """
    v, w = kja._values, kja._weights
    return (
        str(kja._lengths.dtype),
        _dtype_tag(v.dtype),
        v.shape[1:],
        None if w is None else (_dtype_tag(w.dtype), w.shape[1:]),
    )


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
