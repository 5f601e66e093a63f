"""What went wrong in a failed MPI call, in words: which message, from which peer, how many bytes.

An exchange of several messages (the list collectives' pairwise exchange) that fails reports only
``MPI_ERR_IN_STATUS`` ("See the MPI_ERROR field in MPI_Status"): the error of each request is in
its own status. :func:`waitall` and :func:`all_done` wait on the requests of such an exchange
(:class:`Posted`, which records each request's peer and size) and, on failure, keep the statuses on
the exception; the C exchange (``mpicomm.core._cmpi``) keeps its raw statuses the same way.
:func:`describe` turns them into the failing request's own error ("the message from group rank 1
did not fit the 32 bytes expected"). A receive that completes short, which MPI counts as a
success, is an error here too: the bytes it left unwritten are not the caller's to see.
"""

from __future__ import annotations

import ctypes
import re
from typing import Any

from .. import _mpi
from ..errors import CommunicationError

__all__ = ["Posted", "all_done", "describe", "waitall"]


class Posted(list[Any]):
    """The requests of one exchange, with each one's (peer, is_receive, bytes expected), in order.

    Example:
        >>> reqs = Posted([], [], "all_gather")
        >>> reqs.fn, len(reqs)
        ('all_gather', 0)
    """

    def __init__(self, requests: list[Any], posted: list[tuple[int, bool, int]], fn: str) -> None:
        super().__init__(requests)
        self.posted = posted
        self.fn = fn


def waitall(requests: list[Any]) -> None:
    """``MPI_Waitall`` of ``requests``; for a :class:`Posted` exchange, errors that say which message.

    Raises:
        mpi4py.MPI.Exception: MPI reported an error (carrying the statuses :func:`describe` reads).
        CommunicationError: a receive of a Posted exchange completed short.
    """
    MPI = _mpi.MPI
    if type(requests) is not Posted:
        MPI.Request.Waitall(requests)
        return
    statuses = [MPI.Status() for _ in requests]
    live = [bool(r) for r in requests]  # a request completed before (a Work waited twice) says nothing
    try:
        MPI.Request.Waitall(requests, statuses)
    except MPI.Exception as exc:
        _keep(exc, requests, statuses)
        raise
    _check_counts(requests, statuses, live)


def all_done(requests: list[Any]) -> bool:
    """``MPI_Testall`` of ``requests``, with :func:`waitall`'s errors."""
    MPI = _mpi.MPI
    if type(requests) is not Posted:
        return bool(MPI.Request.Testall(requests))
    statuses = [MPI.Status() for _ in requests]
    live = [bool(r) for r in requests]
    try:
        ready = bool(MPI.Request.Testall(requests, statuses))
    except MPI.Exception as exc:
        _keep(exc, requests, statuses)
        raise
    if ready:
        _check_counts(requests, statuses, live)
    return ready


def _keep(exc: Any, requests: Posted, statuses: list[Any]) -> None:
    try:
        exc.mpicomm_posted = [(p, receive, n) for p, receive, n in requests.posted]
        exc.mpicomm_statuses = statuses
    except AttributeError:  # an exception that takes no attributes: its plain text then
        pass


def _check_counts(requests: Posted, statuses: list[Any], live: list[bool]) -> None:
    byte = _mpi.MPI.BYTE
    for (peer, receive, want), status, was in zip(requests.posted, statuses, live, strict=True):
        if receive and was:
            got = status.Get_count(byte)
            if got != want:
                raise CommunicationError(f"{requests.fn}: {_short(peer, got, want)}")


def _short(peer: int, got: int, want: int) -> str:
    return (
        f"the message from group rank {peer} held {got} bytes; expected {want} (the ranks disagree on "
        "a size: the unreceived bytes were not handed back; MPICOMM_VALIDATE=1 names the argument)"
    )


