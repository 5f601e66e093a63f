"""Pairwise exchange: the list-form collectives move each list entry straight to or from its peer.

``all_gather`` (but small entries of one size: :mod:`mpicomm.dense.small`), ``scatter``,
``all_to_all`` and list ``reduce_scatter`` take one array per rank. Instead of packing the list
into one buffer for a v-collective, mpicomm posts one non-blocking receive and one send per peer,
reading and writing the list entries where they lie. This is the linear/pairwise algorithm MPI
itself uses for these collectives at large sizes; it needs no temporary and no padding, and every
rank can take part without knowing the sizes of the messages between other ranks. The messages go
over the group's internal communicator, so they cannot match the user's ``send``/``recv``.
(``gather`` makes one v-collective instead: :mod:`mpicomm.dense.placed`.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core import cmpi
from ..core.buffers import message, recv_message
from ..core.reduce_op import ReduceOp, is_half
from ..core.statuses import Posted, waitall
from ..core.work import Work

if TYPE_CHECKING:
    from ..core.groups import ProcessGroup

__all__ = ["ALL_GATHER", "ALL_TO_ALL", "REDUCE_SCATTER", "SCATTER", "exchange", "finish", "reduce_scatter_c"]

# Tags of mpicomm's own messages on a group's internal communicator, one per collective.
REDUCE_SCATTER = 1
ALL_GATHER = 2
SCATTER = 4
ALL_TO_ALL = 5
_NAMES = {
    REDUCE_SCATTER: "reduce_scatter",
    ALL_GATHER: "all_gather",
    SCATTER: "scatter",
    ALL_TO_ALL: "all_to_all",
}


def exchange(
    g: ProcessGroup,
    recvs: dict[int, np.ndarray],
    sends: dict[int, np.ndarray],
    tag: int,
    posts: list[Callable[[], None]] | None = None,
) -> list[Any]:
    """Post a receive into ``recvs[p]`` from each peer p and a send of ``sends[p]`` to each peer p.

    Args:
        g: The group (its internal communicator carries the messages).
        recvs: Group rank -> array to receive into, of any layout (strided views are written in place).
        sends: Group rank -> array to send, of any layout.
        tag: The collective's tag, from this module.
        posts: Where to add the copy-backs of receives that went through a temporary (overlapping
            layouts only); ``None`` when every receive buffer is C-contiguous.

    Returns:
        The MPI requests, receives first.
    """
    comm = g.internal
    requests = []
    for p, x in recvs.items():
        msg, post = recv_message(x)
        if post is not None and posts is not None:
            posts.append(post)
        requests.append(comm.Irecv(msg, p, tag))
    requests += [comm.Isend(message(x), p, tag) for p, x in sends.items()]
    posted = [(p, True, x.nbytes) for p, x in recvs.items()] + [
        (p, False, x.nbytes) for p, x in sends.items()
    ]
    return Posted(requests, posted, _NAMES.get(tag, ""))


def copy_own(dst: np.ndarray, src: np.ndarray) -> None:
    """This rank's own entry: a local copy instead of a message to itself."""
    np.copyto(dst, src.reshape(dst.shape))


def finish(
    requests: list[Any],
    async_op: bool,
    keep: Any,
    result: list[np.ndarray],
    posts: list[Callable[[], None]] | None = None,
    fn: str = "",
) -> Work | None:
    """Return a Work over ``requests`` (``fn`` names the call), or wait, run ``posts`` and return None."""
    after = None if not posts else _run_all(posts)
    if async_op:
        return Work(requests, keep=keep, result=result, finish=after, fn=fn)
    waitall(requests)
    if after is not None:
        after()
    return None


def _run_all(posts: list[Callable[[], None]]) -> Callable[[], None]:
    def run() -> None:
        for post in posts:
            post()

    return run


def reduce_scatter_c(w: ProcessGroup, out: Any, ins: Any, op: Any, limit: int) -> bool:
    """Serve a common list ``reduce_scatter`` past ``limit`` bytes with the exchange from C, or return False.

    The world group, a plain op, C-contiguous numpy arrays of one dtype (not half), this rank's own
    piece of the output's size and apart from it: the messages of the general path's pairwise
    exchange (the first peer's piece straight into ``out``, the others into rows of a temporary),
    posted by ``cmpi.exchange`` before any Python check of the peers' pieces (at 1 MiB, MPICH's
    exchange pays several times any delay before the messages), then the same local reductions in
    the same order. Where anything is unusual it returns False before any message.
    """
    size, rank = w._size, w._rank
    if size < 2 or type(out) is not np.ndarray or out.nbytes <= limit or type(ins) is not list:
        return False
    if type(op) is not ReduceOp or not op._plain or is_half(out.dtype) or not out.flags.c_contiguous:
        return False
    pair = op._ops.get(out.dtype)
    own = ins[rank] if len(ins) == size else None
    if pair is None or type(own) is not np.ndarray or own.dtype != out.dtype or own.size != out.size:
        return False
    if not own.flags.c_contiguous or np.may_share_memory(own, out):
        return False
    dt, mop = pair
    peers = [p for p in range(size) if p != rank]
    rows = np.empty((size - 2, out.size), out.dtype)
    recvs = [np.empty(0, out.dtype)] * size  # this rank's own slot: nothing received, nothing copied
    recvs[peers[0]] = out
    for p, row in zip(peers[1:], rows, strict=True):
        recvs[p] = row
    sends = list(ins)
    sends[rank] = recvs[rank]
    if cmpi.exchange(recvs, sends, None, REDUCE_SCATTER, dt, w.internal) is not None:
        return False
    flat = out.reshape(-1)
    for row in rows:
        mop.Reduce_local([row, dt], [flat, dt])
    mop.Reduce_local([own.reshape(-1), dt], [flat, dt])  # MPI's predefined ops commute
    return True
