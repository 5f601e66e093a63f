"""Control messages between ranks: fixed int64 words and bounded UTF-8 text, never pickle.

Error reports, status agreements and validation records travel as one ``Allgather`` (or ``Bcast``)
of a fixed-size slot per rank: two int64 words (kind, length) and the first bytes of the text. A
longer text sends its rest point to point, and receivers probe it for its size after checking the
claimed length against a bound: no size a rank claims ever becomes an MPI receive count, so a lie
is an error here, not a truncated message (which MPICH answers by ending the job). Nothing here
unpickles, so a hostile rank cannot run code through them, whatever safe mode says (mpi4py's
lowercase calls, ``comm.allgather`` and ``comm.bcast``, would unpickle with plain ``pickle``). The
payload cap (:func:`memory_bound`) bounds what the data paths allocate for peers' claims.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _mpi
from ..errors import CommunicationError

__all__ = ["MAX_TEXT", "PAYLOAD_ENV", "allgather_texts", "bcast_text", "decode", "memory_bound"]

#: The longest text one rank sends in a control message, in bytes; a longer one is cut there.
MAX_TEXT = 1 << 16
I8 = np.int64
U8 = np.uint8


#: The environment variable that caps what peers may make one rank allocate in one call.
PAYLOAD_ENV = "MPICOMM_MAX_PAYLOAD"
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class _Cap:
    value: int | None = None  # None: not read yet (tests reset it after changing the environment)


def physical_memory() -> int:
    """This node's physical memory in bytes (2**48 where the platform does not say)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not every platform names these
        return 1 << 48


def memory_bound() -> int:
    """The most bytes that peers' claims may make this rank allocate in one call.

    ``MPICOMM_MAX_PAYLOAD`` sets it, in bytes with an optional binary suffix (``8G``, ``512M``,
    ``1T``); by default it is a quarter of this node's physical memory. Object headers, jagged
    counts and KJT per-key counts are checked against it before anything is allocated for them. It
    is read once per process; a value it cannot read gives a warning and the default.

    Example:
        >>> memory_bound() > 0
        True
    """
    if _Cap.value is None:
        _Cap.value = _read_cap(os.environ.get(PAYLOAD_ENV, ""))
    return _Cap.value


def _read_cap(text: str) -> int:
    default = physical_memory() // 4
    if not text.strip():
        return default
    found = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if found is None or int(found[1]) <= 0:
        warnings.warn(
            f"{PAYLOAD_ENV}={text!r}: expected a positive number of bytes such as 8G or 536870912; "
            f"using the default, {default} bytes (a quarter of this node's memory)",
            stacklevel=3,
        )
        return default
    return int(found[1]) * _UNITS[found[2]]


def decode(data: Any) -> str:
    """Bytes received from another rank as text (bytes that are not UTF-8 become U+FFFD)."""
    return bytes(data).decode("utf-8", errors="replace")


#: Bytes per rank of the first, fixed-size exchange of a control message: its kind and length words,
#: then the first SLOT - 16 bytes of its text. Its size never depends on what any rank claims, so a
#: rank that lies about its length cannot make MPI truncate a message (MPICH ends the job there).
SLOT = 256
#: Tag of the rest of a text longer than a slot holds, sent point to point and probed for its size.
TEXT_TAG = 20297


