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

Mpicomm cannot see two threads that call on one group one after the other in different orders on
different ranks (nothing overlaps on any rank): ordering those is the program's part, as MPI says.
"""

from __future__ import annotations

import threading
import time
from typing import Any, NoReturn

from ..errors import DistError
from . import groups

__all__ = ["FREE", "POLL", "hold", "key", "let_go", "race", "spoiled"]

#: The group key -> the token (``(thread ident, site, group, None)``) of the call inside it. The
#: key is the group object, the world group for ``None``. The C door reads and writes it too.
_BUSY: dict[Any, tuple[Any, ...]] = {}
#: The groups two threads called on at once on this rank -> what happened, for the errors.
_RACED: dict[Any, str] = {}
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
    race(token, k, inside)
    return k


def let_go(k: Any, token: tuple[Any, ...]) -> None:
    """End the hold of ``token`` on ``k``.

    Raises:
        DistError: two threads have called on the group at once on this rank (now or before).
    """
    if _BUSY.get(k) is token:
        del _BUSY[k]
    if _RACED and k in _RACED:
        spoiled(token, k)


def race(token: tuple[Any, ...], k: Any, inside: tuple[Any, ...]) -> None:
    """Mark group ``k`` raced (the call of ``token`` came while ``inside``'s was in it), then hold it.

    The C door calls this where it finds another thread's call inside; it returns with ``token``
    inside the group.
    """
    _RACED.setdefault(
        k,
        f"thread {threading.current_thread().name!r} called {token[1].name} on group {_name(k)} while "
        f"thread {_thread(inside[0])} was inside {inside[1].name} on it",
    )
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
    raise DistError(
        f"{token[1].name}: two threads called on group {_name(k)} at once on this rank ({_RACED.get(k)}), "
        "at MPI_THREAD_MULTIPLE. MPI matches the calls of one group by their order on each rank, and "
        "threads enter in orders that differ between ranks, so calls pair up wrongly (wrong data): this "
        "call took part, so that no rank waits for it, but its result is not to be trusted, nor that "
        "of any later call on this group on this rank. Expected one call at a time on each group: give "
        "each thread its own group (new_group), or order the threads' calls alike on every rank"
    )
