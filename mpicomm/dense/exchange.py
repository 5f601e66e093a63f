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

from .. import _mpi
from ..core.buffers import message, recv_message
from ..core.work import Work

if TYPE_CHECKING:
    from ..core.groups import ProcessGroup

__all__ = ["ALL_GATHER", "ALL_TO_ALL", "REDUCE_SCATTER", "SCATTER", "exchange", "finish"]

# Tags of mpicomm's own messages on a group's internal communicator, one per collective.
REDUCE_SCATTER = 1
ALL_GATHER = 2
SCATTER = 4
ALL_TO_ALL = 5


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
    return requests


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
    _mpi.MPI.Request.Waitall(requests)
    if after is not None:
        after()
    return None


def _run_all(posts: list[Callable[[], None]]) -> Callable[[], None]:
    def run() -> None:
        for post in posts:
            post()

    return run
