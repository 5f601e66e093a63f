"""At ``MPI_THREAD_MULTIPLE``: which call is inside each group, so that two threads on one group raise.

MPI matches the collectives of one communicator by their order on each rank. Two threads of a rank
calling on one group at once enter in an order the other ranks do not share, so calls of different
threads pair up across ranks and return each other's data, silently (issue 44: about 400 of 400
calls of two hammering threads were wrong). Below ``MPI_THREAD_MULTIPLE`` only the thread that
started MPI may call (``mpicomm.core.watchdog.serial``); at ``MPI_THREAD_MULTIPLE`` the front
door (``mpicomm/front/_doors.py`` and the C door, ``mpicomm/front/_door.c``) keeps here, for each
group, the watchdog token of the call inside it (:func:`hold`, :func:`let_go`). A call on a group
that another thread's call is inside:

* marks the group *raced* on this rank, naming the call, the group and the two threads
  (``_RACED``): from then on this rank's calls on it may pair with other calls on the other
  ranks, so every call on it raises a :class:`~mpicomm.DistError` as it returns (:func:`spoiled`),
  the call that was inside included: no call on a raced group returns data;
* waits until the call inside has returned, then takes part as it was made. Refusing it before
  MPI would leave the other ranks waiting for a call this rank never makes (a hang, ended only by
  the watchdog); taking part keeps every rank's number of calls the program's own.

A call nested in another on the same thread (a host calling a public call) and the calls of the
async engine's thread (one at a time, in program order) are not checked; nor are point-to-point
calls that take a ``tag``: MPI matches them by tag, and threads that share a group use tags of their
own (a receiving and a sending thread).

A rank whose threads took turns sees no race, yet can get the data its peers' overlapping threads
paired wrongly. In validation mode (``mpicomm.core.validation``) every held call therefore ends,
before it lets go of its group, with one ``MPI_Allreduce`` of one int over the group's private
communicator (``ProcessGroup.internal``, so that the data communicator's count of calls is the
program's own): the lowest rank on which the group is raced (``settle``). Where there is one,
every rank raises the same error for that call and every later one on the group (``_AGREED``): no
rank returns unreported the data of a call that an overlap can have paired wrongly. Why it holds:
each rank makes its held calls on a group one at a time, the agreement inside the hold, so the i-th
agreement of every rank follows the i-th data call of every rank and they pair up whatever the
threads do (no hang); a thread that comes while another's call is inside marks the group before it
waits (in the C door in the same step that finds the call inside), so the call inside reports the
race at its own agreement: the first call that the overlap can have paired wrongly, on any rank.

Mpicomm cannot see two threads that call on one group one after the other in different orders on
different ranks (nothing overlaps on any rank): ordering those is the program's part, as MPI says.
On the Python path (torch tensors, object collectives) a thread switch exactly between the look
that finds a call inside and the mark can let that one call end unflagged; the next call flags.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, NoReturn

import numpy as np

from .. import _mpi
from ..errors import DistError
from . import groups, validation, watchdog
from .control import bcast_text, decode

__all__ = ["FREE", "POLL", "hold", "key", "let_go", "race", "settle", "spoiled", "validating"]

#: The group key -> the token (``(thread ident, site, group, None)``) of the call inside it. The
#: key is the group object, the world group for ``None``. The C door reads and writes it too.
_BUSY: dict[Any, tuple[Any, ...]] = {}
#: The groups two threads called on at once on this rank -> what happened, for the errors; in
#: validation mode also :data:`_VALIDATING`, so that the doors' one test of this dict on every
#: call (empty: nothing to do) sends each held call to :func:`settle`.
_RACED: dict[Any, str] = {}
#: The groups that validation mode found raced on some rank -> where and what, the same on every
#: rank (set by the same call's agreement on every rank, so every rank's later calls agree too).
_AGREED: dict[Any, str] = {}
#: The key of :data:`_RACED` present while validation mode is on (no group).
_VALIDATING = object()
#: What :func:`hold` returns where the call holds no group (nothing to let go).
FREE = object()
#: Seconds between looks at a group another thread's call is inside.
POLL = 1e-4

_State = groups._State
_PG = groups.ProcessGroup


def key(group: Any) -> Any:
    """The key of ``group`` in ``_BUSY`` (the world group for ``None``), or :data:`FREE`.

    A ``group`` that is no ProcessGroup gets :data:`FREE`: the call's own check raises for it.
    """
    if group is None:
        return _State.world
    return group if type(group) is _PG else FREE


def hold(group: Any, token: tuple[Any, ...], engine: int | None) -> Any:
    """Mark the call of ``token`` as inside ``group``; its key, or :data:`FREE` where it holds nothing.

    Where another thread's call is inside, the group is raced (:func:`race`) and this waits for it.

    Args:
        group: The call's ``group`` argument.
        token: The call's watchdog token; its first entry is the calling thread's ident.
        engine: The ident of the async engine's thread (its calls are not checked).
    """
    me = token[0]
    k = key(group)
    if me == engine or k is FREE:
        return FREE
    inside = _BUSY.setdefault(k, token)
    if inside is token:
        return k
    if inside[0] == me:
        return FREE  # nested in a call of this thread: the outer call lets go
    _RACED.setdefault(k, "")  # at once: the call inside looks here as it ends (validation mode)
    race(token, k, inside)
    return k


def let_go(k: Any, token: tuple[Any, ...]) -> None:
    """End the hold of ``token`` on ``k`` (in a ``finally``: the call's error, if any, is propagating).

    Raises:
        DistError: two threads have called on the group at once on this rank (now or before), or,
            in validation mode, on any rank of the group.
    """
    if _RACED:  # a raced group on this rank, or validation mode: settled while still held
        try:
            settle(token, k, _raised(sys._getframe(1)))
        finally:
            if _BUSY.get(k) is token:
                del _BUSY[k]
    elif _BUSY.get(k) is token:
        del _BUSY[k]


def _raised(caller: Any) -> type[BaseException] | None:
    """The class of the error ``caller`` (the call's wrapper, in its ``finally``) ends with, or None.

    ``sys.exc_info()`` there is also an error that a caller of the wrapper is handling (a call made
    in an ``except`` block): only one whose traceback starts in the wrapper's frame is the call's.
    """
    exc = sys.exc_info()[1]
    tb = None if exc is None else exc.__traceback__
    return type(exc) if exc is not None and tb is not None and tb.tb_frame is caller else None


def settle(token: tuple[Any, ...], k: Any, raised: type[BaseException] | None = None) -> None:
    """Raise where the held call of ``token`` on ``k`` ends on a raced group; in validation mode agree first.

    Called as the call ends, while it still holds ``k``, where :data:`_RACED` is not empty (the C
    door too). In validation mode every rank of the group agrees whether it is raced on any rank
    (:func:`_agree`), unless the call ended in an error: the other ranks may be elsewhere (a
    timeout, an MPI error, a peer that sent what no mpicomm call sends), and waiting for them would
    turn a bounded call into the watchdog's abort; an error validation mode raises is raised on
    every rank, so every rank skips alike.

    Args:
        token: The call's hold token.
        k: The group's key.
        raised: The class of the error the call ends with, or None.

    Raises:
        DistError: the group is raced (on this rank, or found on any rank by validation mode).
    """
    if (
        _VALIDATING in _RACED
        and getattr(k, "internal", None) is not None  # a member: the call was made on every rank
        and raised is None
    ):
        # only what every rank agreed decides, never this rank's own table: a thread that marks it
        # after the agreement read it is this rank's next call's to report
        if _agree(token, k):
            spoiled(token, k)
        return
    if k in _AGREED or k in _RACED:
        spoiled(token, k)


def _agree(token: tuple[Any, ...], k: Any) -> bool:
    """Whether ``k`` is raced on some rank of the group, as every rank of it agrees.

    One ``MPI_Allreduce`` of one int64 (the lowest group rank where ``k`` is raced) on the group's
    private communicator; only where there is one, one ``Bcast`` of that rank's text, so that every
    rank raises the same message. Bounded by the group's timeout (the watchdog times it). A group
    found raced stays so (``_AGREED``, set on every rank by the same call): no more exchanges.
    """
    if k in _AGREED:
        return True
    comm = k.internal
    size = comm.Get_size()
    lowest = np.array([comm.Get_rank() if k in _RACED else size], np.int64)
    watchdog._live.append(token)
    try:
        comm.Allreduce(_mpi.MPI.IN_PLACE, lowest, _mpi.MPI.MIN)
        root = int(lowest[0])
        if root >= size:
            return False
        text = decode(bcast_text(comm, (_RACED.get(k) or "").encode(), root))
    finally:
        watchdog._live.remove(token)
    _AGREED[k] = f"world rank {k.ranks[root]} ({text or 'a thread called while another was inside'})"
    return True


def validating(on: bool) -> None:
    """Validation mode turned on or off (:func:`mpicomm.set_validation`): held calls settle or not."""
    if on:
        _RACED[_VALIDATING] = ""
    else:
        _RACED.pop(_VALIDATING, None)


def race(token: tuple[Any, ...], k: Any, inside: tuple[Any, ...]) -> None:
    """Mark group ``k`` raced (the call of ``token`` came while ``inside``'s was in it), then hold it.

    The C door calls this where it finds another thread's call inside (having marked the group
    already, as :func:`hold` does); it returns with ``token`` inside the group.
    """
    text = (
        f"thread {threading.current_thread().name!r} called {token[1].name} on group {_name(k)} while "
        f"thread {_thread(inside[0])} was inside {inside[1].name} on it"
    )
    if not _RACED.get(k):
        _RACED[k] = text
    while _BUSY.setdefault(k, token) is not token:
        time.sleep(POLL)


def _name(group: Any) -> str:
    return group.name if isinstance(group, _PG) else "world"


def _thread(ident: int) -> str:
    for t in threading.enumerate():
        if t.ident == ident:
            return repr(t.name)
    return f"with ident {ident}"


def spoiled(token: tuple[Any, ...], k: Any) -> NoReturn:
    """Raise the error of the call of ``token`` on the raced group ``k``."""
    agreed = _AGREED.get(k)
    where = (
        f"on this rank ({_RACED.get(k) or 'another thread called while this call was inside'}), "
        "at MPI_THREAD_MULTIPLE"
        if agreed is None
        else f"on {agreed}, at MPI_THREAD_MULTIPLE; validation mode found it as this call ended and "
        "raises it on every rank of the group"
    )
    raise DistError(
        f"{token[1].name}: two threads called on group {_name(k)} at once {where}. MPI matches the "
        "calls of one group by their order on each rank, and threads enter in orders that differ "
        "between ranks, so calls pair up wrongly (wrong data): this call took part, so that no rank "
        "waits for it, but its result is not to be trusted, nor that of any later call on this group. "
        "Expected one call at a time on each group: give each thread its own group (new_group), or "
        "order the threads' calls alike on every rank"
    )


validation.WATCHERS.append(validating)
validating(validation._Flag.on)
