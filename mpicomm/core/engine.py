"""The communication engine: ``async_op=True`` returns at once and the call runs on mpicomm's own thread.

MPICH moves a collective's data only while some thread of the process is inside MPI, so a
non-blocking collective left alone makes no progress while the caller computes. gloo and NCCL
overlap because the work runs elsewhere; so does mpicomm: one communication thread per process
(started at the first asynchronous call) runs the posted calls, each the very host call a blocking
caller makes (the same MPI calls, so ranks may differ in ``async_op``), one after another in the
order they were posted, over all groups. mpi4py and mpicomm's C module release the GIL inside MPI,
so the caller's Python and numpy code runs meanwhile.

Below ``MPI_THREAD_MULTIPLE`` only one thread may be inside MPI at a time, and the engine is what
guarantees it: while anything is queued (``_T.pending``, kept in the watchdog's thread
state so that ``mpicomm.core.watchdog.serial`` sees it too), every call from the caller's
threads goes through the queue, and a blocking one waits for its turn; calls that do not pass the
gate (:mod:`mpicomm.core.engine_gate`) wait at ``mpicomm.core.watchdog.serial`` for the queue to
empty. When
nothing is queued a blocking call takes its usual fast path, after one attribute test.

At ``MPI_THREAD_MULTIPLE`` point-to-point calls take their own lane: they run on the caller's
thread beside a queued collective (MPI matches them apart from collectives), unless an earlier
point-to-point call is still queued (MPI's non-overtaking order). So a rank may post an
asynchronous collective and then send what its peer needs before that collective, as on gloo.
Below it, ``send``, ``recv``, ``isend``, ``irecv`` and ``sendrecv`` of host arrays are run by the
thread inside MPI, from inside the collective (MPICH's ``MPIX_Async_start``, :mod:`mpicomm.core.lane`,
:mod:`mpicomm.core.lane_work`).

The gate itself (``gate``, ``Spec``, ``precheck``, the inline gates' ``wanted`` and
``through``) is :mod:`mpicomm.core.engine_gate`, which the data paths and the front door import:
this module, its queue and its lane load at the first call past the gate's fast path (the first
``async_op=True`` call), so a program that only blocks never loads them (issue 44).

A queued call's arguments are checked on the caller's thread before it is queued
(:func:`mpicomm.core.engine_gate.precheck`); a call that fails on the engine fails its Work and
every later call of the rank (:mod:`mpicomm.core.engine_work`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import types
import warnings
from typing import TYPE_CHECKING, Any

from ..errors import ArgumentTypeError, CommunicationError
from . import calls, chunks, lane, lane_work, validation, watchdog
from .engine_work import _Q, EngineWork, _broken, _refuse, drain
from .groups import _State, resolve
from .work import Work

if TYPE_CHECKING:
    from .engine_gate import Spec

__all__ = ["EngineWork", "drain", "pending", "submit", "through", "wanted"]

_T = watchdog._Threads
_get_ident = threading.get_ident


def pending() -> int:
    """How many posted calls the engine has not finished (0: a call may enter MPI on its own thread)."""
    return _T.pending


def submit(work: EngineWork) -> None:
    """Queue ``work`` for the engine (start the engine at the first call)."""
    if _Q.thread is None or not _Q.thread.is_alive():
        _start()
    with _Q.cond:
        _T.pending += 1
        if work._spec.p2p:
            _Q.p2p += 1
    _Q.items.put(work)


def _start() -> None:
    if _Q.thread is not None and _Q.thread.is_alive():
        return
    _Q.stopping = False
    started = threading.Event()
    _Q.thread = threading.Thread(target=_loop, args=(started,), name="mpicomm-engine", daemon=True)
    _Q.thread.start()
    started.wait()


def _loop(started: threading.Event) -> None:
    _T.engine = _get_ident()
    if _T.owner is not None:
        lane.start()  # below multiple: this thread alone may register it (the caller waits for started)
    started.set()
    while True:
        work = _Q.items.get()
        if work is None:
            return
        _run(work)


def _run(work: EngineWork) -> None:
    """Run one queued call: the host, as a blocking caller runs it; then its callbacks; then the next."""
    spec = work._spec
    if _Q.failed is not None:  # behind a failed call: never run (a peer would pair it with another)
        try:
            _refuse(spec.fn)
        except CommunicationError as exc:
            work._raw = work._error = exc
        _done(work)
        return
    token = (watchdog._count(), spec.site, _group_of(work), None)
    watchdog._live.append(token)  # the watchdog times the call where it runs
    before = validation._Flag.exchanges
    chunks._ASKED.answered = work._asked
    try:
        out = spec.host(*work._args, **work._kw)
        work._out = out
        work._inner = out if isinstance(out, Work) else None
        if work._inner is not None and not spec.posts:
            # a host Work whose MPI part is over may still owe a step on completion (a 16-bit
            # reduction's copy back from its wide twin): done here, before any callback reads the
            # arrays. One whose messages are still in flight (the list all_gather's) stays pending:
            # waiting here would hold the queue until a peer that may need a later call matches it.
            work._inner.is_completed()
    except Exception as exc:
        work._raw = exc
        error = calls.failed(spec.fn, exc, before, spec.validated, spec.signature, work._args, work._kw)
        if work._posted:  # a blocking caller raises it itself, through the front door
            work._error = error
        _broken(spec.fn, error)
    except BaseException as exc:  # KeyboardInterrupt and the like: the Work reports it
        work._raw = work._error = exc
        _broken(spec.fn, exc)
    finally:
        watchdog._live.remove(token)
        chunks._ASKED.answered = False
    _done(work)


def _done(work: EngineWork) -> None:
    """The call has run (or was refused): its callbacks, the queue's counts, then its waiters."""
    with _Q.cond:
        work._ran = True
        callbacks, work._callbacks = work._callbacks, []
    for callback in callbacks:  # before the next call, and before a call outside the queue may run
        with contextlib.suppress(Exception):  # a callback's failure is its future's: never the engine's
            callback(work)
    with _Q.cond:
        lane_work.flush()  # what the program handed the lane is posted before anything after it
        _T.pending -= 1
        if work._spec.p2p:
            _Q.p2p -= 1
        _Q.cond.notify_all()
    work._lock.release()  # last: a caller waiting on it then finds the engine out of MPI


