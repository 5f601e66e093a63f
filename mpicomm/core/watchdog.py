"""The watchdog: a call that stays blocked past its group's timeout ends the job, with a message naming it.

MPI cannot interrupt a blocking call (``MPI_Allreduce`` waits for every rank, however long), and
polling a non-blocking one instead would cost the small-call fast paths. So mpicomm bounds blocking
calls from outside, as torch's NCCL watchdog does: a daemon thread, started by :func:`mpicomm.init`,
samples every thread's Python stack (``sys._current_frames()``) every tenth of the shortest timeout
(at most once a second). When the same public mpicomm call (the same frame object) has been on a
thread's stack for longer than its bound, it writes what is blocked where (call, group, ranks,
timeout, the caller's line) to stderr and aborts the MPI job.

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

import math
import os
import sys
import threading
import time
from types import FrameType
from typing import Any

from .. import _mpi
from ..errors import ArgumentError

__all__ = ["DEFAULT_TIMEOUT", "default_timeout", "start"]

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
#: The switch interval while the watchdog walks other threads' stacks (a walk takes microseconds).
_WALK_INTERVAL = 1.0


class _Dog:
    thread: threading.Thread | None = None
    state: Any = None  # mpicomm.core.groups._State: the world and every group (given to start)
    group_type: Any = None  # mpicomm.core.groups.ProcessGroup
    default: float | None = DEFAULT_TIMEOUT
    own: dict[Any, bool] = {}  # noqa: RUF012 - code object -> whether it is an mpicomm call


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


def _run() -> None:
    seen: dict[int, _Call] = {}
    while True:
        try:
            time.sleep(_interval())
            late = _sample(seen, time.monotonic())
        except Exception:  # never let a fault of the watchdog itself end the job (the abort hook)
            seen.clear()
            continue
        if late is not None:
            _fire(late)


def _interval() -> float:
    """A tenth of the shortest bound of any group (at most a second, at least 20 ms)."""
    bounds = [g.timeout for g in _Dog.state.groups if g.timeout is not None]
    if _Dog.default is not None:
        bounds.append(_Dog.default)
    shortest = min(bounds, default=10 * _LONGEST_SAMPLE)
    return min(_LONGEST_SAMPLE, max(_SHORTEST_SAMPLE, shortest / 10))


class _Call:
    """One public call seen on a thread's stack: its frame, when first seen, and (later) its bound."""

    __slots__ = ("frame", "group", "known", "limit", "name", "since", "source")

    def __init__(self, frame: FrameType, since: float) -> None:
        self.frame = frame
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
    """Update ``seen`` (thread id -> its outermost mpicomm call) and return one that is overdue.

    The walk up other threads' stacks must not let those threads run: one that pops the frames
    being walked (a call returning, a thread ending) can leave ``f_back`` pointing at freed memory
    in CPython 3.11, which crashed a process once (CI, 26 Nov 2026). So the stacks are read with a
    switch interval long enough that no thread takes the GIL during the walk (restored at once),
    and only threads that :mod:`threading` still counts as running are walked. The bounds, which
    read a call's arguments, are worked out after the walk.
    """
    me = threading.get_ident()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(_WALK_INTERVAL)
    try:
        frames = sys._current_frames()
        running = dict(getattr(threading, "_active", frames))  # a C-level copy: no lock, no switch
        found = {i: _outermost(top) for i, top in frames.items() if i != me and i in running}
    finally:
        sys.setswitchinterval(interval)
    for ident in [i for i in seen if i not in found]:
        del seen[ident]
    for ident, frame in found.items():
        old = seen.get(ident)
        if frame is None:
            seen.pop(ident, None)
        elif old is None or old.frame is not frame:
            seen[ident] = _Call(frame, now)
        elif now - old.since > old.bound():
            return old
    return None


def _outermost(frame: FrameType | None) -> FrameType | None:
    """The outermost frame of the stack that is an mpicomm call, or None."""
    found = None
    while frame is not None:
        code = frame.f_code
        own = _Dog.own.get(code)
        if own is None:
            name = frame.f_globals.get("__name__", "")
            own = code.co_filename.startswith("<front door:") or (
                isinstance(name, str) and name.startswith(_CALL_MODULES) and name != __name__
            )
            _Dog.own[code] = own
        if own:
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
