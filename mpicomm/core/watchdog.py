"""The watchdog: a call that stays blocked past its group's timeout ends the job, with a message naming it.

MPI cannot interrupt a blocking call (``MPI_Allreduce`` waits for every rank, however long), and
polling a non-blocking one instead would cost the small-call fast paths. So mpicomm bounds blocking
calls from outside, as torch's NCCL watchdog does. Every public call that can block puts a token on
:data:`_live` as it starts and takes it off as it ends, whatever thread it runs in (about 45 ns a
call: an append and a remove on a short list). The token names the call's site, its group and, for
the calls that bound themselves, their ``timeout`` argument; never an array, so the watchdog keeps
no caller's data alive. A daemon thread, started by :func:`mpicomm.init`, looks at the tokens every
tenth of the shortest bound (at most once a second). A token still there after the call's bound has
passed since it was first seen marks a call that is overdue: the watchdog writes what is blocked
where (call, group, ranks, timeout, the caller's line) to stderr and aborts the MPI job.

The watchdog used to find blocked calls by reading every thread's top frame
(``sys._current_frames()``). On CPython 3.11 that froze a rank for good in CI (a collection that
runs inside ``sys._current_frames()`` and frees a ``threading.local`` waits for a lock its own
thread holds: CPython gh-106883) and crashed it now and then (frames read while another thread was
between states). Tokens need nothing from other threads' frames; only the message of a watchdog
that is about to abort the job reads one, to name the caller's line.

The bound of a call is its group's timeout (``init_process_group(timeout=)``,
``new_group(timeout=)``; torch's default, 30 minutes, for a group made without one, or
``MPICOMM_TIMEOUT`` seconds, ``0`` for no default bound), plus a grace period of
``max(2 s, timeout / 20)`` so that the calls that bound themselves (``barrier`` on a group with a
timeout, ``barrier(timeout=)``, ``monitored_barrier``, ``Work.wait(timeout=)``) raise first. Those
raise a :class:`~mpicomm.CommunicationError` on the waiting ranks; the watchdog is the backstop
for everything MPI cannot interrupt.
"""

from __future__ import annotations

import functools
import gc
import inspect
import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

from .. import _mpi
from ..errors import ArgumentError, DistError

F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "DEFAULT_TIMEOUT",
    "WAIT",
    "Site",
    "default_timeout",
    "forget",
    "own_thread",
    "serial",
    "start",
    "timed",
    "timing",
]

#: torch's default process-group timeout, in seconds.
DEFAULT_TIMEOUT = 1800.0
#: Calls that take their own ``timeout=`` and raise by themselves when it passes, with the factor
#: of it they may wait (monitored_barrier's other ranks wait twice its timeout for rank 0).
_SELF_TIMED = {"barrier": 2.0, "monitored_barrier": 2.0, "wait": 2.0}
#: Of those, the calls that, given no ``timeout=``, bound themselves by the group's timeout with the
#: same factor (monitored_barrier's other ranks wait twice the group's timeout for rank 0).
_SELF_TIMED_BY_GROUP = frozenset({"monitored_barrier"})
_LONGEST_SAMPLE = 1.0
_SHORTEST_SAMPLE = 0.02

#: The calls under way in this process, any thread: one token each, ``(serial, site, group,
#: timeout)``. A call appends its own token and removes it in a ``finally``. The serial number
#: (:data:`serial`) makes every token unequal to every other, so ``list.remove`` takes the call's
#: own token, never another thread's equal one, and stops comparing at the first entry. The front
#: door's calls (the small calls' hot path) put the calling thread's ident there instead, making
#: :func:`serial`'s thread check inline: one C call where ``serial`` costs a Python call and two.
#: Their tokens still differ between threads; two equal ones of one thread would be a front-door
#: call nested in another of the same name and group (none is), whose inner call would take the
#: outer token off first: the list ends right, and only the outer call's timing restarts. A token
#: holds the call's ``group`` and ``timeout`` arguments as given, never its arrays.
_live: list[tuple[int, Site, Any, Any]] = []
_count = itertools.count().__next__  # atomic in CPython
_get_ident = threading.get_ident


