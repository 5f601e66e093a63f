"""Point-to-point object messages: ``send_object_list`` and ``recv_object_list``, with torch's semantics.

A small list is one message (header and pickles); numpy arrays inside the objects follow as messages
of their own, sent from their memory, in pieces of at most 1 GiB. The messages go over the group's
internal communicator, so they never match the user's own sends and receives.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _mpi
from ..core.calls import collective
from ..core.control import MAX_TEXT, decode
from ..core.groups import ProcessGroup, warn_non_member
from ..dense.p2p import _peer
from ..errors import ArgumentError
from .devbufs import Incoming, split_words
from .messages import Problem, _list_problem, _pickle_list, _ready, _received, _start, _unpickle
from .pickling import ObjectCollectiveError
from .wire import (
    I8,
    TAG,
    U8,
    check_counts,
    check_header,
    raise_first,
    receive_buffer,
    recv_bytes,
    send_bytes,
)

__all__ = ["recv_object_list", "send_object_list"]


#: Tag of send_object_list / recv_object_list on the group's internal communicator.
P2P_TAG = TAG + 1
#: Streams up to this many bytes travel in the first message, with the header.
INLINE = 64 << 10


@collective("send_object_list", validated=False)
def send_object_list(
    object_list: list[Any],
    dst: int | None = None,
    group: ProcessGroup | None = None,
    device: Any = None,
    group_dst: int | None = None,
) -> None:
    """Send the picklable objects of ``object_list`` to one rank, which calls :func:`recv_object_list`.

    A small list is one message; numpy arrays inside the objects follow as messages of their own,
    sent from their memory. If an object cannot be pickled, both this rank and the receiver raise the
    same :class:`~mpicomm.ObjectCollectiveError`; a failure on the receiver (unpickling, a list of
    another length) raises there only, as this call has returned by then.

    .. warning:: The receiver unpickles what this rank sends: use only between trusted peers.

    Args:
        object_list: The objects, at least one.
        dst: World rank of the receiver.
        group: The process group; ``None`` for the world.
        device: Accepted for torch compatibility; the receiver's ``device`` decides placement.
        group_dst: The receiver as a rank of ``group`` (instead of ``dst``).

    Returns:
        None.

    Raises:
        ArgumentTypeError: ``object_list`` is not a list (the receiver raises it too).
        ArgumentError: no destination, one out of range, or this rank itself; an empty list (the
            receiver raises it too).
        ObjectCollectiveError: an object cannot be pickled (the receiver raises it too).

    Example:
        >>> import mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> if w > 1 and r == 0:
        ...     mpicomm.send_object_list([{"step": 3}], dst=1)
        >>> if w > 1 and r == 1:
        ...     got = [None]; _ = mpicomm.recv_object_list(got, src=0)
    """
    fn = "send_object_list"
    g, _, _, problem = _start(group, fn, device, None)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    problem = problem or _list_problem(object_list, fn, "object_list")
    peer = _peer(g, dst, group_dst, fn, "dst", any_ok=False)
    kind, msg, streams, buffers = _pickle_list(object_list, fn, g.ranks[g.rank()], problem)
    kind, msg, header, stream, outgoing = _ready(kind, msg, streams, buffers, fn, g)
    comm, byte = g.internal, _mpi.MPI.BYTE
    try:
        if stream.size <= INLINE:
            comm.Send([np.concatenate([header.view(U8), stream]), byte], peer, P2P_TAG)
        else:
            comm.Send([header.view(U8), byte], peer, P2P_TAG)
            send_bytes(comm, stream, peer, P2P_TAG)
        for buf in [] if outgoing is None else outgoing.bufs:
            send_bytes(comm, buf, peer, P2P_TAG)
    finally:
        if outgoing is not None:
            outgoing.close()
    if kind:
        raise_first([(kind, msg)])
    return None


@collective("recv_object_list", validated=False)
def recv_object_list(
    object_list: list[Any],
    src: int | None = None,
    group: ProcessGroup | None = None,
    device: Any = None,
    group_src: int | None = None,
    *,
    safe: bool | None = None,
) -> int:
    """Receive what :func:`send_object_list` sent into ``object_list``, in place; from any rank by default.

    .. warning:: Unpickling runs code chosen by the sender; use only with trusted peers or ``safe=True``.

    Args:
        object_list: A list of the sender's length; its entries are replaced.
        src: World rank of the sender; ``None`` (and no ``group_src``) for any rank.
        group: The process group; ``None`` for the world.
        device: Where arrays in received objects go (see :func:`broadcast_object_list`).
        group_src: The sender as a rank of ``group``.
        safe: Unpickle with the allow-list only; ``None`` follows the global setting.

    Returns:
        The world rank of the sender (-1 on a rank outside ``group``).

    Raises:
        ArgumentTypeError: ``object_list`` is not a list (raised once the sender's messages are
            received, so that the sender is not left blocked).
        ArgumentError: a bad source; the list's length differs from the sender's.
        ObjectCollectiveError: an object could not be pickled by the sender or unpickled here.
        UnpicklingRefusedError: safe mode refused a class.

    Example:
        >>> import mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> if w > 1 and r == 1:
        ...     mpicomm.send_object_list(["hello", 2], dst=0)
        >>> if w > 1 and r == 0:
        ...     got = [None, None]
        ...     print(mpicomm.recv_object_list(got), got)
        ... else:
        ...     print(1, ["hello", 2])
        1 ['hello', 2]
    """
    fn = "recv_object_list"
    g, dev, safe, problem = _start(group, fn, device, safe)
    if g.comm is None:
        warn_non_member(g, fn)
        return -1
    problem = problem or _list_problem(object_list, fn, "object_list")
    peer = _peer(g, src, group_src, fn, "src", any_ok=True)
    comm, MPI = g.internal, _mpi.MPI
    status = MPI.Status()
    message = comm.Mprobe(peer, P2P_TAG, status)
    sender, count = status.Get_source(), status.Get_count(MPI.BYTE)
    first = np.empty(count, U8)
    message.Recv([first, MPI.BYTE])
    if count < 32:
        raise ObjectCollectiveError(
            f"{fn}: a {count}-byte first message from rank {sender}; expected 32 or more"
        )
    kind, n, slen, nbufs = (int(v) for v in first[:32].view(I8))
    check_counts(fn, [n, nbufs], [slen], sender)
    hlen = 8 * (4 + n + nbufs)
    if hlen > count:
        raise ObjectCollectiveError(f"{fn}: rank {sender} sent a {count}-byte header; expected {hlen} bytes")
    header = first[:hlen].view(I8)
    check_header(fn, header, sender)
    stream = first[hlen:] if count > hlen else receive_buffer(slen, fn, sender)
    if count <= hlen:
        recv_bytes(comm, stream, sender, P2P_TAG)
    bufs: list[Any] = []
    failed: Problem = None
    if nbufs:
        incoming = Incoming(*split_words(header[4 + n :].tolist()), receive_buffer)
        try:
            for b in incoming.bufs:
                recv_bytes(comm, b, sender, P2P_TAG)
        except BaseException:
            incoming.drop()
            raise
        bufs, got_kind, got_msg = _received(incoming, fn, g.ranks[g.rank()])
        failed = (got_kind, got_msg) if got_kind else None
    if kind:
        raise_first([(kind, decode(stream[:MAX_TEXT]))])
    for p in (problem, failed):  # only now: the sender's messages are received, it is not left waiting
        if p is not None:
            raise_first([p])
    if len(object_list) != n:
        raise ArgumentError(
            f"{fn}: object_list has {len(object_list)} entries; expected {n}, the length of the list sent by "
            f"rank {g.ranks[sender]}"
        )
    names = [f"{fn}: object_list[{i}] from rank {g.ranks[sender]}" for i in range(n)]
    sizes = [int(s) for s in header[4 : 4 + n]]
    kind, msg, got, fatal = _unpickle(stream, sizes, bufs, safe, dev, names, g.ranks[g.rank()])
    if fatal is not None:
        raise fatal
    if kind:
        raise_first([(kind, msg)])
    object_list[:] = got
    return g.ranks[sender]
