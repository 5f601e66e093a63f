"""The watchdog: a call that stays blocked past its group's timeout ends the job, with a message naming it.

MPI cannot interrupt a blocking call (``MPI_Allreduce`` waits for every rank, however long), and
polling a non-blocking one instead would cost the small-call fast paths. So mpicomm bounds blocking
calls from outside, as torch's NCCL watchdog does: a daemon thread, started by :func:`mpicomm.init`,
samples the top Python frame (``sys._current_frames()``) of every thread that called
:func:`mpicomm.init` (the first call's thread, where MPI started by itself) every tenth of the
shortest timeout (at most once a second). Other threads' frames are never read: CI segfaulted
reading the top frame of a thread that was ending (pytest-timeout's timer thread), so a thread of
yours that makes mpicomm calls is watched once it has called ``mpicomm.init()`` itself (a cheap
call once MPI runs). A thread whose top frame is the same mpicomm frame at two samples in a row
is blocked in a call (inside MPI, or polling); its stack is then walked once to the public call.
When that thread has stayed in that frame for longer than the call's bound, the watchdog writes
what is blocked where (call, group, ranks, timeout, the caller's line) to stderr and aborts the MPI
job.

The bound of a call is its group's timeout (``init_process_group(timeout=)``,
``new_group(timeout=)``; torch's default, 30 minutes, for a group made without one, or
``MPICOMM_TIMEOUT`` seconds, ``0`` for no default bound), plus a grace period of
``max(2 s, timeout / 20)`` so that the calls that bound themselves (``barrier`` on a group with a
timeout, ``barrier(timeout=)``, ``monitored_barrier``, ``Work.wait(timeout=)``) raise first. Those
raise a :class:`~mpicomm.CommunicationError` on the waiting ranks; the watchdog is the backstop
for everything MPI cannot interrupt.

The calls themselves do nothing for the watchdog: the fast paths cost what they cost without it.
A frame the watchdog is timing stays referenced by it until its next sample (at most a second),
so the arguments of a call that just returned may outlive it by that long.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import threading
import time
from types import FrameType
from typing import Any

from .. import _mpi
from ..errors import ArgumentError

__all__ = ["DEFAULT_TIMEOUT", "default_timeout", "forget", "start", "watch"]

#: torch's default process-group timeout, in seconds.
DEFAULT_TIMEOUT = 1800.0
#: Modules whose frames are mpicomm calls that communicate (not the planner, the apps or the CLI).
_CALL_MODULES = (
    "mpicomm.core.",
    "mpicomm.dense.",
    "mpicomm.front.",
    "mpicomm.jagged.",
    "mpicomm.objects.",
    "mpicomm.gpu.",
)
#: Calls that take their own ``timeout=`` and raise by themselves when it passes, with the factor
#: of it they may wait (monitored_barrier's other ranks wait twice its timeout for rank 0).
_SELF_TIMED = {"barrier": 2.0, "monitored_barrier": 2.0, "wait": 2.0}
_LONGEST_SAMPLE = 1.0
_SHORTEST_SAMPLE = 0.02


class _Dog:
    thread: threading.Thread | None = None
    state: Any = None  # mpicomm.core.groups._State: the world and every group (given to start)
    group_type: Any = None  # mpicomm.core.groups.ProcessGroup
    default: float | None = DEFAULT_TIMEOUT
    own: dict[Any, bool] = {}  # noqa: RUF012 - code object -> whether it is an mpicomm call
    tops: dict[int, tuple[Any, float]] = {}  # noqa: RUF012 - thread id -> (its mpicomm top frame, since)
    seen: dict[int, Any] = {}  # noqa: RUF012 - thread id -> the _Call it is blocked in
    sampling = threading.Lock()  # held through a sample, which holds the watched threads' top frames
    watched: dict[int, threading.Thread] = {}  # noqa: RUF012 - ident -> a thread that called init()


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
    if _Dog.thread is not None and _Dog.thread.is_alive():
        return
    _Dog.thread = threading.Thread(target=_run, name="mpicomm-watchdog", daemon=True)
    _Dog.thread.start()


def watch() -> None:
    """Have the watchdog time the calling thread's mpicomm calls (:func:`mpicomm.init` calls this)."""
    _Dog.watched[threading.get_ident()] = threading.current_thread()