class _ThreadState:
    """Below ``MPI_THREAD_MULTIPLE``: the one thread that may call MPI through mpicomm, and this rank.

    One instance (:data:`_Threads`), not a class of constants: every call reads ``owner``, and
    Python 3.11 specialises attribute reads on instances with slots, not on classes.
    """

    __slots__ = ("engine", "level", "owner", "pending", "rank")

    def __init__(self) -> None:
        self.owner: int | None = None  # None: any thread (MPI_THREAD_MULTIPLE, or before init)
        self.level = "multiple"
        self.rank = 0
        self.engine: int | None = None  # the communication thread's ident (mpicomm.core.engine)
        self.pending = 0  # calls queued for it and not finished: while any is, it alone enters MPI


_Threads = _ThreadState()


def serial() -> int:
    """The next token's serial number; below ``MPI_THREAD_MULTIPLE``, only for the owning thread.

    Every call that can block takes its token's number here before any MPI call (the front door's
    generated wrappers make the same test inline, :data:`_live`), so this is where
    mpicomm makes sure that two threads never enter MPI at once when MPI runs at a level below
    ``MPI_THREAD_MULTIPLE`` (mpicomm's default is ``serialized``, :mod:`mpicomm._mpi`): a call from
    a thread other than the one that ran :func:`mpicomm.init` is refused, before it reaches MPI,
    with an error that says how to allow it. Two threads each in a blocking collective under one
    lock could deadlock across ranks (each rank's lock held by a different thread), so mpicomm does
    not serialise them behind a lock: several communicating threads need ``MPI_THREAD_MULTIPLE``.

    Raises:
        DistError: a call from another thread below ``MPI_THREAD_MULTIPLE``.
    """
    owner = _Threads.owner
    if owner is not None and _get_ident() != owner and _get_ident() != _Threads.engine:
        _other_thread()
    if _Threads.pending and _get_ident() != _Threads.engine:
        _drain()  # a call outside the engine's gate: after the queued calls, in program order
    return _count()


def _drain(timeout: Any = None, fn: str = "mpicomm") -> None:
    """Wait for the engine's queue to empty (:func:`mpicomm.core.engine.drain`, set as :data:`_drainer`)."""
    if _drainer is not None:
        _drainer(timeout, fn)


#: :func:`mpicomm.core.engine.drain`, set when the engine is imported (it imports this module: the
#: arrow points from the engine to the watchdog, never back). Nothing is queued before it is set.
_drainer: Callable[[Any, str], None] | None = None


def _other_thread() -> None:
    raise DistError(
        f"mpicomm: a call from thread {threading.current_thread().name!r}, but MPI runs at thread level "
        f"{_Threads.level} and mpicomm's calls belong to the thread that initialised it; expected calls "
        "from that thread only, or MPI at MPI_THREAD_MULTIPLE: set MPICOMM_THREAD_LEVEL=multiple before "
        "MPI starts (each thread on its own group)"
    )


def own_thread() -> None:
    """Bind mpicomm's calls to this thread if MPI runs below ``MPI_THREAD_MULTIPLE`` (init calls it)."""
    MPI = _mpi.MPI
    granted = MPI.Query_thread()
    names = {
        MPI.THREAD_SINGLE: "single",
        MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized",
    }
    _Threads.level = names.get(granted, "multiple")
    _Threads.rank = MPI.COMM_WORLD.Get_rank()
    _Threads.owner = None if granted >= MPI.THREAD_MULTIPLE else _get_ident()


class Site:
    """A public call that can block, as the watchdog names it.

    Args:
        name: The public name (``all_reduce``, ``Work.wait``, ``KJTAllToAll``).
        pick: Given the token's second entry, the call's group; by default the entry itself (the
            call's ``group`` argument).
    """

    __slots__ = ("by_group", "factor", "name", "pick")

    def __init__(self, name: str, pick: Callable[[Any], Any] | None = None) -> None:
        self.name = name
        self.pick = pick
        short = name.rsplit(".", 1)[-1]
        self.factor = _SELF_TIMED.get(short)
        self.by_group = short in _SELF_TIMED_BY_GROUP