def allgather_texts(
    comm: Any,
    kind: int,
    text: bytes,
    limit: int = MAX_TEXT,
    side: Any = None,
    wait: Callable[[Any], None] | None = None,
) -> list[tuple[int, bytes]]:
    """Every rank's ``(kind, text)``, in rank order: one fixed-size ``Allgather``, then the long ones.

    Each rank's kind, length and first :data:`SLOT` - 16 bytes travel in one ``Allgather`` of
    :data:`SLOT` bytes per rank. A longer text sends the rest to every other rank point to point;
    receivers probe each message for its size, so a length word that lies is found, never passed
    to MPI as a receive size.

    Args:
        comm: The communicator.
        kind: This rank's code (0 for success).
        text: This rank's text; cut to ``limit`` bytes.
        limit: The longest text a rank may send.
        side: The communicator of the point-to-point rests (a library-only duplicate of ``comm``,
            so that no user receive can match them); ``comm`` itself by default.
        wait: Completes the fixed-size exchange's request (or raises, keeping the request, so its
            buffers, alive); None: ``Request.Wait``. That exchange is posted non-blocking whatever
            ``wait`` is, since MPI never matches a blocking collective with a non-blocking one, and
            a bounded exchange (``barrier(timeout=)``) must match the plain one on the other ranks.

    Returns:
        ``(kind, text)`` of every rank.

    Raises:
        CommunicationError: on every rank: some rank claims a text length outside ``[0, limit]``, or
            sends a rest of another length than it claimed.
    """
    text = bytes(text[:limit])
    size, me, inline = comm.Get_size(), comm.Get_rank(), SLOT - 16
    side = comm if side is None else side
    table = np.empty((size, SLOT), U8)
    complete: Callable[[Any], Any] = _mpi.MPI.Request.Wait if wait is None else wait
    complete(comm.Iallgather([_slot(kind, text), _mpi.MPI.BYTE], [table, _mpi.MPI.BYTE]))
    words = table[:, :16].copy().view(I8)
    kinds, sizes = words[:, 0].tolist(), words[:, 1].tolist()
    _check_lengths(sizes, limit)
    sends = []
    if len(text) > inline:
        rest = np.frombuffer(text, U8)[inline:]
        sends = [side.Isend([rest, _mpi.MPI.BYTE], r, TEXT_TAG) for r in range(size) if r != me]
    texts, problem = [], None
    for r, n in enumerate(sizes):
        head = table[r, 16 : 16 + min(n, inline)].tobytes()
        if n <= inline or r == me:
            texts.append(head if r != me else text)
            continue
        got, problem = _recv_rest(side, r, n - inline, limit, problem)
        texts.append(head + got)
    _mpi.MPI.Request.Waitall(sends)
    if problem is not None:
        raise CommunicationError(problem)
    return list(zip(kinds, texts, strict=True))


def _slot(kind: int, text: bytes) -> np.ndarray:
    out = np.zeros(SLOT, U8)
    out[:16].view(I8)[:] = (kind, len(text))
    head = text[: SLOT - 16]
    out[16 : 16 + len(head)] = np.frombuffer(head, U8)
    return out


def _recv_rest(
    comm: Any, src: int, expected: int, limit: int, problem: str | None
) -> tuple[bytes, str | None]:
    """The rest of ``src``'s text, probed for its size; a size that differs from the claim is a problem.

    A rest of another size is still received and dropped when it is within the payload cap
    (:func:`memory_bound`): those bytes were really sent, and a matched message left unreceived
    would never complete its send. One past the cap is left unreceived (receiving it would
    allocate what the liar chose), and the error says so.
    """
    status = _mpi.MPI.Status()
    message = comm.Mprobe(src, TEXT_TAG, status)
    count = status.Get_count(_mpi.MPI.BYTE)
    if count == expected:
        buf = np.empty(count, U8)
        message.Recv([buf, _mpi.MPI.BYTE])
        return buf.tobytes(), problem
    if count <= max(limit, memory_bound()):
        message.Recv([np.empty(count, U8), _mpi.MPI.BYTE])
    text = (
        f"control message: rank {src} claims a text {expected} bytes longer than its first slot but "
        f"sent {count}; expected the length it claimed (a rank that does not run mpicomm's wire "
        "format, or a corrupted message)"
    )
    return b"", problem or text


def bcast_text(comm: Any, text: bytes, root: int, limit: int = MAX_TEXT, side: Any = None) -> bytes:
    """``root``'s text on every rank: one fixed-size ``Bcast``, then the rest point to point if long.

    ``side`` is the communicator of the rest, as for :func:`allgather_texts`.

    Raises:
        CommunicationError: on every rank but the root: the root claims a length outside
            ``[0, limit]``, or sends a rest of another length than it claimed.
    """
    text = bytes(text[:limit])
    inline, side = SLOT - 16, comm if side is None else side
    head = _slot(0, text)
    comm.Bcast([head, _mpi.MPI.BYTE], root)
    size = int(head[8:16].view(I8)[0])
    if comm.Get_rank() == root:
        if size > inline:
            rest = np.frombuffer(text, U8)[inline:]
            sends = [
                side.Isend([rest, _mpi.MPI.BYTE], r, TEXT_TAG) for r in range(comm.Get_size()) if r != root
            ]
            _mpi.MPI.Request.Waitall(sends)
        return text
    _check_lengths([size], limit, [root])
    out = head[16 : 16 + min(size, inline)].tobytes()
    if size > inline:
        got, problem = _recv_rest(side, root, size - inline, limit, None)
        if problem is not None:
            raise CommunicationError(problem)
        out += got
    return out


def _check_lengths(sizes: list[int], limit: int, ranks: list[int] | None = None) -> None:
    for rank, size in zip(ranks or range(len(sizes)), sizes, strict=False):
        if not 0 <= size <= limit:
            raise CommunicationError(
                f"control message: rank {rank} claims a {size}-byte text; expected 0 to {limit} bytes "
                "(a rank that does not run mpicomm's wire format, or a corrupted message)"
            )