def _run() -> None:
    seen = _Dog.seen
    while True:
        try:
            time.sleep(_interval())
            with _Dog.sampling:
                late = _sample(seen, time.monotonic())
        except Exception:  # never let a fault of the watchdog itself end the job (the abort hook)
            forget()
            continue
        if late is not None:
            _fire(late)


def forget() -> None:
    """Drop every frame the watchdog holds (it holds each until its next sample, at most a second).

    For tests that check that a call's arrays or a dropped ``Work`` are freed as soon as the call
    returns: the frames the watchdog last saw keep their locals alive until it samples again. A
    sample under way (it holds every thread's top frame while it runs, which on a crowded machine
    can be a while: it needs the GIL) is let finish first.
    """
    with _Dog.sampling:
        _Dog.seen.clear()
        _Dog.tops.clear()


def _interval() -> float:
    """A tenth of the shortest bound of any group (at most a second, at least 20 ms)."""
    bounds = [g.timeout for g in _Dog.state.groups if g.timeout is not None]
    if _Dog.default is not None:
        bounds.append(_Dog.default)
    shortest = min(bounds, default=10 * _LONGEST_SAMPLE)
    return min(_LONGEST_SAMPLE, max(_SHORTEST_SAMPLE, shortest / 10))


class _Call:
    """One public call seen on a thread's stack: its frame, when first seen, and (later) its bound."""

    __slots__ = ("frame", "group", "known", "limit", "name", "since", "source", "top")

    def __init__(self, frame: FrameType, since: float, top: FrameType) -> None:
        self.frame = frame
        self.top = top  # the thread's top frame, blocked in this call
        self.since = since
        self.limit: float | None = None
        self.name = frame.f_code.co_name
        self.group: Any = None
        self.known = True  # whether the call names its group (a Work does not: the world's applies)
        self.source = ""

    def bound(self) -> float:
        """Seconds after which this call is overdue (read once, from the frame's arguments)."""
        if self.limit is None:
            self.limit = self._bound()
        return self.limit

    def _bound(self) -> float:
        local = self.frame.f_locals
        if self.frame.f_code.co_filename.endswith("calls.py") and "fn" in local:
            self.name = str(local["fn"])
            local = _bound_arguments(local)
        owner = local.get("self")
        group = local.get("group")
        if isinstance(owner, _Dog.group_type):
            group = owner
            self.name = f"ProcessGroup.{self.name}"
        elif owner is not None:
            self.name = f"{type(owner).__name__}.{self.name}"  # Work.wait, Future.wait, ...
            self.known = isinstance(group, _Dog.group_type)
        self.group = group if isinstance(group, _Dog.group_type) else _Dog.state.world
        factor = _SELF_TIMED.get(self.name.rsplit(".", 1)[-1])
        own = _seconds(local.get("timeout")) if factor is not None else None
        if own is not None and factor is not None:
            self.source = f"its timeout= argument, {own:g} s"
            return factor * own + _grace(own)
        limit = self.group.timeout if self.group is not None else None
        if limit is not None:
            self.source = f"the timeout group {self.group.name} was made with, {limit:g} s"
        elif _Dog.default is not None:
            limit = _Dog.default
            self.source = f"the default timeout, {limit:g} s (torch's; MPICOMM_TIMEOUT changes it)"
        else:
            return math.inf
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


def _bound_arguments(local: dict[str, Any]) -> dict[str, Any]:
    """The named arguments of a call wrapped by :func:`mpicomm.core.calls.collective`."""
    try:
        bound = dict(local["signature"].bind_partial(*local["args"], **local["kwargs"]).arguments)
        group_of = local.get("group_of")
        if group_of is not None:
            bound["group"] = group_of(bound)
    except Exception:
        return {}
    return bound