#: How the watchdog names a wait on a :class:`~mpicomm.Work`: the operation's group is not known
#: there, so the world's bound applies.
WAIT = Site("Work.wait", lambda _: None)


class _Timing:
    """The context manager :func:`timing` returns (a class: cheaper than a generator's)."""

    __slots__ = ("token",)

    def __init__(self, token: tuple[int, Site, Any, Any]) -> None:
        self.token = token

    def __enter__(self) -> None:
        _live.append(self.token)

    def __exit__(self, *exc: object) -> None:
        _live.remove(self.token)


def timing(site: Site, group: Any = None, timeout: Any = None) -> _Timing:
    """Have the watchdog time a ``with`` block as one call of ``site`` (for code off the hot path).

    The front door's wrappers (``mpicomm/front/_doors.py``, ``_door.c``) and
    :func:`mpicomm.core.calls.collective` put their tokens on :data:`_live` inline instead: they are
    the small calls' hot path.

    Args:
        site: How the watchdog names the call.
        group: The call's ``group`` argument (None: the world's bound applies).
        timeout: The call's own ``timeout`` argument, for the calls that bound themselves.

    Returns:
        The context manager.

    Example:
        >>> from mpicomm.core import watchdog
        >>> with watchdog.timing(watchdog.WAIT, None, 5.0):
        ...     pass  # a wait the watchdog ends the job for if it lasts past its bound
    """
    return _Timing((serial(), site, group, timeout))


