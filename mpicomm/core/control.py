"""Control messages between ranks: fixed int64 words and bounded UTF-8 text, never pickle.

Error reports, status agreements and validation records travel as one ``Allgather`` (or ``Bcast``)
of int64 words, then the texts as raw bytes of a length every receiver checks against a bound
before it allocates. Nothing here unpickles, so a hostile rank cannot run code through them,
whatever safe mode says (mpi4py's lowercase calls, ``comm.allgather`` and ``comm.bcast``, would
unpickle with plain ``pickle``).
"""

from __future__ import annotations

import os
import re
import warnings
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


def allgather_texts(comm: Any, kind: int, text: bytes, limit: int = MAX_TEXT) -> list[tuple[int, bytes]]:
    """Every rank's ``(kind, text)``, in rank order: one int64 ``Allgather``, then one ``Allgatherv``.

    Args:
        comm: The communicator.
        kind: This rank's code (0 for success).
        text: This rank's text; cut to ``limit`` bytes.
        limit: The longest text a rank may send.

    Returns:
        ``(kind, text)`` of every rank.

    Raises:
        CommunicationError: on every rank: some rank claims a text length outside ``[0, limit]``.
    """
    text = text[:limit]
    meta = np.empty((comm.Get_size(), 2), I8)
    comm.Allgather(np.array([kind, len(text)], I8), meta)
    sizes = meta[:, 1].tolist()
    _check_lengths(sizes, limit)
    out = np.empty(sum(sizes), U8)
    displs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).tolist()
    comm.Allgatherv([np.frombuffer(text, U8), _mpi.MPI.BYTE], [out, (sizes, displs), _mpi.MPI.BYTE])
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
