"""How the gathers and the scatter of objects move out-of-band buffers (host or device), point to point.

A rank whose device buffers cannot be staged to send says so before any buffer moves (its header or
row carries the error); a rank whose device buffers cannot be received still takes part in every
transfer, into host memory, and hands the error to the status agreement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _mpi
from ..core.buffers import displacements
from ..errors import MpicommError
from .devbufs import Incoming, Outgoing, spec, split_words, words
from .messages import I8, _own_copy, _pickle, _received, _stage
from .pickling import error_kind
from .wire import TAG, U8, allgatherv, check_counts, pieces, receive_buffer, recv_bytes, send_bytes

if TYPE_CHECKING:
    from ..core.groups import ProcessGroup

__all__: list[str] = []

#: Tag of the out-of-band buffers of the gathers on the group's internal communicator.
BUF_TAG = TAG + 2


def _buffer_rounds(
    g: ProcessGroup,
    buffers: list[Any],
    outgoing: Outgoing | None,
    nbufs: list[int],
    root: int | None,
    fn: str,
) -> tuple[list[list[Any]], int, str]:
    """Move every rank's out-of-band buffers to ``root`` (to every rank for ``None``).

    One small ``Allgatherv`` of the buffer sizes, then one non-blocking receive per buffer and peer
    and one send per buffer and peer, straight from and into the arrays' memory (faster than
    ``Allgatherv`` for large buffers, and free of its ``int`` displacements). ``outgoing`` is this
    rank's buffers staged (:func:`~mpicomm.objects.messages._stage`; None where it sends nothing).
    Returns each rank's buffers (this rank's own are copies) and (kind, message) of a failure to
    receive device buffers here. Device buffers (a word's flag) are received into device memory or
    pinned host memory, as this rank's path decides (:mod:`mpicomm.objects.devbufs`).
    """
    per_rank: list[list[Any]] = [[] for _ in range(g.size())]
    if not any(nbufs):
        return per_rank, 0, ""
    mine = np.array(words(buffers), I8)
    flat, flags = split_words(allgatherv(g, mine.view(U8), [8 * k for k in nbufs]).view(I8).tolist())
    starts = displacements(nbufs)
    for r in range(g.size()):
        check_counts(fn, [], flat[starts[r] : starts[r] + nbufs[r]], r)
    check_counts(fn, [], flat, None)  # what the receivers hold in all; checked alike on every rank
    me = g.rank()
    receivers = [r for r in (range(g.size()) if root is None else [root]) if r != me]
    comm, requests = g.internal, []
    incoming: list[tuple[int, Incoming]] = []
    kind, msg = 0, ""
    try:
        if root is None or root == me:
            for r in range(g.size()):
                if r == me:
                    per_rank[r] = _own_copy(buffers)
                    continue
                part = slice(starts[r], starts[r] + nbufs[r])
                incoming.append((r, Incoming(flat[part], flags[part], receive_buffer)))
                requests += [comm.Irecv(spec(p), r, BUF_TAG) for b in incoming[-1][1].bufs for p in pieces(b)]
        sends = [] if outgoing is None else outgoing.bufs
        for r in receivers:
            requests += [comm.Isend(spec(p), r, BUF_TAG) for b in sends for p in pieces(b)]
        _mpi.MPI.Request.Waitall(requests)
        for r, inc in incoming:
            per_rank[r], k, m = _received(inc, fn, g.ranks[me])
            kind, msg = (kind, msg) if kind else (k, m)
        return per_rank, kind, msg
    finally:
        for _, inc in incoming:
            inc.drop()


def _scatter_source(
    g: ProcessGroup, inputs: object, fn: str
) -> tuple[np.ndarray, str, list[bytes], list[list[Any]], list[Outgoing | None]]:
    """The source's rows (kind, stream bytes, buffer count, total bytes), error, streams, buffers, staged.

    ``staged[r]`` is rank r's buffers staged to send (None for none, and for the source itself).
    The source checks each rank's row and buffer sizes as that rank will (the payload cap) and
    stages every device buffer before the rows go out: a failure of either goes out in the rows.
    """
    rows = np.zeros((g.size(), 4), I8)
    me, source = g.rank(), g.ranks[g.rank()]
    if not isinstance(inputs, list) or len(inputs) != g.size():
        got = f"a list of {len(inputs)}" if isinstance(inputs, list) else f"a {type(inputs).__qualname__}"
        rows[:, 0] = 1
        msg = (
            f"{fn}: scatter_object_input_list is {got} on the source rank {source}; expected a list of "
            f"{g.size()} objects (one per group rank)"
        )
        return rows, msg, [], [], []
    kind, msg, streams, buffers = _pickle(inputs, fn, "scatter_object_input_list", source)
    if not kind:
        rows[:, 1] = [len(x) for x in streams]
        rows[:, 2] = [len(b) for b in buffers]
        rows[:, 3] = sum(len(x) for x in streams)
        try:
            for r, (_, size, count, total) in enumerate(rows.tolist()):
                check_counts(fn, [count], [size, total], me)
                check_counts(fn, [], split_words(words(buffers[r]))[0], me)
        except MpicommError as exc:
            kind, msg = error_kind(exc), str(exc)
    staged: list[Outgoing | None] = []
    for r, bufs in enumerate(buffers if not kind else []):
        kind, msg, out = _stage(kind, msg, bufs, fn, source, r != me)
        staged.append(out)
    if kind:
        for out in staged:
            if out is not None:
                out.close()
        rows[:, 0] = kind
        return rows, msg, [], [], []
    return rows, "", streams, buffers, staged


def _scatter_buffers(
    g: ProcessGroup, buffers: list[list[Any]], staged: list[Outgoing | None], count: int, root: int
) -> tuple[list[Any], int, str]:
    """Out-of-band buffers from the source to each rank: their words, then each buffer, point to point.

    Returns this rank's buffers and (kind, message) of a failure to receive device buffers here.
    """
    comm, fn = g.internal, "scatter_object_list"
    if g.rank() != root:
        if count == 0:
            return [], 0, ""
        claimed = np.empty(count, I8)
        comm.Recv([claimed, _mpi.MPI.INT64_T], root, TAG)
        sizes, flags = split_words(claimed.tolist())
        check_counts(fn, [], sizes, root)
        incoming = Incoming(sizes, flags, receive_buffer)
        try:
            for b in incoming.bufs:
                recv_bytes(comm, b, root)
        except BaseException:
            incoming.drop()
            raise
        return _received(incoming, fn, g.ranks[g.rank()])
    for r, (bufs, out) in enumerate(zip(buffers, staged, strict=True)):
        if out is None:
            continue
        comm.Send([np.array(words(bufs), I8), _mpi.MPI.INT64_T], r, TAG)
        for buf in out.bufs:
            send_bytes(comm, buf, r)
    return _own_copy(buffers[root]), 0, ""