def timed(site: Site, group_arg: str | None = "group", timeout_arg: str | None = None) -> Callable[[F], F]:
    """Have the watchdog time every call of the decorated function as ``site`` (for calls off the hot path).

    Args:
        site: How the watchdog names the call.
        group_arg: The parameter that holds the call's group (None: the world's bound applies).
        timeout_arg: The parameter that holds the call's own timeout, for the calls that bound
            themselves.

    Returns:
        The decorator.
    """

    def wrap(func: F) -> F:
        signature = inspect.signature(func)

        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind_partial(*args, **kwargs).arguments
            except TypeError:  # the function raises its own TypeError below
                bound = {}
            group = bound.get(group_arg) if group_arg else None
            with timing(site, group, bound.get(timeout_arg) if timeout_arg else None):
                return func(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap


class _Dog:
    thread: threading.Thread | None = None
    state: Any = None  # mpicomm.core.groups._State: the world and every group (given to start)
    group_type: Any = None  # mpicomm.core.groups.ProcessGroup
    default: float | None = DEFAULT_TIMEOUT
    seen: dict[int, _Call] = {}  # noqa: RUF012 - id of a live token -> the call it stands for
    own: dict[Any, bool] = {}  # noqa: RUF012 - code object -> whether it is an mpicomm call (messages)


def default_timeout() -> float | None:
    """The bound of a group made without a timeout: ``MPICOMM_TIMEOUT`` seconds, else 30 minutes.

    Returns:
        Seconds, or None for no bound (``MPICOMM_TIMEOUT=0``).

    Raises:
        ArgumentError: the variable is not a number of seconds >= 0.

    Example:
        >>> default_timeout() is None or default_timeout() > 0
        True
    """
    text = os.environ.get("MPICOMM_TIMEOUT", "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or math.isinf(seconds):
        raise ArgumentError(f"init: MPICOMM_TIMEOUT is {text!r}; expected seconds >= 0 (0: no default bound)")
    return seconds or None


def start(state: Any, group_type: type) -> None:
    """Start the watchdog thread once per process (:func:`mpicomm.init` calls it).

    Args:
        state: Where the world group and the list of every group are (``groups._State``).
        group_type: The class of process groups.
    """
    _Dog.default = default_timeout()
    _Dog.state, _Dog.group_type = state, group_type
    own_thread()
    if _Dog.thread is not None and _Dog.thread.is_alive():
        return
    _Dog.thread = threading.Thread(target=_run, name="mpicomm-watchdog", daemon=True)
    _Dog.thread.start()


def _run() -> None:
    while True:
        try:
            time.sleep(_interval())
            late = _sample(_Dog.seen, time.monotonic())
        except Exception:  # never let a fault of the watchdog itself end the job (the abort hook)
            forget()
            continue
        if late is not None:
            _fire(late)


def forget() -> None:
    """Drop the calls the watchdog is timing (their tokens hold groups and numbers, never arrays)."""
    _Dog.seen = {}


def _interval() -> float:
    """A tenth of the shortest bound of any group (at most a second, at least 20 ms)."""
    bounds = [g.timeout for g in _Dog.state.groups if g.timeout is not None]
    if _Dog.default is not None:
        bounds.append(_Dog.default)
    shortest = min(bounds, default=10 * _LONGEST_SAMPLE)
    return min(_LONGEST_SAMPLE, max(_SHORTEST_SAMPLE, shortest / 10))


class _Call:
    """One call under way: its token, when the watchdog first saw it, and its bound (read once)."""

    __slots__ = ("group", "known", "limit", "name", "since", "source", "token")

    def __init__(self, token: tuple[int, Site, Any, Any], since: float) -> None:
        self.token = token
        self.since = since
        self.limit: float | None = None
        self.name = token[1].name
        self.group: Any = None
        self.known = True  # whether the call names its group (a Work does not: the world's applies)
        self.source = ""

    def bound(self) -> float:
        """Seconds after which this call is overdue."""
        if self.limit is None:
            self.limit = self._bound()
        return self.limit

    def _bound(self) -> float:
        _, site, held, own_timeout = self.token
        group = site.pick(held) if site.pick is not None else held
        self.known = site.pick is None or isinstance(group, _Dog.group_type)
        self.group = group if isinstance(group, _Dog.group_type) else _Dog.state.world
        own = _seconds(own_timeout) if site.factor is not None else None
        if own is not None and site.factor is not None:
            self.source = f"its timeout= argument, {own:g} s"
            return site.factor * own + _grace(own)
        limit = self.group.timeout if self.group is not None else None
        if limit is not None:
            self.source = f"the timeout group {self.group.name} was made with, {limit:g} s"
        elif _Dog.default is not None:
            limit = _Dog.default
            self.source = f"the default timeout, {limit:g} s (torch's; MPICOMM_TIMEOUT changes it)"
        else:
            return math.inf
        if site.by_group and site.factor is not None:
            self.source += f", times {site.factor:g} (the call waits that long by itself)"
            return site.factor * limit + _grace(limit)
        return limit + _grace(limit)


def _seconds(timeout: Any) -> float | None:
    """Seconds in a call's ``timeout`` argument (a ``timedelta`` or a number), or None."""
    seconds = getattr(timeout, "total_seconds", None)
    try:
        value = float(seconds() if seconds is not None else timeout)
    except (TypeError, ValueError):
        return None
    return value if value >= 0 else None


def _grace(limit: float) -> float:
    return max(2.0, limit / 20)


def _sample(seen: dict[int, _Call], now: float) -> _Call | None:
    """Update ``seen`` (id of a live token -> its call) and return a call that is overdue, if any.

    A token seen at an earlier sample and still live is the same call (the entry holds the token,
    so its id cannot be reused meanwhile); its time runs from the first sample that saw it.
    """
    live = {id(t): t for t in list(_live)}  # a copy: calls start and end meanwhile
    for key in [k for k in seen if k not in live]:
        del seen[key]
    late = None
    for key, token in live.items():
        call = seen.get(key)
        if call is None:
            seen[key] = _Call(token, now)
        elif late is None and now - call.since > call.bound():
            late = call
    return late


def _caller_site(name: str) -> str:
    """``; called at FILE:LINE`` for the thread blocked in the public call ``name``, or ``""``.

    Reads other threads' frames (``sys._current_frames()``, with garbage collection held off), which
    the watchdog does only here, once, on its way to abort the job. The thread whose outermost
    mpicomm frame goes by ``name`` is preferred; else the first one in an mpicomm call.
    """
    want = name.rsplit(".", 1)[-1]
    collecting = gc.isenabled()
    gc.disable()
    try:
        me, first = threading.get_ident(), ""
        for ident, top in sys._current_frames().items():
            outer: FrameType | None = None
            frame: FrameType | None = top
            while frame is not None and ident != me and ident != _Threads.engine:  # the program's line
                if _is_own(frame):
                    outer = frame
                frame = frame.f_back
            caller = outer.f_back if outer is not None else None
            while caller is not None and _is_library(caller):
                caller = caller.f_back  # the program's line, not torch's wrapper or mpicomm's adapter
            if outer is None or caller is None:
                continue
            site = f"; called at {caller.f_code.co_filename}:{caller.f_lineno}"
            local = outer.f_locals
            names = {outer.f_code.co_name, str(local.get("fn")), getattr(local.get("site"), "name", "")}
            if want in names or name in names:
                return site
            first = first or site
        return first
    except Exception:
        return ""
    finally:
        if collecting:
            gc.enable()


#: Modules whose frames are mpicomm calls (to find the caller's line for the message).
_CALL_MODULES = (
    "mpicomm.core.",
    "mpicomm.dense.",
    "mpicomm.front.",
    "mpicomm.jagged.",
    "mpicomm.objects.",
    "mpicomm.gpu.",
)


def _is_own(frame: FrameType) -> bool:
    """Whether ``frame`` runs mpicomm code (cached by code object)."""
    code = frame.f_code
    own = _Dog.own.get(code)
    if own is None:
        name = frame.f_globals.get("__name__", "")
        own = isinstance(name, str) and name.startswith(_CALL_MODULES) and name != __name__
        _Dog.own[code] = own
    return own


#: Packages whose frames the caller's line skips: a torch call reaches mpicomm through torch's own
#: wrappers and mpicomm's torch adapter (mpicomm.c10d), none of them the line the user wrote.
_LIBRARIES = ("mpicomm", "torch")


def _is_library(frame: FrameType) -> bool:
    """Whether ``frame`` runs code of mpicomm or torch."""
    name = frame.f_globals.get("__name__", "")
    return isinstance(name, str) and name.split(".", 1)[0] in _LIBRARIES


def message(call: _Call, waited: float) -> str:
    """What the watchdog writes before it ends the job."""
    g = call.group
    where = f"group {g.name} (world ranks {_short(g.ranks)})" if g is not None else "its group"
    if not call.known:
        where = f"its operation's group (not known here; the bound of {where} applies)"
    site = _caller_site(call.name)
    return (
        f"mpicomm watchdog: {call.name} on {where} has been blocked for {waited:.1f} s, past its bound "
        f"({call.source}){site}. Timed out: expected every rank of the group to enter the same call; "
        "a rank never arrived, or ranks wait in different calls (monitored_barrier names missing "
        "ranks; MPICOMM_VALIDATE=1 names different calls). MPI cannot interrupt a blocking call: "
        "aborting the MPI job, as torch's NCCL watchdog does"
    )


def _short(ranks: list[int]) -> str:
    return str(ranks) if len(ranks) <= 8 else f"[{ranks[0]}, {ranks[1]}, ..., {ranks[-1]}] ({len(ranks)})"


def _fire(call: _Call) -> None:
    text = message(call, time.monotonic() - call.since)
    sys.stderr.write(f"[rank {_Threads.rank}] {text}\n")
    sys.stderr.flush()
    time.sleep(0.25)  # let the launcher forward the message before the abort tears the job down
    if _Threads.owner is None:  # MPI_THREAD_MULTIPLE: this thread may enter MPI beside the stuck call
        _mpi.MPI.COMM_WORLD.Abort(1)
    # Below it, the stuck thread is inside MPI and no other may enter: the process ends without MPI,
    # and the launcher (mpiexec, mpirun; srun with --kill-on-bad-exit) ends the job on the exit status.
    os._exit(1)  # also where MPICH's Abort returns when called from a thread other than the main one