def describe(exc: BaseException) -> str | None:
    """The failing request's own error for an exception kept by :func:`waitall` or the C exchange.

    None when ``exc`` carries nothing to decode (the caller then uses MPI's own text).
    """
    short = getattr(exc, "mpicomm_short", None)
    if short is not None:
        return _short(*short)
    posted = getattr(exc, "mpicomm_posted", None)
    statuses = getattr(exc, "mpicomm_statuses", None)
    if posted is None or statuses is None:
        return _class_text(exc)
    if isinstance(statuses, bytes):
        statuses = _from_raw(statuses, len(posted))
    MPI = _mpi.MPI
    for (peer, receive, want), status in zip(posted, statuses, strict=False):
        code = status.Get_error()
        if code in (MPI.SUCCESS, MPI.ERR_PENDING):
            continue
        text = _error_string(code)
        if not receive:
            return f"the send to group rank {peer} ({want} bytes) failed: {text}"
        if MPI.Get_error_class(code) == MPI.ERR_TRUNCATE:
            arrived = _arrived(text)
            held = f"held {arrived} bytes" if arrived is not None else "was longer"
            return (
                f"the message from group rank {peer} {held}; expected {want} (truncated: the ranks "
                "disagree on a size; MPICOMM_VALIDATE=1 names the argument)"
            )
        return f"the receive from group rank {peer} ({want} bytes expected) failed: {text}"
    return _class_text(exc)


def _arrived(text: str) -> int | None:
    """The size of a truncated message where MPI's text gives it, else None.

    MPICH says "... truncated; 32 bytes received but buffer size is 64": its two numbers are the
    buffer and the message, so the message is the larger.
    """
    found = re.search(_BYTES, text)
    return None if found is None else max(int(found[1]), int(found[2]))


# patterns, not compiled ones: re compiles (and caches) them on the first error that needs them, not
# at the first call of every program (issue 44)
_BYTES = r"(\d+) bytes received but buffer size is (\d+)"
_FROM = r"Message from rank (\d+) and tag -?\d+ truncated; (\d+) bytes received but buffer size is (\d+)"


def _from_raw(raw: bytes, count: int) -> list[Any]:
    """mpi4py Status objects holding the raw MPI_Status structs of the C exchange."""
    MPI = _mpi.MPI
    size = MPI._sizeof(MPI.Status)
    out = []
    for i in range(min(count, len(raw) // size)):
        status = MPI.Status()
        ctypes.memmove(MPI._addressof(status), raw[i * size : (i + 1) * size], size)
        out.append(status)
    return out


def _error_string(code: int) -> str:
    try:
        return str(_mpi.MPI.Get_error_string(code))
    except Exception:
        return f"MPI error code {code}"


def _class_text(exc: BaseException) -> str | None:
    """A plainer lead for the classes whose MPI text says little (a truncation inside a collective)."""
    get = getattr(exc, "Get_error_class", None)
    if get is None:
        return None
    try:
        kind = get()
    except Exception:
        return None
    MPI = _mpi.MPI
    if kind in (MPI.ERR_IN_STATUS, MPI.ERR_TRUNCATE):
        text = _error_string(getattr(exc, "error_code", kind))
        found = re.search(_FROM, text)
        if found is not None:  # MPICH names the peer of a single receive
            a, b = int(found[2]), int(found[3])
            return (
                f"the message from group rank {found[1]} held {max(a, b)} bytes; expected {min(a, b)} "
                "(truncated: the ranks disagree on a size; MPICOMM_VALIDATE=1 names the argument)"
            )
        arrived = _arrived(text)
        inside = "MPI_ERR_IN_STATUS" if kind == MPI.ERR_IN_STATUS else text.split(",")[0].split("\n")[0]
        return (
            "a message was longer than the buffer that received it"
            + (f" ({arrived} bytes arrived)" if arrived is not None else "")
            + f": the ranks disagree on a size (MPICOMM_VALIDATE=1 names the argument and the ranks) "
            f"(MPI: {inside})"
        )
    return None