def _sample(seen: dict[int, _Call], now: float) -> _Call | None:
    """Update ``seen`` (thread id -> the call it is blocked in) and return one that is overdue.

    Only each watched thread's top frame is read on every sample. A thread is blocked in a call when the
    same mpicomm frame object is its top frame at two samples in a row (a thread inside MPI, or
    polling, stays in one Python frame); only then is its stack walked up to the public call, whose
    arguments give the bound. Walking the stacks of running threads on every sample, as this did
    before, segfaulted twice in CI (CPython 3.11: ``f_back`` of a frame another thread popped while
    the walk let it run); a blocked thread's frames do not move while it is walked, and garbage
    collection, which could let another thread run mid-walk, is held off during the walk.
    """
    frames = sys._current_frames()
    me = threading.get_ident()  # a watched thread that samples (a test) must not hold its own frame
    tops, _Dog.tops = _Dog.tops, {}
    for ident, thread in list(_Dog.watched.items()):  # a copy: other threads may call init() meanwhile
        top = frames.get(ident)
        if top is None or not thread.is_alive():
            if _Dog.watched.get(ident) is thread:
                del _Dog.watched[ident]  # the thread has ended (a new thread may reuse its ident)
        elif ident != me and _is_own(top):
            _Dog.tops[ident] = (top, tops[ident][1] if ident in tops and tops[ident][0] is top else now)
    # Only the watched threads' frames are read, and the table goes at once: it also holds this very
    # frame (kept, a cycle frame -> table -> frame would hold every thread's top frame, and the
    # arrays in them, until a GC pass) and the frames of threads that may be ending.
    del frames
    for ident in [i for i in seen if i not in _Dog.tops or _Dog.tops[i][0] is not seen[i].top]:
        del seen[ident]
    for ident, (top, since) in _Dog.tops.items():
        if since == now:
            continue  # a new top frame: the thread is running, or has just called in
        old = seen.get(ident)
        if old is None:
            frame = _walk(top)
            if frame is not None:
                seen[ident] = _Call(frame, since, top)
        elif now - old.since > old.bound():
            return old
    return None


def _walk(top: FrameType) -> FrameType | None:
    """:func:`_outermost` of a blocked thread's stack, with garbage collection held off."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _outermost(top)
    finally:
        if collecting:
            gc.enable()


def _is_own(frame: FrameType) -> bool:
    """Whether ``frame`` runs mpicomm code (cached by code object)."""
    code = frame.f_code
    own = _Dog.own.get(code)
    if own is None:
        name = frame.f_globals.get("__name__", "")
        own = code.co_filename.startswith("<front door:") or (
            isinstance(name, str) and name.startswith(_CALL_MODULES) and name != __name__
        )
        _Dog.own[code] = own
    return own


def _outermost(frame: FrameType | None) -> FrameType | None:
    """The outermost frame of the stack that is an mpicomm call, or None."""
    found = None
    while frame is not None:
        if _is_own(frame):
            found = frame
        frame = frame.f_back
    return found


def message(call: _Call, waited: float) -> str:
    """What the watchdog writes before it ends the job."""
    g = call.group
    where = f"group {g.name} (world ranks {_short(g.ranks)})" if g is not None else "its group"
    if not call.known:
        where = f"its operation's group (not known here; the bound of {where} applies)"
    caller = call.frame.f_back
    site = f"; called at {caller.f_code.co_filename}:{caller.f_lineno}" if caller is not None else ""
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
    rank = _mpi.MPI.COMM_WORLD.Get_rank()
    text = message(call, time.monotonic() - call.since)
    sys.stderr.write(f"[rank {rank}] {text}\n")
    sys.stderr.flush()
    time.sleep(0.25)  # let the launcher forward the message before the abort tears the job down
    _mpi.MPI.COMM_WORLD.Abort(1)
    os._exit(1)  # MPICH's Abort may return when called from a thread other than the main one
