"""Control messages between ranks: fixed int64 words and bounded UTF-8 text, never pickle.

Error reports, status agreements and validation records travel as one ``Allgather`` (or ``Bcast``)
of int64 words, then the texts as raw bytes of a length every receiver checks against a bound
before it allocates. Nothing here unpickles, so a hostile rank cannot run code through them,
whatever safe mode says (mpi4py's lowercase calls, ``comm.allgather`` and ``comm.bcast``, would
unpickle with plain ``pickle``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _mpi
from ..errors import CommunicationError

__all__ = ["MAX_TEXT", "allgather_texts", "bcast_text", "decode", "memory_bound"]

#: The longest text one rank sends in a control message, in bytes; a longer one is cut there.
MAX_TEXT = 1 << 16
I8 = np.int64
U8 = np.uint8


def memory_bound() -> int:
    """The most bytes a received header may claim: this node's physical memory."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not every platform names these
        return 1 << 48


def decode(data: Any) -> str:
    """Bytes received from another rank as text (bytes that are not UTF-8 become U+FFFD)."""
    return bytes(data).decode("utf-8", errors="replace")


def allgather_texts(
    comm: Any, kind: int, text: bytes, limit: int = MAX_TEXT, wait: Callable[[Any], None] | None = None
) -> list[tuple[int, bytes]]:
    """Every rank's ``(kind, text)``, in rank order: one int64 ``Allgather``, then one ``Allgatherv``.

    Args:
        comm: The communicator.
        kind: This rank's code (0 for success).
        text: This rank's text; cut to ``limit`` bytes.
        limit: The longest text a rank may send.
        wait: Completes each request (or raises, keeping the request, so its buffers, alive);
            None: ``Request.Wait``. Both steps are posted non-blocking whatever ``wait`` is, since
            MPI never matches a blocking collective with a non-blocking one, and a bounded
            exchange (``barrier(timeout=)``) must match the plain one on the other ranks.

    Returns:
        ``(kind, text)`` of every rank.

    Raises:
        CommunicationError: on every rank: some rank claims a text length outside ``[0, limit]``.
    """
    text = text[:limit]
    meta = np.empty((comm.Get_size(), 2), I8)
    words = np.array([kind, len(text)], I8)
    complete: Callable[[Any], Any] = _mpi.MPI.Request.Wait if wait is None else wait
    complete(comm.Iallgather(words, meta))
    sizes = meta[:, 1].tolist()
    _check_lengths(sizes, limit)
    out = np.empty(sum(sizes), U8)
    displs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).tolist()
    send, recv = [np.frombuffer(text, U8), _mpi.MPI.BYTE], [out, (sizes, displs), _mpi.MPI.BYTE]
    complete(comm.Iallgatherv(send, recv))
    raw = out.tobytes()
    return [(int(k), raw[d : d + s]) for k, d, s in zip(meta[:, 0].tolist(), displs, sizes, strict=True)]


def bcast_text(comm: Any, text: bytes, root: int, limit: int = MAX_TEXT) -> bytes:
    """``root``'s text on every rank: one int64 ``Bcast`` of its length, then the bytes.

    Raises:
        CommunicationError: on every rank but the root: the root claims a length outside ``[0, limit]``.
    """
    text = text[:limit]
    size = np.array([len(text)], I8)
    comm.Bcast(size, root)
    _check_lengths([int(size[0])], limit)
    buf = np.frombuffer(text, U8).copy() if comm.Get_rank() == root else np.empty(int(size[0]), U8)
    comm.Bcast([buf, _mpi.MPI.BYTE], root)
    return buf.tobytes()


def _check_lengths(sizes: list[int], limit: int) -> None:
    for rank, size in enumerate(sizes):
        if not 0 <= size <= limit:
            raise CommunicationError(
                f"control message: rank {rank} claims a {size}-byte text; expected 0 to {limit} bytes "
                "(a rank that does not run mpicomm's wire format, or a corrupted message)"
            )