def _run_until(work: EngineWork) -> None:
    """On the engine's thread (a callback waits on a later call): run the queue up to ``work``."""
    while not work._ran:
        item = _Q.items.get()
        if item is None:
            _Q.items.put(None)
            raise CommunicationError(f"{work._fn}: Work.wait: mpicomm's communication thread is stopping")
        _run(item)


def _group_of(work: EngineWork) -> Any:
    group = work._kw.get("group")
    if group is None:
        try:
            group = work._args[list(work._spec.signature.parameters).index("group")]
        except (ValueError, IndexError):
            return None
    return group


def _stop() -> None:
    """At exit: let the engine finish what is queued (the watchdog bounds it), then end its thread.

    MPI is finalised after Python's exit handlers: no call of the engine's may still be inside MPI then.
    """
    thread = _Q.thread
    if thread is None or not thread.is_alive() or _Q.stopping:
        return
    _Q.stopping = True
    _Q.items.put(None)
    thread.join()


_Q.run_until = _run_until  # EngineWork.wait on the engine's own thread (a callback's wait)
atexit.register(_stop)
watchdog._drainer = drain  # calls outside the gate wait for the queue (watchdog.serial)


def _through(spec: Spec, args: tuple[Any, ...], kw: dict[str, Any], async_op: Any) -> Any:
    """A call that does not take the fast path: queued (or on its own lane) and, if blocking, waited for."""
    _refuse(spec.fn)  # after a failed call nothing enters MPI (_broken)
    me = _get_ident()
    if me == _T.engine:  # a callback on the engine's thread calls again: it runs at its place in order
        return spec.host(*args, **kw)
    if spec.p2p and _T.owner is None and not _Q.p2p:
        return spec.host(*args, **kw)  # MPI_THREAD_MULTIPLE: point-to-point beside the queued collectives
    if not _Q.enabled:
        return spec.host(*args, **kw)
    if validation._Flag.on:  # validation mode: checked and exchanged at the call, on this thread
        drain(None, spec.fn)
        return spec.host(*args, **kw)
    group = args[spec.group_at] if 0 <= spec.group_at < len(args) else kw.get("group")
    if group is not None and not getattr(group, "is_member", True):
        return spec.host(*args, **kw)  # no MPI call on a rank outside the group: it warns, returns None
    if async_op is not True and async_op is not False:  # the front door checks it first
        raise ArgumentTypeError(f"{spec.fn}: async_op is {async_op!r}; expected True or False")
    if not spec.queued:
        drain(None, spec.fn)
        return spec.host(*args, **kw)
    if _State.world is None:  # MPI starts on the first call, on the caller's thread (it owns MPI then)
        resolve(None, spec.fn)
    # the front door's hooks (mpicomm.core.engine_gate.precheck), read off the class: off an
    # instance a function would bind to it
    check, message = type(spec).check, type(spec).message
    if check is not None:  # a mistake raises here, not at wait(), and never breaks the queue (no MPI call)
        check(spec.fn, spec.signature, args, kw)
    if (
        spec.p2p
        and (spec.posts or not async_op)
        and not _Q.p2p
        and lane.started() is not None
        and message is not None
    ):
        msg = message(spec.fn, spec.signature, args, kw)
        if msg is not None:  # below multiple: run inside the engine's collective (a peer may need it)
            out = lane_work.serve(spec.fn, msg, spec.posts, _Q.cond)
            if out is lane_work.IDLE:  # the queue emptied meanwhile: nothing else is inside MPI
                return spec.host(*args, **kw)
            if out is not lane_work.FULL:
                return out
    if not async_op:  # the front door's token times the caller's wait; the engine's, the call
        return _queued(spec, args, kw)  # its error raised here: the front door makes it the call's
    work = EngineWork(spec, args, kw)
    submit(work)
    return work


def _queued(spec: Spec, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    """A blocking call queued behind the engine's calls, waited for here."""
    work = EngineWork(spec, args, kw)
    work._posted = False
    submit(work)
    _await(work)
    if work._raw is not None:
        raise work._raw
    return work._out


#: Seconds a blocking point-to-point call waits behind queued calls, below ``MPI_THREAD_MULTIPLE``,
#: before it warns that its peer may be waiting for it (:func:`_await`).
STALL = 10.0


def _await(work: EngineWork) -> None:
    """Wait for the engine to have run the blocking call ``work``; warn about the serialized deadlock.

    Below ``MPI_THREAD_MULTIPLE`` a point-to-point call queued behind a collective cannot run before
    it (only one thread may be inside MPI, and MPI never matches the blocking collective a peer
    makes with a non-blocking one, so the engine cannot poll it). If the peer needs this message
    before it joins that collective, both ranks wait for good: the watchdog ends the job at the
    group's timeout. Past :data:`STALL` seconds this says so, once, while there is time to read it.
    """
    lock = work._lock
    watch = work._spec.p2p and _T.owner is not None
    if not lock.acquire(timeout=STALL if watch else -1):
        warnings.warn(
            f"{work._spec.fn}: waited {STALL:g} s behind {_T.pending - 1} call(s) posted before it with "
            f"async_op=True; at thread level {_T.level} only one thread may be inside MPI, so if the peer "
            "needs this message before it joins those calls, neither rank can go on (the watchdog ends "
            "the job at the group's timeout); expected the point-to-point call posted before the "
            "collective, or MPICOMM_THREAD_LEVEL=multiple, where it runs beside the queue",
            RuntimeWarning,
            stacklevel=_outside(),
        )
        lock.acquire()
    lock.release()


def _outside() -> int:
    """The ``stacklevel`` of the program's frame that called mpicomm (the door's frames vary)."""
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


#: The gate's slow path, for a host that makes the gate's test itself (:func:`wanted`).
through = _through


def wanted(p2p: bool = False, group: Any = None) -> bool:
    """Whether a host that tests the gate itself should hand its call to ``through``.

    all_reduce, broadcast and sendrecv make the gate's test inline (``async_op is not False or
    _T.pending``: two reads, where a wrapper's frame costs 40-60 ns, a tenth of an 8-byte call); this
    is the rest of it, off the fast path: not on the engine's own thread, the engine not off, not a
    ``group`` this rank is outside of, and for a point-to-point call (``p2p``) not its own lane
    (``MPI_THREAD_MULTIPLE``, none queued).

    Example:
        >>> wanted() in (True, False)
        True
    """
    if _Q.failed is not None:
        return True  # an earlier call failed: the gate's slow path raises its error
    if p2p and _T.owner is None and not _Q.p2p:
        return False  # the lane beside the queued collectives: the caller runs it here
    if group is not None and not getattr(group, "is_member", True):
        return False  # no MPI call on a rank outside the group: the host warns and returns None
    if validation._Flag.on and _Q.enabled and _get_ident() != _T.engine:
        drain(None)  # validation mode: mistakes raise at the call, so the call runs here, in its turn
        return False
    return _Q.enabled and _get_ident() != _T.engine
